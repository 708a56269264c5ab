//! `bench_native`: what rdmactor itself costs, in one process over the loopback transport
//! (issue 30), each figure beside its floor on the bare transport, measured in the same
//! run. `scripts/bench --native` runs it; the figures are in `rdmactor_examples::bench_native`.
//!
//! ```sh
//! bench_native                          # every figure, RESULT lines on stdout
//! bench_native --only latency,cpu       # some groups
//! bench_native --table rows.md          # also the markdown rows, with the spread
//! bench_native --profile 10             # only 64 B session echoes for 10 s (for perf)
//! bench_native --metrics                # with the Prometheus recorder of server --metrics
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
    auth, bulk, config, cpu, echo_request, floors, host::Host, latency, listen_addr, rate, setup,
    Plan,
};
use rdmactor_examples::logs;

/// The groups of figures, in the order they run.
const GROUPS: [&str; 9] = [
    "latency",
    "cpu",
    "conns1000",
    "oneway",
    "bulk",
    "fairness",
    "setup",
    "auth",
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
    /// setup, auth, heap); all by default.
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
    /// Record metrics as `server --metrics` does: the same Prometheus recorder, and the
    /// per-message timings on (for the A/B of `scripts/lib/bench-native-metrics-ab`).
    /// Nothing scrapes it; a thread drains its histograms every 5 s, as the exporter's
    /// own `install` would.
    #[arg(long)]
    metrics: bool,
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
    if args.metrics {
        // Before any server or client: handles registered earlier stay no-ops.
        let handle = rdmactor_examples::prometheus::install()?;
        std::thread::Builder::new()
            .name("metrics-upkeep".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_secs(5));
                handle.run_upkeep();
            })
            .context("starting the metrics upkeep thread")?;
    }
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

    if wants(args, "auth") {
        eprintln!("== authentication: setup and echo round trip, anonymous, Ed25519, PSK");
        auth::run(&fabric, &plan, &small, &mut report).await?;
    }

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
/// server, taking turns with the same client through an idle second server and with the
/// bare loopback ping-pong (the control that says how much of the loaded tail is the
/// machine's CPUs being shared, which any program would meet, and how much is rdmactor's).
async fn fairness(
    fabric: &Fabric,
    server: &Host,
    control: &Host,
    small_req: &[u8],
    big: usize,
    plan: Plan,
    report: &mut Report,
) -> Result<()> {
    let before = cpu::tids()?;
    let small = Client::<Loopback>::on(fabric.device("small"), config())?;
    let small_threads = cpu::Threads::new_since(&before, &cpu::tids()?);
    let before = cpu::tids()?;
    let bigs = vec![
        Client::<Loopback>::on(fabric.device("big-1"), config())?,
        Client::<Loopback>::on(fabric.device("big-2"), config())?,
    ];
    let big_threads = cpu::Threads::new_since(&before, &cpu::tids()?);
    let busy_path = [&small_threads, &server.threads];
    let idle_path = [&small_threads, &control.threads];
    let (rounds, limit) = plan.latency_budget();
    let (mut quiet, mut quiet_floor, mut quiet_splits) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..plan.reps {
        quiet_splits.push(
            bulk::split_by_wait(
                &small,
                server.addr,
                small_req,
                &server.threads,
                rounds,
                limit,
            )
            .await?,
        );
        let run = bulk::small_p99(&small, server.addr, small_req, rounds, limit);
        let stretch = bulk::traced(&busy_path, run).await?;
        quiet_floor.push(bulk::floor_p99(&stretch).await?);
        quiet.push(stretch);
    }
    let big_req = echo_request(big - 8);
    let load_started = Instant::now();
    let sched_before = cpu::sched_all();
    let (counts, measured) = bulk::under_load(&bigs, server.addr, &big_req, async {
        bulk::settle(Duration::from_millis(300)).await;
        let (mut busy, mut idle, mut floor) = (Vec::new(), Vec::new(), Vec::new());
        let mut splits = Vec::new();
        for _ in 0..plan.reps {
            let run = bulk::small_p99(&small, server.addr, small_req, rounds, limit);
            let stretch = bulk::traced(&busy_path, run).await?;
            busy.push(stretch);
            let run = bulk::small_p99(&small, control.addr, small_req, rounds, limit);
            idle.push(bulk::traced(&idle_path, run).await?);
            floor.push(bulk::floor_p99(&stretch).await?);
            let split = bulk::split_by_wait(
                &small,
                server.addr,
                small_req,
                &server.threads,
                rounds,
                limit,
            )
            .await?;
            splits.push(split);
        }
        anyhow::Ok((busy, idle, floor, splits))
    })
    .await?;
    let (busy, idle, floor, splits) = measured?;
    let loaded_secs = load_started.elapsed().as_secs_f64();
    let sched_after = cpu::sched_all();
    let p99s = |s: &[bulk::Stretch]| s.iter().map(|s| s.p99).collect::<Vec<_>>();
    let waits = |s: &[bulk::Stretch]| s.iter().map(|s| s.wait_per_rtt_us()).collect::<Vec<_>>();
    let shares = |s: &[bulk::Stretch]| s.iter().map(|s| s.wait_ms_per_s()).collect::<Vec<_>>();
    let (quiet_p, quiet_floor_p) = (p99s(&quiet), p99s(&quiet_floor));
    let (busy_p, idle_p, floor_p) = (p99s(&busy), p99s(&idle), p99s(&floor));
    eprintln!(
        "small p99 (us): quiet {quiet_p:.1?}, loaded through the busy server {busy_p:.1?}, through an idle one {idle_p:.1?}; bare ping-pong quiet {quiet_floor_p:.1?}, loaded {floor_p:.1?}; big echoes completed {counts:?}"
    );
    eprintln!(
        "run-queue wait per round trip (us), the path's threads: quiet {:.1?} (floor {:.1?}); loaded busy server {:.1?}, idle server {:.1?}, floor {:.1?}",
        waits(&quiet),
        waits(&quiet_floor),
        waits(&busy),
        waits(&idle),
        waits(&floor)
    );
    eprintln!(
        "run-queue wait, ms per s, the path's threads: quiet {:.0?} (floor {:.0?}); loaded busy server {:.0?}, idle server {:.0?}, floor {:.0?}",
        shares(&quiet),
        shares(&quiet_floor),
        shares(&busy),
        shares(&idle),
        shares(&floor)
    );
    eprintln!("round trips split by run-queue wait on their path (small client's poller, busy server's threads): quiet {quiet_splits:.1?}; loaded {splits:.1?}");
    let known = [
        ("small client", &small_threads),
        ("busy server", &server.threads),
        ("idle server", &control.threads),
        ("big clients", &big_threads),
    ];
    for line in bulk::describe_all(&known, &sched_before, &sched_after, loaded_secs) {
        eprintln!("  loaded stretch, {line}");
    }
    anyhow::ensure!(
        counts.iter().all(|&n| n > 0),
        "a big client completed no echo while the small client ran: {counts:?}"
    );
    let ratios = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(a, b)| a / b).collect::<Vec<_>>();
    let wait = |s: &[bulk::Stretch]| median(&waits(s));
    let share = |s: &[bulk::Stretch]| median(&shares(s));
    report.add(
        Figure::new(
            "small_p99_under_bulk_x",
            "x",
            ratios(&busy_p, &quiet_p),
            format!(
                "64 B client's p99 (async API) next to two clients echoing 8 MiB through the same server, over its p99 alone (per repetition): {:.1} us loaded vs {:.1} us quiet (medians); target <= 2.0; floor: the same ratio for the bare loopback SEND ping-pong (64 B, two spinning threads) measured under the same load, taking turns with the small client: {:.1} us loaded vs {:.1} us quiet; ratio: how much more the small client's tail grows than the bare transport's",
                median(&busy_p),
                median(&quiet_p),
                median(&floor_p),
                median(&quiet_floor_p)
            ),
        )
        .with_floor(ratios(&floor_p, &quiet_floor_p)),
    );
    report.add(Figure::new(
        "small_p99_loaded_over_idle_x",
        "x",
        ratios(&busy_p, &idle_p),
        format!(
            "the same loaded p99 through the busy server, over the small client's p99 through an idle second server of the same process under the same load, taking turns: {:.1} us vs {:.1} us (medians); target <= 1.2",
            median(&busy_p),
            median(&idle_p)
        ),
    ));
    report.add(
        Figure::new(
            "small_p99_under_bulk_us",
            "us",
            busy_p.clone(),
            format!(
                "the small client's loaded p99 through the busy server; floor: the bare loopback SEND ping-pong's p99 under the same load, taking turns, for as long as the small client's repetition took; ratio: what rdmactor adds over the bare transport under that load. Time the round trip's threads spent runnable but waiting for a CPU (schedstat, warm-up included), medians, per round trip and in ms per s: small client and busy server {:.1} us, {:.0} ms/s loaded ({:.1} us, {:.0} ms/s quiet); small client and idle server {:.1} us, {:.0} ms/s; the floor's two threads {:.2} us, {:.0} ms/s loaded ({:.2} us, {:.0} ms/s quiet)",
                wait(&busy),
                share(&busy),
                wait(&quiet),
                share(&quiet),
                wait(&idle),
                share(&idle),
                wait(&floor),
                share(&floor),
                wait(&quiet_floor),
                share(&quiet_floor)
            ),
        )
        .with_floor(floor_p.clone()),
    );
    let unwaited = |s: &[bulk::Split]| s.iter().map(|s| s.unwaited_p99).collect::<Vec<_>>();
    let kept = |s: &[bulk::Split]| {
        let shares: Vec<String> = s
            .iter()
            .map(|s| format!("{} of {}", s.unwaited, s.rounds))
            .collect();
        shares.join(", ")
    };
    report.add(
        Figure::new(
            "small_p99_under_bulk_unwaited_us",
            "us",
            unwaited(&splits),
            format!(
                "the small client's p99 under the same load through the busy server, over only the round trips during which neither its poller thread nor any of the server's threads waited on a run queue (schedstat read before and after each; round trips kept: {}): what rdmactor's own path costs under bulk, the server's turns behind bulk chunks included, with the 2-core machine's scheduling taken out; floor: the same split measured quiet (kept: {})",
                kept(&splits),
                kept(&quiet_splits)
            ),
        )
        .with_floor(unwaited(&quiet_splits)),
    );
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
