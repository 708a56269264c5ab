//! The rdmactor demo: one server with its services, and many concurrent clients using
//! them over real verbs, each result verified; then a table, and a clean shutdown.
//!
//! What it runs, in order (each step prints its progress):
//! 1. **echo**: 100 clients connect at once and each makes 20 round trips of 16 B to
//!    64 KiB (the large ones by rendezvous: the server RDMA READs them); every reply is
//!    compared with what was sent.
//! 2. **rping**: 8 unmodified `rping -c -V` processes (rdma-core) at once against the
//!    port whose default service is `rping`: plain rdma_cm clients, no rdmactor code.
//! 3. **files**: the `ft` binary uploads a 4 MiB file with SHA-256; the server verifies
//!    the digest, stores it (temp file, fsync, rename) and, because this upload created
//!    the file the ID names, answers `Identify` with its secret; the stored bytes are
//!    compared with the source.
//! 4. **read**: 8 clients read a region with one-sided RDMA READs while the server keeps
//!    updating it in place; every value must be whole (one version) and every client must
//!    see it change, without ever sending the server a message.
//! 5. **lambda**: a WebAssembly module is uploaded and run on 1 MiB the server READs from
//!    the client; its output must equal the same function in native Rust.
//! 6. **hostile**: a client asks to store `../escape`, one uses another connection's rkey,
//!    one names a service that does not exist: each is refused with its reason, and the
//!    connection that owns the rkey keeps reading.
//!
//! Run it with `scripts/demo` (inside the Soft-RoCE VM); on a host with an RDMA device,
//! `demo --ip <address of the RDMA interface>`. The exit status is 0 only when every
//! operation was verified and the server shut down cleanly.

#[path = "transport.rs"]
mod transport;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use clap::Parser;
use futures::future::{join_all, try_join_all};
use rdmactor::runtime::{Client, ClientConnection, ConnectError, NodeConfig, Server};
use rdmactor::verbs::Access;
use rdmactor_services::echo::{Echo, EchoRequest, EchoResponse};
use rdmactor_services::file_transfer::{
    hash_bytes, Config as FilesConfig, FileOffer, FileTransfer, HashAlg, Msg,
};
use rdmactor_services::ingest::{IngestConfig, IngestService, Record};
use rdmactor_services::lambda::{
    self, checksum_native, Invocation, LambdaConfig, LambdaRef, LambdaService, NativeLambdas,
    Sandbox,
};
use rdmactor_services::read::layout::FIRST_VERSION;
use rdmactor_services::read::{self, ReadRegions, ReadService, RegionWriter};
use rdmactor_services::rping::Rping;

#[derive(Parser)]
#[command(about = "A server with its services and many concurrent clients using them")]
struct Args {
    /// Address of the RDMA interface to serve on (the VM's rxe0 has 192.0.2.1).
    #[arg(long, default_value = "192.0.2.1")]
    ip: IpAddr,
    /// Port of the rdmactor services (clients name the service when they connect).
    #[arg(long, default_value_t = 7471)]
    port: u16,
    /// Port whose default service is `rping`, for plain rdma_cm clients.
    #[arg(long, default_value_t = 7174)]
    rping_port: u16,
    /// Concurrent echo clients.
    #[arg(long, default_value_t = 100)]
    echo_clients: usize,
    /// Round trips per echo client.
    #[arg(long, default_value_t = 20)]
    echoes: usize,
    /// Concurrent `rping -c -V` processes.
    #[arg(long, default_value_t = 8)]
    rping_clients: usize,
    /// Iterations per rping client.
    #[arg(long, default_value_t = 100)]
    rping_count: u32,
    /// Concurrent one-sided readers of the live region.
    #[arg(long, default_value_t = 8)]
    readers: usize,
    /// Size of the file the `files` step uploads (and, against a remote server, fetches
    /// back), in MiB.
    #[arg(long, default_value_t = 4)]
    file_mib: usize,
    /// Only serve (on --ip): print a `ready` line, then serve until SIGINT or SIGTERM,
    /// shut down cleanly and print what was served. The clients run elsewhere, with
    /// `--server`.
    #[arg(long, conflicts_with = "server")]
    serve: bool,
    /// Only run the clients, against a `demo --serve` at this address (another host).
    /// The `files` step then fetches its upload back to compare it, since the store is
    /// not here to look at.
    #[arg(long, value_name = "IP")]
    server: Option<IpAddr>,
    /// Where `--serve` stores uploads (default: a temporary directory, removed at exit).
    #[arg(long, requires = "serve")]
    store: Option<PathBuf>,
    /// Seconds each step may take before it counts as failed.
    #[arg(long, default_value_t = 120)]
    step_secs: u64,
    #[command(flatten)]
    transport: transport::Transport,
}

