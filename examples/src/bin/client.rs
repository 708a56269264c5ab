//! rdmactor client: load, latency and rate runs against a server's `echo` service.
//!
//! ```sh
//! client --addr 192.0.2.1:7471 latency --iters 10000 --size 64
//! client --addr 192.0.2.1:7471 rate --connections 16 --window 16 --size 64 --secs 5
//! client --addr 192.0.2.1:7471 --service discard stream --connections 16 --size 64
//! client --addr 192.0.2.1:7471 echo --connections 4 --forever   # verified load
//! client --addr 192.0.2.1:7471 connect --connections 200        # setup rate
//! client --addr 192.0.2.1:7471 --service lambda lambda --size 4096 [--wasm]
//! client --cluster lab --etcd http://192.0.2.9:2379 echo --connections 8 --forever
//! client --seeds 192.0.2.1:7471,192.0.2.2:7471 echo --connections 8   # no etcd
//! ```
//! With `--seeds`, each connection goes to a server the seeds list for the service
//! (their `members` service; `server --cluster` serves it), least loaded first.
//! With `--cluster NAME --etcd URL[,URL..]` instead of `--addr`, connections go to the
//! nodes of the service listed in etcd, least loaded first; `echo` then runs each
//! connection as a `ClusterSession`: when a node dies or drains, its echoes (idempotent)
//! go on on another node, and each move is printed (`MOVED node a: why`). A node that
//! does not answer a connect within `--dial-timeout-ms` is passed over and tried last
//! from then on (a dead host stays listed until its lease lapses).
//! Each run ends with one `RESULT key=value ...` line for scripts (see scripts/bench).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};
use rdmactor::runtime::{
    Client, ClientConnection, ConnectError, NodeConfig, PollMode, TransportConfig,
};
use rdmactor_examples::cluster::{self, ClusterArgs, Dial};
use rdmactor_examples::pinger::Pinger;
use rdmactor_examples::{lambdas, logs, report, transport};
use rdmactor_services::echo::{EchoRequest, EchoResponse};

#[derive(Parser)]
#[command(about = "rdmactor client: echo load, latency and rate measurements")]
struct Args {
    /// Server address (or --seeds, or --cluster and --etcd).
    #[arg(long, required_unless_present_any = ["cluster", "seeds"])]
    addr: Option<SocketAddr>,
    /// Servers of a cluster to ask which of them serve --service (their `members`),
    /// comma-separated: connections go to the least loaded listed one that answers,
    /// with no etcd (`server --cluster` serves `members`).
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["addr", "cluster"])]
    seeds: Option<Vec<SocketAddr>>,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// With --cluster or --seeds: milliseconds a connect to one node may take before
    /// the next node is tried (a dead host that is still listed would otherwise hold
    /// it for rdma_cm's minute of resends); with --cluster the node is then tried last
    /// for a while.
    #[arg(long, value_name = "MS",
        default_value_t = rdmactor_cluster::DEFAULT_DIAL_TIMEOUT.as_millis() as u64)]
    dial_timeout_ms: u64,
    /// Service to connect to.
    #[arg(long, default_value = "echo")]
    service: String,
    /// Spin on the CQs instead of sleeping on a completion channel.
    #[arg(long)]
    busy_poll: bool,
    /// RDMA device (default: the first one listed; name it on a host with several).
    #[arg(long)]
    device: Option<String>,
    #[command(subcommand)]
    run: Run,
    #[command(flatten)]
    transport: transport::TransportFlags,
    #[command(flatten)]
    key: rdmactor_examples::identity::Key,
}

