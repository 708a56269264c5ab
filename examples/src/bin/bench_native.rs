//! `bench_native`: what rdmactor itself costs, in one process over the loopback transport
//! (issue 30), each figure beside its floor on the bare transport, measured in the same
//! run. `scripts/bench --native` runs it; the figures are in `rdmactor_examples::bench_native`.
//!
//! ```sh
//! bench_native                          # every figure, RESULT lines on stdout
//! bench_native --only latency,cpu       # some groups
//! bench_native --table rows.md          # also the markdown rows, with the spread
//! bench_native --profile 10             # only 64 B session echoes for 10 s (for perf)
//! ```
//!
//! Each figure prints `RESULT metric=NAME value=V unit=U floor=F ratio=R` (`-` where it
//! has no floor); the value is the median of `--reps` repetitions, the ratio value over
//! floor. The idle-heap figure runs in a process of its own (`bench_native_heap`, next to
//! this binary): the counting allocator it needs would tax every allocation here.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use clap::Parser;
use rdmactor::runtime::{Client, PollMode};
use rdmactor::transport::loopback::{Fabric, Loopback};
use rdmactor_examples::bench_native::stats::{median, quantile_us, Figure, Report};
use rdmactor_examples::bench_native::{
    bulk, config, cpu, echo_request, floors, host::Host, latency, listen_addr, rate, setup, Plan,
};
use rdmactor_examples::logs;

/// The groups of figures, in the order they run.
const GROUPS: [&str; 8] = [
    "latency",
    "cpu",
    "conns1000",
    "oneway",
    "bulk",
    "fairness",
    "setup",
    "heap",
];

#[derive(Parser)]
#[command(about = "rdmactor's own cost over the loopback transport, each figure beside its floor")]
struct Args {
    /// Repetitions of every figure (the value is their median, the spread their range).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Milliseconds of one timed window of a rate figure.
    #[arg(long, default_value_t = 1000)]
    window_ms: u64,
    /// Round trips of one latency repetition (fewer if twice the window runs out first).
    #[arg(long, default_value_t = 20_000)]
    rounds: usize,
    /// Comma-separated groups to run (latency, cpu, conns1000, oneway, bulk, fairness,
    /// setup, heap); all by default.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Write the markdown rows of every figure (with its spread) to this file.
    #[arg(long)]
    table: Option<PathBuf>,
    /// Idle connections the heap figure opens.
    #[arg(long, default_value_t = 10_000)]
    idle_conns: usize,
    /// Run nothing but 64 B echo round trips through a client-side session for this
    /// many seconds (`--profile-load`: the 16 x 16 load of the CPU figure instead), to
    /// profile the hot path, e.g. `perf record -g -- bench_native --profile 10`.
    #[arg(long)]
    profile: Option<f64>,
    /// With `--profile`: profile the echo load of 16 connections, window 16.
    #[arg(long)]
    profile_load: bool,
}