/// The ID whose secret the demo's upload earns: the `files` service releases a secret
/// only to the connection whose GOOD upload created the file of that name.
const ID: &str = "report.bin";
/// The secret the operator configured for [`ID`].
const SECRET: &str = "the-cake-is-a-lie";
/// The live region: `WORDS` little-endian u64 words, all equal to `version / 2`.
const WORDS: usize = 512;
/// Echo payload sizes; above the inline/eager limit they go by rendezvous.
const ECHO_SIZES: [usize; 7] = [16, 64, 256, 1024, 4096, 16384, 65536];

/// One line of the final table.
struct Row {
    service: &'static str,
    clients: usize,
    operations: String,
    verified: String,
    secs: f64,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .init();
    let args = Args::parse();
    actix::System::new().block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let started = Instant::now();
    let work = std::env::temp_dir().join(format!("rdmactor-demo-{}", std::process::id()));
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let config = args.transport.apply(NodeConfig::default());
    let result = if args.serve {
        serve(&args, config, &work).await
    } else {
        demo(&args, config, &work, started).await
    };
    let _ = std::fs::remove_dir_all(&work);
    result
}

/// The demo's server: every service behind one CM actor, and the thread that keeps the
/// `read` service's live region changing.
struct DemoServer {
    server: Server,
    updater: Updater,
    store: PathBuf,
}

impl DemoServer {
    /// `public_fetch`: any client may fetch any stored file (a client on another host
    /// fetches its upload back on a new connection to compare it).
    async fn start(
        args: &Args,
        config: NodeConfig,
        store: PathBuf,
        public_fetch: bool,
    ) -> Result<Self> {
        std::fs::create_dir_all(&store).with_context(|| format!("creating {}", store.display()))?;
        let regions = ReadRegions::new();
        let live = regions.add_buffer_with_copies(
            "live",
            (FIRST_VERSION / 2).to_le_bytes().repeat(WORDS),
            64,
        )?;
        let addr = SocketAddr::new(args.ip, args.port);
        let rping_addr = SocketAddr::new(args.ip, args.rping_port);
        let files = FilesConfig::new(&store)
            .with_secret(ID, SECRET)
            .with_public_fetch(public_fetch);
        let server = Server::builder()
            .config(config)
            .listen(addr, None)
            .listen(rping_addr, Some("rping"))
            .max_connections(1024)
            .service("echo", Echo)
            .service("rping", Rping::default())
            .service("files", FileTransfer::new(files)?)
            .service("read", ReadService::new(regions.clone()))
            .service("lambda", lambda_service())
            .service(
                "ingest",
                IngestService::new(IngestConfig::default(), Arc::new(|_: Record| {})),
            )
            .start()
            .context("starting the server (is there an RDMA device? run scripts/demo)")?;
        // Register the read regions now, on this thread, not on the poller at first lookup.
        let pd = server
            .protection_domain()
            .await
            .context("the RDMA device went right after start")?;
        regions.register_all(&pd)?;
        drop(pd);
        println!(
            "server: echo, files, read, lambda, ingest on {addr}; rping on {rping_addr} (pid {})",
            std::process::id()
        );
        let updater = Updater::start(live);
        Ok(DemoServer {
            server,
            updater,
            store,
        })
    }

    /// Shuts down (every connection closed, everything released) and says what was served.
    async fn stop(self) {
        let updates = self.updater.stop();
        let stats = self.server.stats().await;
        self.server.shutdown().await;
        println!(
            "server: {} connections accepted, {} rejected, {} closed; the live region was \
             updated {updates} times; shut down cleanly",
            stats.accepted, stats.rejected, stats.closed,
        );
    }
}

/// `demo --serve`: the server alone, until SIGINT or SIGTERM.
async fn serve(args: &Args, config: NodeConfig, work: &Path) -> Result<()> {
    let store = args.store.clone().unwrap_or_else(|| work.join("store"));
    let server = DemoServer::start(args, config, store, true).await?;
    println!("ready: serving until SIGINT or SIGTERM");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    server.stop().await;
    Ok(())
}