#[derive(Subcommand)]
enum Run {
    /// Round-trip latency of sequential requests on one connection.
    Latency {
        #[arg(long, default_value_t = 10_000)]
        iters: usize,
        #[arg(long, default_value_t = 64)]
        size: usize,
        /// Round trips before the measured ones (not timed).
        #[arg(long, default_value_t = 100)]
        warmup: usize,
        /// Drive the exchange from a client-side Session (each reply is handled on the
        /// connection's own thread and the next request sent from there) instead of
        /// awaiting `ClientConnection::request_typed` from a task.
        #[arg(long)]
        session: bool,
        /// Await each request on the program's own thread, where application code
        /// runs, instead of on the connection's poller thread: every round trip then
        /// crosses threads twice, as a call from C or Python does.
        #[arg(long, conflicts_with = "session")]
        app_thread: bool,
    },
    /// Request rate with `window` requests in flight per connection.
    Rate {
        #[arg(long, default_value_t = 1)]
        connections: usize,
        #[arg(long, default_value_t = 16)]
        window: usize,
        #[arg(long, default_value_t = 64)]
        size: usize,
        #[arg(long, default_value_t = 5.0)]
        secs: f64,
    },
    /// One-way message rate against the `discard` service (what `ib_send_bw` measures):
    /// each connection sends `window` messages (one `send_all`), then a request whose
    /// answer confirms the server received every one of them, and repeats.
    Stream {
        #[arg(long, default_value_t = 1)]
        connections: usize,
        #[arg(long, default_value_t = 64)]
        window: usize,
        #[arg(long, default_value_t = 64)]
        size: usize,
        #[arg(long, default_value_t = 5.0)]
        secs: f64,
    },
    /// Verified echo traffic (until killed with --forever).
    Echo {
        #[arg(long, default_value_t = 1)]
        connections: usize,
        #[arg(long, default_value_t = 1000)]
        requests: usize,
        #[arg(long)]
        forever: bool,
    },
    /// Round-trip latency of sequential invocations of the `checksum` lambda (connect
    /// with `--service lambda`): each one READs `size` bytes of input from this client,
    /// runs, and WRITEs the result back. Native Rust by default; `--wasm` uploads
    /// `examples/lambdas/checksum.wat` and runs it in the sandbox.
    Lambda {
        #[arg(long, default_value_t = 2000)]
        iters: usize,
        #[arg(long, default_value_t = 4096)]
        size: usize,
        #[arg(long)]
        wasm: bool,
    },
    /// Connection setup rate: open connections (`parallel` at a time), then hold them.
    Connect {
        #[arg(long, default_value_t = 100)]
        connections: usize,
        /// Connects in flight at once (1: one after another).
        #[arg(long, default_value_t = 1)]
        parallel: usize,
        /// Seconds to hold the connections open (for idle-memory measurements).
        #[arg(long, default_value_t = 0.0)]
        hold: f64,
        /// Count connections the server refuses, by reason, instead of failing at the
        /// first (admission under a connect storm).
        #[arg(long)]
        count_rejects: bool,
        /// Times one connect is tried again after a reject by the transport (no
        /// rdmactor reason: the CM's own, for example a REQ that met no listener),
        /// waiting 50 ms, then twice as long each time.
        #[arg(long, default_value_t = 3)]
        retries: u32,
        /// Once all are open, send one verified echo on every connection.
        #[arg(long)]
        echo: bool,
        /// Let stdin pace the steps, for a test that coordinates several client
        /// processes: print `OPEN n` once open and wait for a line, then (with `--echo`)
        /// print `ECHOED n` after the echo round and wait for a line, then close.
        #[arg(long)]
        stdin_steps: bool,
    },
}

/// Prints `line` and waits for one line on stdin (see `--stdin-steps`).
async fn step(line: String) -> Result<()> {
    println!("{line}");
    tokio::task::spawn_blocking(|| {
        let mut go = String::new();
        std::io::stdin().read_line(&mut go).map(|_| ())
    })
    .await?
    .context("reading stdin")
}

fn main() -> Result<()> {
    let started = Instant::now();
    logs::init("warn");
    let args = Args::parse();
    actix::System::new().block_on(run(args, started))
}

async fn echo(conn: &ClientConnection, payload: Vec<u8>) -> Result<()> {
    let resp: EchoResponse = conn
        .request_typed(&EchoRequest {
            payload: payload.clone(),
        })
        .await?;
    anyhow::ensure!(resp.payload == payload, "echo payload differs");
    Ok(())
}

