//! `bench_native_heap`: the heap one idle connection holds, over the loopback transport;
//! run by `bench_native` (the `heap` group), which relays its `RESULT` line and row.
//!
//! The process's live heap is counted by `cap`'s wrapper of the system allocator, which
//! adds an atomic update to every allocation: that is why this figure has a process of
//! its own. Server and client share the process, so the heap counted is both ends of
//! each connection (the server's connection, the client's, and the loopback
//! transport's queues and registered memory for both).
//!
//! Connections are opened in steps (first 100, which also pays what the first
//! connections set up once: pool arenas, shared receive queues), then in `--reps`
//! equal steps up to `--conns`; each step's heap growth over its new connections is one
//! repetition. If `--max-secs` runs out first, the figure is over the steps completed
//! and says how many connections that was.

use std::alloc::System;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use cap::Cap;
use clap::Parser;
use rdmactor::runtime::Client;
use rdmactor::transport::loopback::{Fabric, Loopback};
use rdmactor_examples::bench_native::stats::Figure;
use rdmactor_examples::bench_native::{config, host::Host, listen_addr, setup};
use rdmactor_examples::logs;

#[global_allocator]
static HEAP: Cap<System> = Cap::new(System, usize::MAX);

#[derive(Parser)]
#[command(about = "heap per idle connection over the loopback transport (run by bench_native)")]
struct Args {
    /// Idle connections to reach.
    #[arg(long, default_value_t = 10_000)]
    conns: usize,
    /// Steps after the first 100 (each one repetition).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Stop adding steps once this many seconds have gone.
    #[arg(long, default_value_t = 60.0)]
    max_secs: f64,
}

const BASE: usize = 100;

fn main() -> Result<()> {
    logs::init("warn");
    let args = Args::parse();
    anyhow::ensure!(args.conns > BASE, "--conns must be above {BASE}");
    anyhow::ensure!(args.reps > 0, "--reps must be at least 1");
    let line = actix::System::new().block_on(run(&args))?;
    println!("{}", line.result_line());
    println!("{}", line.table_row());
    // The connections are not closed one by one: tearing down thousands would take
    // longer than the measurement, and the process ends here anyway.
    std::process::exit(0)
}

async fn run(args: &Args) -> Result<Figure> {
    let started = Instant::now();
    let fabric = Fabric::default();
    let server = Host::start(&fabric, "server", listen_addr(1), config())?;
    let client = Client::<Loopback>::on(fabric.device("client"), config())?;
    let mut conns = Vec::with_capacity(args.conns);
    setup::open_until(&client, server.addr, &mut conns, BASE, 200)
        .await
        .context("the first connections")?;
    let mut last = (conns.len(), HEAP.allocated());
    let mut reps = Vec::with_capacity(args.reps);
    for k in 1..=args.reps {
        if started.elapsed() > Duration::from_secs_f64(args.max_secs) {
            eprintln!(
                "bench_native_heap: {:.0} s gone at {} connections; no more steps",
                started.elapsed().as_secs_f64(),
                conns.len()
            );
            break;
        }
        let target = BASE + (args.conns - BASE) * k / args.reps;
        let t = Instant::now();
        setup::open_until(&client, server.addr, &mut conns, target, 200).await?;
        let now = (conns.len(), HEAP.allocated());
        let per = (now.1 as f64 - last.1 as f64) / (now.0 - last.0) as f64 / 1024.0;
        eprintln!(
            "bench_native_heap: {} connections, heap {:.1} MiB, {per:.1} KiB per connection of this step ({:.1} s)",
            now.0,
            now.1 as f64 / (1 << 20) as f64,
            t.elapsed().as_secs_f64()
        );
        reps.push(per);
        last = now;
    }
    Ok(Figure::new(
        "idle_conn_kib",
        "KiB",
        reps,
        format!(
            "live heap per idle echo connection, both ends in one process (server, client and the loopback transport's queues and registered memory), {} connections open (from {BASE}, in steps; each step's growth per new connection is a repetition), counted by a wrapper of the system allocator in a process of its own; shared receive queues",
            conns.len()
        ),
    ))
}