fn main() -> Result<()> {
    logs::init("warn");
    let args = Args::parse();
    for g in &args.only {
        if !GROUPS.contains(&g.as_str()) {
            bail!("unknown group {g:?}; the groups are {}", GROUPS.join(", "));
        }
    }
    anyhow::ensure!(args.reps > 0, "--reps must be at least 1");
    let started = Instant::now();
    let report = actix::System::new().block_on(run(&args))?;
    if let Some(path) = &args.table {
        report
            .write_rows(path)
            .with_context(|| format!("writing the table rows to {}", path.display()))?;
    }
    eprintln!(
        "bench_native: done in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn wants(args: &Args, group: &str) -> bool {
    args.profile.is_none() && (args.only.is_empty() || args.only.iter().any(|g| g == group))
}

async fn run(args: &Args) -> Result<Report> {
    let plan = Plan {
        reps: args.reps,
        window: Duration::from_millis(args.window_ms),
        round_trips: args.rounds,
    };
    let mut report = Report::default();
    let fabric = Fabric::default();
    // Servers first, while no other thread starts: the threads that appear while a
    // server starts are counted as its own. The second is the fairness control.
    let server = Host::start(&fabric, "server", listen_addr(1), config())?;
    let control = Host::start(&fabric, "control", listen_addr(2), config())?;
    // The CPU figure again against a server whose poller sleeps as soon as its CQs are
    // empty: its CPU time is then work and wake-ups, without the spin window.
    let mut sleepy = config();
    sleepy.transport.poll_mode = PollMode::Event {
        spin: Duration::ZERO,
    };
    let sleeper = Host::start(&fabric, "sleeper", listen_addr(3), sleepy)?;
    eprintln!(
        "bench_native: server threads (their CPU is the server's): {}",
        server.threads.names()
    );
    let client = Client::<Loopback>::on(fabric.device("client"), config())?;
    if std::env::var_os("BENCH_NATIVE_THREADS").is_some() {
        let all: Vec<String> = cpu::tids()?
            .into_iter()
            .map(|t| format!("{t}:{}", cpu::name(t)))
            .collect();
        eprintln!("bench_native: every thread: {}", all.join(", "));
        eprintln!("bench_native: server's: {:?}", server.threads.members);
    }
    let small = echo_request(64);

    if let Some(secs) = args.profile {
        profile(&client, &server, &small, secs, args.profile_load).await?;
        return Ok(report);
    }

    if wants(args, "latency") {
        eprintln!("== 64 B echo round trips: bare SEND ping-pong, session, async API");
        let (rounds, limit) = plan.latency_budget();
        let (mut f50, mut f99, mut s50, mut s99, mut a50, mut a99) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        for _ in 0..plan.reps {
            let h = floors::ping_pong(64, rounds, limit)?;
            f50.push(quantile_us(&h, 0.5));
            f99.push(quantile_us(&h, 0.99));
            let h = latency::session(&client, server.addr, &small, rounds, limit).await?;
            s50.push(quantile_us(&h, 0.5));
            s99.push(quantile_us(&h, 0.99));
            let h = latency::request_api(&client, server.addr, &small, rounds, limit).await?;
            a50.push(quantile_us(&h, 0.5));
            a99.push(quantile_us(&h, 0.99));
        }
        let floor_what = "floor: bare loopback SEND ping-pong, 64 B, two spinning threads";
        for (name, reps, floor, api) in [
            ("echo_rtt_p50_us_session", s50, &f50, "client-side session"),
            ("echo_rtt_p99_us_session", s99, &f99, "client-side session"),
            ("echo_rtt_p50_us_async", a50, &f50, "async request API"),
            ("echo_rtt_p99_us_async", a99, &f99, "async request API"),
        ] {
            report.add(
                Figure::new(
                    name,
                    "us",
                    reps,
                    format!("64 B echo round trip, {api}, one connection; {floor_what}"),
                )
                .with_floor(floor.clone()),
            );
        }
    }

    if wants(args, "cpu") {
        eprintln!("== 64 B echo load, 16 connections, window 16: server CPU and rate");
        let load = rate::EchoLoad::start(&client, server.addr, 16, 16, &small).await?;
        let w = rate::windows(&load.done, &server.threads, plan.reps, plan.window).await;
        load.stop().await?;
        let load = rate::EchoLoad::start(&client, sleeper.addr, 16, 16, &small).await?;
        let s = rate::windows(&load.done, &sleeper.threads, plan.reps, plan.window).await;
        load.stop().await?;
        let sleeping: Vec<String> = s
            .iter()
            .map(|w| format!("{:.0} ns at {:.0} req/s", w.cpu_ns_per_op, w.per_s))
            .collect();
        let cores: Vec<String> = w.iter().map(|w| format!("{:.2}", w.server_cores)).collect();
        report.add(Figure::new(
            "server_cpu_ns_per_request",
            "ns",
            w.iter().map(|w| w.cpu_ns_per_op).collect(),
            format!(
                "CPU time of the server's threads (per-thread schedstat: its poller, CM event thread and System thread) over requests answered, 16 connections, window 16, client-side sessions; includes what loopback does on the posting thread that a NIC would do (copying each reply into the client's memory, pushing both completions) and the poller's spinning whenever it waits; server cores busy: {}; a server that sleeps as soon as its CQs are empty (spin 0): {}",
                cores.join(", "),
                sleeping.join(", ")
            ),
        ));
        report.add(Figure::new(
            "echo_requests_per_core_16",
            "req/s",
            w.iter().map(|w| w.per_s).collect(),
            format!(
                "requests/s answered by a server with one poller, 16 connections, window 16, client on the same 2 cores; server cores busy: {}",
                cores.join(", ")
            ),
        ));
    }

    if wants(args, "conns1000") {
        eprintln!("== 64 B echo load, 1,000 connections, window 4");
        let load = rate::EchoLoad::start(&client, server.addr, 1000, 4, &small).await?;
        let w = rate::windows(&load.done, &server.threads, plan.reps, plan.window).await;
        load.stop().await?;
        let detail: Vec<String> = w
            .iter()
            .map(|w| {
                format!(
                    "{:.0} ns/req at {:.2} cores",
                    w.cpu_ns_per_op, w.server_cores
                )
            })
            .collect();
        report.add(Figure::new(
            "echo_requests_per_core_1000",
            "req/s",
            w.iter().map(|w| w.per_s).collect(),
            format!(
                "requests/s answered by a server with one poller, 1,000 connections, window 4 (as the VM's scale row); server CPU: {}",
                detail.join(", ")
            ),
        ));
    }

    if wants(args, "oneway") {
        eprintln!("== one-way 64 B messages: bare SENDs, then into discard");
        let floor = floors::send_rate(64, plan.reps, plan.window)?;
        let mut conns = Vec::with_capacity(16);
        for _ in 0..16 {
            conns.push(client.connect(server.addr, "discard").await?);
        }
        let w = rate::oneway(
            &client,
            conns,
            &server.threads,
            64,
            64,
            plan.reps,
            plan.window,
        )
        .await?;
        let detail: Vec<String> = w
            .iter()
            .map(|w| format!("{:.0} ns/msg", w.cpu_ns_per_op))
            .collect();
        report.add(
            Figure::new(
                "oneway_messages_per_s",
                "msg/s",
                w.iter().map(|w| w.per_s).collect(),
                format!(
                    "64 B one-way messages into discard, 16 connections, 64 per send_all then a counted request; server CPU {}; floor: bare loopback SENDs, one QP, sender and receiver threads, receives reposted with credits",
                    detail.join(", ")
                ),
            )
            .with_floor(floor),
        );
    }

    let big = 8 << 20;
    if wants(args, "bulk") {
        eprintln!("== 8 MiB echo: bare READ, then echo");
        let floor = floors::read_rate(big, plan.reps, plan.window)?;
        let req = echo_request(big - 8);
        let reps = bulk::echo_rate(&client, server.addr, &req, plan.reps, plan.window).await?;
        report.add(
            Figure::new(
                "bulk_echo_mb_s",
                "MB/s",
                reps,
                "8 MiB echo, one connection, MB/s moved (both directions: two rendezvous READs per round trip); floor: one bare loopback READ of 8 MiB at a time",
            )
            .with_floor(floor),
        );
    }

    if wants(args, "fairness") {
        eprintln!("== a 64 B client's p99 next to two 8 MiB echo clients");
        fairness(&fabric, &server, &control, &small, big, plan, &mut report).await?;
    }

    if wants(args, "setup") {
        eprintln!("== connection setup, 200 at once");
        let mut reps = Vec::with_capacity(plan.reps);
        for _ in 0..plan.reps {
            let (conns, rate) = setup::connect_at_once(&client, server.addr, 200).await?;
            reps.push(rate);
            setup::close_all(conns).await;
            bulk::settle(Duration::from_millis(200)).await;
        }
        report.add(Figure::new(
            "setup_conn_per_s",
            "conn/s",
            reps,
            "200 connects to echo in flight at once, first connect to last established (service chosen, receives posted)",
        ));
    }

    client.shutdown().await;
    server.stop();
    control.stop();
    sleeper.stop();

    if wants(args, "heap") {
        eprintln!(
            "== heap per idle connection ({} connections, own process)",
            args.idle_conns
        );
        heap(args, &mut report)?;
    }
    Ok(report)
}

/// The small client's p99: quiet, then next to two 8 MiB echo clients through the same
/// server, taking turns with the same client through an idle second server.
async fn fairness(
    fabric: &Fabric,
    server: &Host,
    control: &Host,
    small_req: &[u8],
    big: usize,
    plan: Plan,
    report: &mut Report,
) -> Result<()> {
    let small = Client::<Loopback>::on(fabric.device("small"), config())?;
    let bigs = vec![
        Client::<Loopback>::on(fabric.device("big-1"), config())?,
        Client::<Loopback>::on(fabric.device("big-2"), config())?,
    ];
    let (rounds, limit) = plan.latency_budget();
    let mut quiet = Vec::with_capacity(plan.reps);
    for _ in 0..plan.reps {
        quiet.push(bulk::small_p99(&small, server.addr, small_req, rounds, limit).await?);
    }
    let big_req = echo_request(big - 8);
    let (counts, measured) = bulk::under_load(&bigs, server.addr, &big_req, async {
        bulk::settle(Duration::from_millis(300)).await;
        let (mut busy, mut idle) = (Vec::new(), Vec::new());
        for _ in 0..plan.reps {
            busy.push(bulk::small_p99(&small, server.addr, small_req, rounds, limit).await?);
            idle.push(bulk::small_p99(&small, control.addr, small_req, rounds, limit).await?);
        }
        anyhow::Ok((busy, idle))
    })
    .await?;
    let (busy, idle) = measured?;
    eprintln!(
        "small p99 (us): quiet {quiet:.1?}, loaded through the busy server {busy:.1?}, through an idle one {idle:.1?}; big echoes completed {counts:?}"
    );
    anyhow::ensure!(
        counts.iter().all(|&n| n > 0),
        "a big client completed no echo while the small client ran: {counts:?}"
    );
    let ratios = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(a, b)| a / b).collect::<Vec<_>>();
    report.add(Figure::new(
        "small_p99_under_bulk_x",
        "x",
        ratios(&busy, &quiet),
        format!(
            "64 B client's p99 (async API) next to two clients echoing 8 MiB through the same server, over its p99 alone (per repetition): {:.1} us loaded vs {:.1} us quiet (medians); target <= 2.0",
            median(&busy),
            median(&quiet)
        ),
    ));
    report.add(Figure::new(
        "small_p99_loaded_over_idle_x",
        "x",
        ratios(&busy, &idle),
        format!(
            "the same loaded p99 through the busy server, over the small client's p99 through an idle second server of the same process under the same load, taking turns: {:.1} us vs {:.1} us (medians); target <= 1.2",
            median(&busy),
            median(&idle)
        ),
    ));
    small.shutdown().await;
    for b in bigs {
        b.shutdown().await;
    }
    Ok(())
}