/// The clients' steps, against a server of our own or (`--server`) another host's.
async fn demo(args: &Args, config: NodeConfig, work: &Path, started: Instant) -> Result<()> {
    let local = match args.server {
        Some(_) => None,
        None => Some(DemoServer::start(args, config.clone(), work.join("store"), false).await?),
    };
    let ip = args.server.unwrap_or(args.ip);
    let addr = SocketAddr::new(ip, args.port);
    let rping_addr = SocketAddr::new(ip, args.rping_port);
    let store = local.as_ref().map(|s| s.store.clone());
    let client = Client::start(config).context("starting the client node")?;

    // --- The clients, one step at a time; a failed step is reported, the rest run. ---
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let steps = 6;
    macro_rules! step {
        ($n:expr, $name:expr, $fut:expr) => {{
            println!("[{}/{steps}] {}", $n, $name);
            let t = Instant::now();
            let limit = Duration::from_secs(args.step_secs);
            let result = match actix_rt::time::timeout(limit, $fut).await {
                Ok(result) => result,
                Err(_) => Err(anyhow::anyhow!("no result after {limit:?}")),
            };
            match result {
                Ok(mut row) => {
                    row.secs = t.elapsed().as_secs_f64();
                    println!(
                        "      {}: {} verified in {:.1} s",
                        row.service, row.verified, row.secs
                    );
                    println!(
                        "RESULT step={} secs={:.3} verified={}",
                        row.service,
                        row.secs,
                        row.verified.replace(' ', "_")
                    );
                    rows.push(row);
                }
                Err(e) => {
                    println!("      FAILED: {e:#}");
                    failures.push(format!("{}: {e:#}", $name));
                }
            }
        }};
    }
    step!(
        1,
        "echo",
        echo(&client, addr, args.echo_clients, args.echoes)
    );
    step!(
        2,
        "rping",
        rping(rping_addr, args.rping_clients, args.rping_count)
    );
    step!(
        3,
        "files",
        files(addr, work, store.as_deref(), args.file_mib << 20)
    );
    step!(4, "read", readers(&client, addr, args.readers));
    step!(5, "lambda", lambdas(&client, addr));
    step!(6, "hostile", hostile(&client, addr, store.as_deref()));

    // --- Shutdown: clients first, then the server; everything must come back. --------
    client.shutdown().await;
    if let Some(server) = local {
        server.stop().await;
    }

    println!();
    println!(
        "{:<8} {:>7}  {:<38} {:<26} {:>6}",
        "service", "clients", "operations", "verified", "time"
    );
    for r in &rows {
        println!(
            "{:<8} {:>7}  {:<38} {:<26} {:>5.1}s",
            r.service, r.clients, r.operations, r.verified, r.secs
        );
    }
    println!();
    println!("done in {:.1} s", started.elapsed().as_secs_f64());
    if !failures.is_empty() {
        bail!("{} step(s) failed: {}", failures.len(), failures.join("; "));
    }
    Ok(())
}

/// The `lambda` service, with `checksum` also registered as native Rust.
fn lambda_service() -> LambdaService {
    let natives = NativeLambdas::new();
    natives.register("checksum", Arc::new(|i: &[u8]| Ok(checksum_native(i))));
    LambdaService::new(
        Arc::new(Sandbox::new()),
        Arc::new(natives),
        LambdaConfig::default(),
    )
}

/// Deterministic bytes for payloads and files (xorshift).
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

async fn echo(client: &Client, addr: SocketAddr, n: usize, echoes: usize) -> Result<Row> {
    let conns = try_join_all((0..n).map(|_| client.connect(addr, "echo")))
        .await
        .context("connecting the echo clients")?;
    println!("      {n} clients connected");
    let bytes = AtomicU64::new(0);
    let done = try_join_all(conns.iter().enumerate().map(|(c, conn)| {
        let bytes = &bytes;
        async move {
            for i in 0..echoes {
                let payload = pattern(
                    ECHO_SIZES[(c + i) % ECHO_SIZES.len()],
                    (c * echoes + i) as u64,
                );
                let reply: EchoResponse = conn
                    .request_typed(&EchoRequest {
                        payload: payload.clone(),
                    })
                    .await
                    .with_context(|| format!("client {c}, round trip {i}"))?;
                ensure!(
                    reply.payload == payload,
                    "client {c}, round trip {i}: reply differs"
                );
                bytes.fetch_add(2 * payload.len() as u64, Ordering::Relaxed);
            }
            Ok(echoes as u64)
        }
    }))
    .await?;
    join_all(conns.into_iter().map(ClientConnection::close)).await;
    let total: u64 = done.iter().sum();
    Ok(Row {
        service: "echo",
        clients: n,
        operations: format!(
            "{total} round trips, {:.1} MiB",
            bytes.load(Ordering::Relaxed) as f64 / f64::from(1 << 20)
        ),
        verified: format!("{total}/{} replies", n * echoes),
        secs: 0.0,
    })
}