/// Runs `counters` concurrently and adds up their counts (the first error wins).
async fn sum_all<F>(counters: impl IntoIterator<Item = F>) -> Result<u64>
where
    F: std::future::Future<Output = Result<u64>>,
{
    let mut total = 0;
    for r in futures::future::join_all(counters).await {
        total += r?;
    }
    Ok(total)
}

/// Runs `work(deadline)` on the poller thread, where `deadline` is `secs` from now, and
/// returns the count it reports and that count per second of wall time.
async fn per_second<F, Fut>(client: &Client, secs: f64, work: F) -> Result<(u64, f64)>
where
    F: FnOnce(Instant) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<u64>> + Send + 'static,
{
    let start = Instant::now();
    let total = client
        .run_on_poller(async move { work(Instant::now() + Duration::from_secs_f64(secs)).await })
        .await
        .context("poller stopped")??;
    Ok((total, total as f64 / start.elapsed().as_secs_f64()))
}

async fn connect_all(dial: &Dial<'_>, args: &Args, n: usize) -> Result<Vec<ClientConnection>> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(dial.connect(&args.service).await.context("connect")?);
    }
    Ok(conns)
}

async fn run(args: Args, started: Instant) -> Result<()> {
    // The transport options go on last: they set the event mode's spin window.
    let client = Client::start(args.transport.apply(NodeConfig {
        transport: TransportConfig {
            device: args.device.clone(),
            poll_mode: if args.busy_poll {
                PollMode::Busy
            } else {
                PollMode::EVENT
            },
            ..TransportConfig::default()
        },
        ..NodeConfig::default()
    }))?;
    let client = args.key.apply(client)?;
    let dial = Dial::new(&client, args.addr, args.seeds.clone(), &args.cluster)?
        .with_dial_timeout(Duration::from_millis(args.dial_timeout_ms));
    match args.run {
        Run::Latency {
            iters,
            size,
            warmup,
            session: true,
            ..
        } => {
            // A session per node tried; the last one made is the connected one's.
            let rx = std::cell::RefCell::new(None);
            let pinger = || {
                let (tx, done) = tokio::sync::oneshot::channel();
                *rx.borrow_mut() = Some(done);
                Pinger::new(vec![0x5a; size], warmup, iters, tx)
            };
            let conn = dial
                .connect_session(&args.service, pinger)
                .await
                .context("connect")?;
            let rx = rx.take().expect("a session was made");
            let rtts = rx.await.context("the session ended early")??;
            conn.close().await;
            report::latency("latency", size, iters, rtts);
        }
        Run::Lambda { iters, size, wasm } => {
            use rdmactor::verbs::Access;
            use rdmactor_services::lambda::{self, checksum_native, Invocation, LambdaRef};
            let conn = connect_all(&dial, &args, 1).await?.remove(0);
            let target = if wasm {
                let module = wat::parse_str(lambdas::CHECKSUM_WAT)?;
                LambdaRef::Module(lambda::upload(&conn, &module).await?)
            } else {
                LambdaRef::Native("checksum".into())
            };
            let data: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
            let mut input = client.register(size.max(1), Access::REMOTE_READ)?;
            input.as_mut_slice()[..size].copy_from_slice(&data);
            let output = client.register(4096, Access::REMOTE_WRITE)?;
            let inv = Invocation {
                lambda: target,
                input: input.remote(),
                input_len: size as u64,
                output: output.remote(),
                limits: None,
            };
            let expected = checksum_native(&data);
            let mut rtts = Vec::with_capacity(iters);
            for i in 0..100 + iters {
                let t = Instant::now();
                let len = lambda::invoke(&conn, &inv).await?;
                let rtt = t.elapsed();
                anyhow::ensure!(
                    output.as_slice()[..len as usize] == expected[..],
                    "checksum differs from native Rust"
                );
                if i >= 100 {
                    rtts.push(rtt);
                }
            }
            conn.close().await;
            report::latency(
                if wasm { "lambda_wasm" } else { "lambda_native" },
                size,
                iters,
                rtts,
            );
        }
        Run::Latency {
            iters,
            size,
            warmup,
            app_thread,
            ..
        } => {
            let conn = connect_all(&dial, &args, 1).await?.remove(0);
            // Not one repeated byte: a chunk landing at the wrong offset shows.
            let payload: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            let round_trips = async move {
                for _ in 0..warmup {
                    echo(&conn, payload.clone()).await?;
                }
                let mut rtts = Vec::with_capacity(iters);
                for _ in 0..iters {
                    let t = Instant::now();
                    echo(&conn, payload.clone()).await?;
                    rtts.push(t.elapsed());
                }
                anyhow::Ok(rtts)
            };
            let rtts = if app_thread {
                round_trips.await?
            } else {
                // On the poller thread that also runs the connection's actor, a reply
                // reaches the loop without a thread wake-up.
                client
                    .run_on_poller(round_trips)
                    .await
                    .context("poller stopped")??
            };
            report::latency("latency", size, iters, rtts);
        }
        Run::Rate {
            connections,
            window,
            size,
            secs,
        } => {
            let conns = connect_all(&dial, &args, connections).await?;
            let (total, rate) = per_second(&client, secs, move |deadline| async move {
                let workers = conns
                    .iter()
                    .flat_map(|c| (0..window).map(move |_| c.clone()))
                    .map(|conn| async move {
                        let payload = vec![0xa5; size];
                        let mut done = 0u64;
                        while Instant::now() < deadline {
                            echo(&conn, payload.clone()).await?;
                            done += 1;
                        }
                        anyhow::Ok(done)
                    });
                sum_all(workers).await
            })
            .await?;
            println!(
                "RESULT kind=rate connections={connections} window={window} size={size} requests={total} req_per_s={rate:.0}"
            );
        }
        Run::Stream {
            connections,
            window,
            size,
            secs,
        } => {
            let conns = connect_all(&dial, &args, connections).await?;
            let (total, rate) = per_second(&client, secs, move |deadline| async move {
                let streams = conns.iter().map(|conn| async move {
                    let payload = vec![0x3c; size];
                    let mut sent = 0u64;
                    while Instant::now() < deadline {
                        conn.send_all(vec![payload.clone(); window]).await?;
                        sent += window as u64;
                        let count: u64 = conn.request_typed(&()).await?;
                        anyhow::ensure!(
                            count == sent,
                            "server received {count} messages, {sent} were sent"
                        );
                    }
                    anyhow::Ok(sent)
                });
                sum_all(streams).await
            })
            .await?;
            println!(
                "RESULT kind=stream connections={connections} window={window} size={size} messages={total} msg_per_s={rate:.0}"
            );
        }
        Run::Echo {
            connections,
            requests,
            forever,
        } if matches!(dial, Dial::Cluster(_)) => {
            let Dial::Cluster(cluster) = &dial else {
                unreachable!("matched above")
            };
            cluster::echo_sessions(
                cluster,
                &args.service,
                connections,
                requests,
                forever,
                started,
            )
            .await?;
        }
        Run::Echo {
            connections,
            requests,
            forever,
        } => {
            let conns = connect_all(&dial, &args, connections).await?;
            println!("connected {connections}");
            let tasks = conns.iter().enumerate().map(|(c, conn)| async move {
                let mut i = 0usize;
                while forever || i < requests {
                    let size = [16usize, 1000, 9000][(c + i) % 3];
                    echo(conn, vec![(i % 251) as u8; size]).await?;
                    i += 1;
                }
                anyhow::Ok(i)
            });
            let mut total = 0;
            for r in futures::future::join_all(tasks).await {
                total += r?;
            }
            println!("RESULT kind=echo connections={connections} requests={total}");
        }
        Run::Connect {
            connections,
            parallel,
            hold,
            count_rejects,
            retries,
            echo: echo_round,
            stdin_steps,
        } => {
            use futures::StreamExt as _;
            let start = Instant::now();
            let mut conns = Vec::with_capacity(connections);
            let mut rejected = std::collections::BTreeMap::<String, usize>::new();
            let retried = std::cell::Cell::new(0usize);
            // The first connect's time apart: through a cluster it includes finding the
            // registry (etcd's connection and the watch's first read), which later
            // connects do not pay.
            let mut first: Option<Duration> = None;
            if !matches!(dial, Dial::Addr { .. }) {
                anyhow::ensure!(!count_rejects, "--count-rejects needs --addr");
                for _ in 0..connections {
                    conns.push(dial.connect(&args.service).await?);
                    first.get_or_insert_with(|| start.elapsed());
                }
            }
            let addr = match dial {
                Dial::Addr { addr, .. } => addr,
                // Not dialled: every connect went through the cluster above.
                Dial::Cluster(_) | Dial::Seeds { .. } => SocketAddr::from(([0, 0, 0, 0], 0)),
            };
            let connections = connections - conns.len();
            let connect_retrying = || async {
                let mut tries = 0;
                loop {
                    match client.connect(addr, &args.service).await {
                        Err(ConnectError::RejectedByTransport(_)) if tries < retries => {
                            retried.set(retried.get() + 1);
                            actix_rt::time::sleep(Duration::from_millis(50 << tries.min(6))).await;
                            tries += 1;
                        }
                        other => return other,
                    }
                }
            };
            // `parallel` connects in flight at any time.
            let mut attempts = futures::stream::iter(0..connections)
                .map(|_| connect_retrying())
                .buffer_unordered(parallel.max(1));
            while let Some(c) = attempts.next().await {
                match c {
                    Ok(c) => {
                        conns.push(c);
                        first.get_or_insert_with(|| start.elapsed());
                    }
                    Err(ConnectError::Rejected(r)) if count_rejects => {
                        *rejected.entry(format!("{:?}", r.code)).or_default() += 1;
                    }
                    Err(ConnectError::RejectedByTransport(s)) if count_rejects => {
                        let why = rdmactor::verbs::transport_reject(s).replace(' ', "_");
                        *rejected.entry(format!("transport:{why}")).or_default() += 1;
                    }
                    Err(e) => {
                        return Err(e).with_context(|| {
                            format!(
                                "connect (after {} open, {} retried)",
                                conns.len(),
                                retried.get()
                            )
                        })
                    }
                }
            }
            drop(attempts);
            let rate = conns.len() as f64 / start.elapsed().as_secs_f64();
            let refused: usize = rejected.values().sum();
            println!(
                "RESULT kind=connect connections={} rejected={refused} retried={} conn_per_s={rate:.1} first_ms={:.2}",
                conns.len(),
                retried.get(),
                first.map_or(0.0, |d| d.as_secs_f64() * 1e3)
            );
            for (code, n) in &rejected {
                println!("REJECTED code={code} count={n}");
            }
            if stdin_steps {
                step(format!("OPEN {}", conns.len())).await?;
            }
            if echo_round {
                let echoes = conns.iter().enumerate().map(|(i, c)| {
                    let payload: Vec<u8> = (0..64 + i % 512).map(|b| (b + i) as u8).collect();
                    echo(c, payload)
                });
                let results = futures::future::join_all(echoes).await;
                let ok = results.iter().filter(|r| r.is_ok()).count();
                if let Some(Err(e)) = results.into_iter().find(|r| r.is_err()) {
                    anyhow::bail!(
                        "{} of {} echoes failed; first: {e:#}",
                        conns.len() - ok,
                        conns.len()
                    );
                }
                if stdin_steps {
                    step(format!("ECHOED {ok}")).await?;
                } else {
                    println!("ECHOED {ok}");
                }
            }
            actix_rt::time::sleep(Duration::from_secs_f64(hold)).await;
            futures::future::join_all(conns.into_iter().map(ClientConnection::close)).await;
        }
    }
    client.shutdown().await;
    Ok(())
}