/// Runs `bench_native_heap` (next to this binary) and takes its figure.
fn heap(args: &Args, report: &mut Report) -> Result<()> {
    let exe = std::env::current_exe().context("locating this binary")?;
    let child = exe.with_file_name("bench_native_heap");
    let out = Command::new(&child)
        .arg("--conns")
        .arg(args.idle_conns.to_string())
        .arg("--reps")
        .arg(args.reps.to_string())
        .output()
        .with_context(|| format!("running {}", child.display()))?;
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        out.status.success(),
        "{} failed ({}): {stdout}",
        child.display(),
        out.status
    );
    let line = |prefix: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .with_context(|| format!("{} printed no {prefix:?} line: {stdout}", child.display()))
    };
    let result = line("RESULT ")?;
    let row = line("| ")?;
    report.add_printed(result, row);
    Ok(())
}

/// Echo round trips (or the 16 x 16 load) for `secs`, for a profiler.
async fn profile(
    client: &Client<Loopback>,
    server: &Host,
    req: &[u8],
    secs: f64,
    load: bool,
) -> Result<()> {
    let d = Duration::from_secs_f64(secs);
    if load {
        let l = rate::EchoLoad::start(client, server.addr, 16, 16, req).await?;
        let w = rate::windows(&l.done, &server.threads, 1, d).await;
        l.stop().await?;
        eprintln!("profile: {w:?}");
    } else {
        let h = latency::session(client, server.addr, req, usize::MAX, d).await?;
        eprintln!(
            "profile: {} round trips, p50 {:.2} us, p99 {:.2} us",
            h.len(),
            quantile_us(&h, 0.5),
            quantile_us(&h, 0.99)
        );
    }
    Ok(())
}