/// A child process the demo waits for, with a deadline.
struct Proc {
    what: String,
    child: Child,
}

/// Waits (without blocking the actors) for every process; returns the ones that
/// exited 0, and the others with their stderr.
async fn wait_all(mut procs: Vec<Proc>, limit: Duration) -> Result<(usize, Vec<String>)> {
    let deadline = Instant::now() + limit;
    let mut ok = 0;
    let mut failed = Vec::new();
    while !procs.is_empty() {
        let mut i = 0;
        while i < procs.len() {
            if let Some(status) = procs[i].child.try_wait()? {
                let mut p = procs.swap_remove(i);
                if status.success() {
                    ok += 1;
                } else {
                    let mut err = String::new();
                    if let Some(mut e) = p.child.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut e, &mut err);
                    }
                    failed.push(format!("{} ({status}): {}", p.what, err.trim()));
                }
            } else {
                i += 1;
            }
        }
        if Instant::now() > deadline {
            for p in &mut procs {
                let _ = p.child.kill();
                let _ = p.child.wait();
                failed.push(format!("{}: still running after {limit:?}, killed", p.what));
            }
            break;
        }
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((ok, failed))
}

async fn rping(addr: SocketAddr, n: usize, count: u32) -> Result<Row> {
    let procs = (0..n)
        .map(|i| {
            let child = Command::new("rping")
                .args([
                    "-c",
                    "-a",
                    &addr.ip().to_string(),
                    "-p",
                    &addr.port().to_string(),
                ])
                .args(["-C", &count.to_string(), "-S", "4096", "-V"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .context("starting rping (rdmacm-utils)")?;
            Ok(Proc {
                what: format!("rping client {i}"),
                child,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    println!(
        "      {n} × `rping -c -a {} -p {} -C {count} -S 4096 -V` started",
        addr.ip(),
        addr.port()
    );
    let (ok, failed) = wait_all(procs, Duration::from_secs(120)).await?;
    ensure!(failed.is_empty(), "{}", failed.join("; "));
    Ok(Row {
        service: "rping",
        clients: n,
        operations: format!(
            "{} pings of 4 KiB (READ+WRITE)",
            n as u64 * u64::from(count)
        ),
        verified: format!("{ok}/{n} exited 0 (-V)"),
        secs: 0.0,
    })
}

/// The `ft` binary next to this one.
fn sibling(name: &str) -> Result<PathBuf> {
    let me = std::env::current_exe()?;
    let path = me.with_file_name(name);
    ensure!(
        path.exists(),
        "{} not found (build the examples)",
        path.display()
    );
    Ok(path)
}

/// Runs the `ft` binary next to this one with `args`; its stdout once it exited 0.
async fn ft(addr: SocketAddr, args: &[&str]) -> Result<String> {
    let mut child = Command::new(sibling("ft")?)
        .arg("--addr")
        .arg(addr.to_string())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting ft")?;
    println!("      ft --addr {addr} {}", args.join(" "));
    let mut stdout = child.stdout.take().context("ft stdout")?;
    let proc = Proc {
        what: format!("ft {}", args[0]),
        child,
    };
    let (_, failed) = wait_all(vec![proc], Duration::from_secs(120)).await?;
    let mut out = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut out)?;
    ensure!(failed.is_empty(), "{}; stdout: {out}", failed.join("; "));
    Ok(out)
}

/// Uploads `len` bytes with `ft send` and checks them: in the server's store when it is
/// ours (`store`), else by fetching them back with `ft fetch` (the server on the other
/// host stored them under a name of this process's own).
async fn files(addr: SocketAddr, work: &Path, store: Option<&Path>, len: usize) -> Result<Row> {
    let name = match store {
        Some(_) => ID.to_owned(),
        None => format!("demo-{}.bin", std::process::id()),
    };
    let source = work.join(&name);
    let content = pattern(len, 42);
    std::fs::write(&source, &content)?;
    let source_arg = source.to_string_lossy().into_owned();
    let mib = len >> 20;
    let out = match store {
        Some(_) => ft(addr, &["send", "--id", ID, &source_arg]).await?,
        None => ft(addr, &["send", &source_arg]).await?,
    };
    let good = out
        .lines()
        .find(|l| l.starts_with("GOOD "))
        .with_context(|| format!("no GOOD verdict: {out}"))?;
    println!("      {good}");
    let Some(store) = store else {
        let back = work.join("fetched");
        std::fs::create_dir_all(&back)?;
        let back_arg = back.to_string_lossy().into_owned();
        let out = ft(addr, &["fetch", "--out", &back_arg, &name]).await?;
        let good = out
            .lines()
            .find(|l| l.starts_with("GOOD "))
            .with_context(|| format!("no GOOD verdict for the fetch: {out}"))?;
        println!("      {good}");
        let fetched = std::fs::read(back.join(&name)).context("the fetched file")?;
        ensure!(
            fetched == content,
            "the fetched file differs from the source"
        );
        return Ok(Row {
            service: "files",
            clients: 2,
            operations: format!("upload and fetch {mib} MiB"),
            verified: "GOOD both ways, bytes".into(),
            secs: 0.0,
        });
    };
    let secret = out
        .lines()
        .find_map(|l| l.strip_prefix("SECRET "))
        .with_context(|| format!("no secret released: {out}"))?;
    ensure!(secret == SECRET, "the secret differs: {secret}");
    println!("      SECRET {secret}");
    let stored = std::fs::read(store.join(ID)).context("the stored file")?;
    ensure!(stored == content, "the stored file differs from the source");
    Ok(Row {
        service: "files",
        clients: 1,
        operations: format!("upload {mib} MiB, Identify"),
        verified: "GOOD, secret, bytes".into(),
        secs: 0.0,
    })
}

/// The application's side of the live region: a thread updating it in place about every
/// millisecond, as a server publishing state would.
struct Updater {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<u64>,
}

impl Updater {
    fn start(writer: RegionWriter) -> Updater {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut updates = 0;
            while !flag.load(Ordering::Relaxed) {
                writer.update(|version, bytes| {
                    let word = (version / 2).to_le_bytes();
                    for chunk in bytes.chunks_exact_mut(8) {
                        chunk.copy_from_slice(&word);
                    }
                });
                updates += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            updates
        });
        Updater { stop, thread }
    }

    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or(0)
    }
}

async fn readers(client: &Client, addr: SocketAddr, n: usize) -> Result<Row> {
    let conns = try_join_all((0..n).map(|_| client.connect(addr, "read"))).await?;
    let deadline = Instant::now() + Duration::from_secs(2);
    let len = WORDS * 8;
    let results = try_join_all(conns.iter().enumerate().map(|(c, conn)| async move {
        let handle = read::lookup(conn, "live").await?;
        let (mut reads, mut first, mut last) = (0u64, u64::MAX, 0u64);
        let mut offsets = pattern(4096, c as u64 + 7).into_iter().cycle();
        while Instant::now() < deadline {
            let offset = offsets.next().unwrap_or(0) as usize * 8 % len;
            let size = (len - offset).min(1024);
            let (data, version) = read::read_consistent(conn, &handle, offset as u64, size).await?;
            let word = (version / 2).to_le_bytes();
            ensure!(
                data.chunks_exact(8).all(|w| w == word),
                "reader {c}: a torn value at {offset}+{size} (version {version})"
            );
            reads += 1;
            first = first.min(version);
            last = version;
        }
        ensure!(last > first, "reader {c} never saw an update");
        Ok::<_, anyhow::Error>((reads, last - first))
    }))
    .await?;
    join_all(conns.into_iter().map(ClientConnection::close)).await;
    let reads: u64 = results.iter().map(|r| r.0).sum();
    let min_seen = results.iter().map(|r| r.1 / 2).min().unwrap_or(0);
    println!("      every reader saw at least {min_seen} updates, without asking the server");
    Ok(Row {
        service: "read",
        clients: n,
        operations: format!("{reads} one-sided READs during updates"),
        verified: format!("{reads}/{reads} whole"),
        secs: 0.0,
    })
}

async fn lambdas(client: &Client, addr: SocketAddr) -> Result<Row> {
    let conn = client.connect(addr, "lambda").await?;
    let module = wat::parse_str(include_str!("lambdas/checksum.wat"))?;
    let hash = lambda::upload(&conn, &module).await?;
    let data = pattern(1 << 20, 5);
    let mut input = client.register(data.len(), Access::REMOTE_READ)?;
    input.as_mut_slice().copy_from_slice(&data);
    let output = client.register(4096, Access::REMOTE_WRITE)?;
    let expected = checksum_native(&data);
    let mut runs = 0;
    for lambda in [
        LambdaRef::Module(hash),
        LambdaRef::Native("checksum".into()),
    ] {
        let t = Instant::now();
        let inv = Invocation {
            lambda: lambda.clone(),
            input: input.remote(),
            input_len: data.len() as u64,
            output: output.remote(),
            limits: None,
        };
        let len = lambda::invoke(&conn, &inv).await?;
        let got = &output.as_slice()[..len as usize];
        ensure!(
            got == expected,
            "{lambda:?}: checksum differs from native Rust"
        );
        let kind = match lambda {
            LambdaRef::Module(_) => "WebAssembly sandbox",
            LambdaRef::Native(_) => "native Rust",
        };
        println!(
            "      checksum of 1 MiB in the {kind}: {} in {:.1?}",
            hex(got),
            t.elapsed()
        );
        runs += 1;
    }
    conn.close().await;
    Ok(Row {
        service: "lambda",
        clients: 1,
        operations: "upload .wasm, 2 runs over 1 MiB".into(),
        verified: format!("{runs}/2 equal to native"),
        secs: 0.0,
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

async fn hostile(client: &Client, addr: SocketAddr, store: Option<&Path>) -> Result<Row> {
    let mut refused = 0;

    // A path trick: the name must stay inside the store. `send_file` would refuse such a
    // name itself, so this client writes the offer on the wire by hand.
    let conn = client.connect(addr, "files").await?;
    let offer = Msg::Offer(FileOffer {
        name: "../escape".into(),
        len: 9,
        digest: hash_bytes(HashAlg::Sha256, b"not yours"),
        overwrite: true,
    });
    conn.send(offer.encode()).await?;
    let answer = conn
        .recv()
        .await
        .context("the connection closed without an answer")?;
    match Msg::decode(&answer.data)? {
        Msg::Reject { reason } => {
            println!("      offer to store `../escape`: refused: {reason}");
            refused += 1;
        }
        other => bail!("an offer to store `../escape` was answered {other:?}"),
    }
    // (A remote server's store is checked on its host.)
    if let Some(store) = store {
        ensure!(
            !store.with_file_name("escape").exists(),
            "a file escaped the store"
        );
    }
    conn.close().await;

    // An rkey that belongs to another connection: a remote access error ends only the
    // prober's connection; the owner reads on.
    let owner = client.connect(addr, "read").await?;
    let prober = client.connect(addr, "read").await?;
    let theirs = read::lookup(&owner, "live").await?;
    match read::read(&prober, &theirs, 0, 8).await {
        Err(e) if e.is_remote_access_error() => {
            println!("      READ with another connection's rkey: {e}");
            refused += 1;
        }
        other => bail!("a foreign rkey was honoured: {other:?}"),
    }
    read::read_consistent(&owner, &theirs, 0, 8)
        .await
        .context("the rkey's owner can no longer read")?;
    println!("      the rkey's owner still reads");
    owner.close().await;
    prober.close().await;

    // A service that does not exist: rejected at connect time, with the reason.
    match client.connect(addr, "no-such-service").await {
        Err(ConnectError::Rejected(reject)) => {
            println!("      connect to `no-such-service`: {reject}");
            refused += 1;
        }
        Err(e) => bail!("connect to an unknown service failed without a reason: {e}"),
        Ok(_) => bail!("an unknown service was accepted"),
    }
    Ok(Row {
        service: "hostile",
        clients: 4,
        operations: "path trick, foreign rkey, bad service".into(),
        verified: format!("{refused}/3 refused, owner ok"),
        secs: 0.0,
    })
}
