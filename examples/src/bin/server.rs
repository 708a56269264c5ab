//! The rdmactor server: every service of `rdmactor-services` behind one CM actor.
//!
//! ```sh
//! server --listen 192.0.2.1:7471 --listen 192.0.2.1:7174=rping --max-connections 1000
//! server --listen 192.0.2.1:7471 --files-dir /srv/files --secret-file /etc/rdmactor/secrets
//! server --listen 192.0.2.1:7471 --metrics 127.0.0.1:9464   # Prometheus at /metrics
//! server --listen 192.0.2.1:7471 --cluster lab --etcd http://192.0.2.9:2379
//! ```
//! With `--cluster`, the server registers its services in etcd once it listens
//! (`rdmactor-cluster`: a lease kept alive, the load reported), and at shutdown marks
//! itself draining and withdraws before it drains. It also serves `members`: a client
//! that knows any one server's address asks it for the others
//! (`rdmactor_services::members`) and needs no etcd. Without it, no etcd is touched.
//! rdmactor clients pick a service by name in their connect request; plain rdma_cm
//! clients (rping, lab programs) reach the default service of the port they connect to.
//! `--oob-rc 18515 --oob-uc 18516 --oob-ud 18517 --oob-srq 18518` also serves unmodified
//! `ibv_{rc,uc,ud,srq}_pingpong` clients (QPs brought up over TCP, no rdma_cm).
//! SIGINT or SIGTERM: stop accepting, disconnect everyone, release everything, exit 0.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use clap::Parser;
use rdmactor::memory::PoolConfig;
use rdmactor::runtime::{
    Client, ConnectionConfig, NodeConfig, OobOptions, OobPort, OobTransport, ReceiveConfig, Server,
    SharedRecvConfig, TransportConfig, DEFAULT_MAX_CONNECTIONS_PER_PEER,
};
use rdmactor::verbs::Mtu;
use rdmactor_cluster::Load;
use rdmactor_examples::{cluster::ServerClusterArgs, files_args::FilesArgs, logs, transport};
use rdmactor_services::echo::{Discard, Echo, RawEcho};
use rdmactor_services::ingest::{IngestConfig, IngestService, Record};
use rdmactor_services::lambda::{
    checksum_native, LambdaConfig, LambdaService, NativeLambdas, Sandbox,
};
use rdmactor_services::members::MembersService;
use rdmactor_services::pingpong::{PingPongService, StockConfig, StockPingPongService};
use rdmactor_services::read::{ReadRegions, ReadService};
use rdmactor_services::rping::Rping;

#[derive(Parser)]
#[command(
    about = "rdmactor server: echo, raw-echo, pingpong, rping, files, lambda, read and ingest services"
)]
struct Args {
    /// Listen address, optionally with the default service for plain clients:
    /// `ADDR:PORT` or `ADDR:PORT=SERVICE`. Repeatable.
    #[arg(long, required = true)]
    listen: Vec<String>,
    /// Most connections served at once.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Most connections one client address may hold at once (0: no limit); more from it
    /// are refused with `ServerFull` and a reason naming this limit.
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS_PER_PEER)]
    max_connections_per_peer: usize,
    /// Most credits of a shared receive queue's reserve that one client address may
    /// hold borrowed at once (0: no limit): a host flooding many connections cannot take
    /// the credits every other host's busy connections borrow.
    #[arg(long, default_value_t = default_reserve_per_peer())]
    reserve_per_peer: u32,
    /// Registered memory cap, in MiB.
    #[arg(long, default_value_t = 1024)]
    pool_mib: usize,
    /// Heap all connections together may hold for incoming messages being received,
    /// in MiB; more wait their turn.
    #[arg(long, default_value_t = PoolConfig::default().heap_bytes >> 20)]
    incoming_heap_mib: usize,
    /// Seconds a message may wait for room in the pool (first come, first served)
    /// before it fails with the reason; the connection goes on.
    #[arg(long, default_value_t = ConnectionConfig::default().pool_wait.as_secs())]
    pool_wait_secs: u64,
    /// CQ-polling threads (each also runs its connections' actors).
    #[arg(long, default_value_t = 1)]
    pollers: usize,
    /// How pollers wait for completions.
    #[arg(long, value_enum, default_value_t = transport::PollChoice::Event)]
    poll_mode: transport::PollChoice,
    /// RDMA device (default: whichever rdma_cm routes to).
    #[arg(long)]
    device: Option<String>,
    /// `NAME=PATH`: serve the file at PATH as region NAME of the `read` service.
    /// Repeatable.
    #[arg(long = "region", value_name = "NAME=PATH")]
    regions: Vec<String>,
    /// Serve `ibv_rc_pingpong` clients on this TCP port (`PORT` or `ADDR:PORT`).
    #[arg(long, value_name = "PORT")]
    oob_rc: Option<String>,
    /// Serve `ibv_uc_pingpong` clients on this TCP port.
    #[arg(long, value_name = "PORT")]
    oob_uc: Option<String>,
    /// Serve `ibv_ud_pingpong` clients on this TCP port.
    #[arg(long, value_name = "PORT")]
    oob_ud: Option<String>,
    /// Serve `ibv_srq_pingpong` clients on this TCP port.
    #[arg(long, value_name = "PORT")]
    oob_srq: Option<String>,
    /// The clients' `-n`: a connection (an SRQ client's QPs together) closes after this
    /// many answers. Without it, connections close once their client is quiet.
    #[arg(long)]
    oob_iters: Option<u64>,
    /// Largest message of the out-of-band ping-pong (the clients' `-s` at most).
    #[arg(long, default_value_t = 4096)]
    oob_size: u32,
    /// Path MTU of out-of-band RC/UC QPs (the tools' `-m`).
    #[arg(long, default_value_t = 1024)]
    oob_mtu: u32,
    /// Service level of out-of-band QPs (the tools' `-l`).
    #[arg(long, default_value_t = 0)]
    oob_sl: u8,
    /// Local GID index of out-of-band QPs (default: one of the client GID's kind).
    #[arg(long)]
    oob_gid_index: Option<u8>,
    /// Most out-of-band clients one address may have at once on each `--oob-*` port
    /// (0: no limit); more from it are refused (socket closed, reason logged).
    #[arg(long, default_value_t = OobOptions::default().max_clients_per_peer)]
    oob_max_clients_per_peer: usize,
    /// Most QPs one `ibv_srq_pingpong` client may ask for (its `-q`).
    #[arg(long, default_value_t = OobOptions::default().max_qps_per_client)]
    oob_max_qps_per_client: usize,
    /// Most QPs the clients of one address may hold at once on each `--oob-*` port (0: no
    /// limit); a client that would go beyond it is refused whole.
    #[arg(long, default_value_t = OobOptions::default().max_qps_per_peer)]
    oob_max_qps_per_peer: usize,
    /// An out-of-band connection with no message for this long is closed (ms).
    #[arg(long, default_value_t = 3000)]
    oob_idle_ms: u64,
    /// Serve Prometheus metrics at http://127.0.0.1:PORT/metrics, or at ADDR:PORT (off
    /// by default; see `rdmactor::metrics` for the list). For a scraper on a management
    /// network only: it must not face clients (8 connections at once, 5 s to ask and to
    /// be answered, `GET /metrics` only).
    #[arg(long, value_name = "PORT|ADDR:PORT", value_parser = metrics_addr)]
    metrics: Option<SocketAddr>,
    /// Authenticate clients: an authorized keys file of `IDENTITY ed25519|psk BASE64`
    /// lines (`keygen` prints them). Every service then takes only clients that prove an
    /// identity, except the anonymous ones (--anonymous, and the stock-tool services
    /// raw-echo, rping and stock-*, whose clients cannot authenticate). SIGHUP reloads
    /// the file: connections proved with a removed key close, the others go on.
    #[arg(long, value_name = "FILE")]
    authorized_keys: Option<std::path::PathBuf>,
    /// With --authorized-keys, let anonymous clients use SERVICE too (repeatable).
    #[arg(long, value_name = "SERVICE")]
    anonymous: Vec<String>,
    #[command(flatten)]
    transport: transport::TransportFlags,
    #[command(flatten)]
    cluster: ServerClusterArgs,
    #[command(flatten)]
    files: FilesArgs,
}

/// The out-of-band ports the `--oob-*` flags ask for.
fn oob_ports(args: &Args) -> Result<Vec<OobPort>> {
    let mtu = Mtu::from_bytes(args.oob_mtu).with_context(|| {
        format!(
            "--oob-mtu {} is not 256, 512, 1024, 2048 or 4096",
            args.oob_mtu
        )
    })?;
    let specs = [
        (&args.oob_rc, OobTransport::Rc, "stock-rc"),
        (&args.oob_uc, OobTransport::Uc, "stock-rc"),
        (&args.oob_ud, OobTransport::Ud, "stock-ud"),
        (&args.oob_srq, OobTransport::Srq, "stock-srq"),
    ];
    let mut ports = Vec::new();
    for (spec, transport, service) in specs {
        let Some(spec) = spec else { continue };
        let addr: SocketAddr = match spec.parse::<u16>() {
            Ok(port) => SocketAddr::from(([0, 0, 0, 0], port)),
            Err(_) => spec
                .parse()
                .with_context(|| format!("--oob-{transport} {spec:?} is not PORT or ADDR:PORT"))?,
        };
        let mut port = OobPort::new(addr, transport, service);
        port.options.mtu = mtu;
        port.options.sl = args.oob_sl;
        port.options.gid_index = args.oob_gid_index;
        port.options.max_clients_per_peer = args.oob_max_clients_per_peer;
        port.options.max_qps_per_client = args.oob_max_qps_per_client;
        port.options.max_qps_per_peer = args.oob_max_qps_per_peer;
        ports.push(port);
    }
    Ok(ports)
}

/// `--metrics`: a port alone binds loopback.
fn metrics_addr(s: &str) -> std::result::Result<SocketAddr, String> {
    match s.parse::<u16>() {
        Ok(port) => Ok(SocketAddr::from(([127, 0, 0, 1], port))),
        Err(_) => s
            .parse()
            .map_err(|_| format!("{s:?} is neither a port nor ADDR:PORT")),
    }
}

/// Installs the Prometheus recorder (`rdmactor_examples::prometheus`) and serves its
/// text through `rdmactor::metrics::serve`, whose limits the exporter's own listener
/// lacks.
fn install_metrics(addr: SocketAddr) -> Result<()> {
    let handle = rdmactor_examples::prometheus::install()?;
    if !addr.ip().is_loopback() {
        eprintln!("warning: --metrics {addr} is not loopback: keep it off the clients' network");
    }
    let addr = rdmactor::metrics::serve(addr, Default::default(), move || handle.render())
        .with_context(|| format!("serving metrics on {addr}"))?;
    println!("metrics on http://{addr}/metrics");
    Ok(())
}

/// The `read` service's regions from `--region` (files, loaded read-only).
fn read_regions(args: &Args) -> Result<ReadRegions> {
    let regions = ReadRegions::new();
    for spec in &args.regions {
        let (name, path) = spec
            .split_once('=')
            .with_context(|| format!("--region {spec:?} is not NAME=PATH"))?;
        regions.add_file(name, path)?;
    }
    Ok(regions)
}

/// The `lambda` service, with the native `checksum` lambda.
fn lambda_service() -> LambdaService {
    let natives = NativeLambdas::new();
    natives.register(
        "checksum",
        Arc::new(|input: &[u8]| Ok(checksum_native(input))),
    );
    LambdaService::new(
        Arc::new(Sandbox::new()),
        Arc::new(natives),
        LambdaConfig::default(),
    )
}

fn parse_listen(spec: &str) -> Result<(SocketAddr, Option<String>)> {
    let (addr, service) = match spec.split_once('=') {
        Some((a, s)) => (a, Some(s.to_owned())),
        None => (spec, None),
    };
    Ok((
        addr.parse()
            .with_context(|| format!("listen address {addr:?}"))?,
        service,
    ))
}

fn default_reserve_per_peer() -> u32 {
    SharedRecvConfig::default().reserve_per_peer.unwrap_or(0)
}

fn main() -> Result<()> {
    logs::init("info");
    let args = Args::parse();
    // The transport options go on last: they set the event mode's spin window.
    let defaults = NodeConfig::default();
    let config = args.transport.apply(NodeConfig {
        transport: TransportConfig {
            device: args.device.clone(),
            pollers: args.pollers,
            poll_mode: args.poll_mode.mode(),
            ..defaults.transport
        },
        pool: PoolConfig {
            max_bytes: args.pool_mib << 20,
            heap_bytes: args.incoming_heap_mib << 20,
            ..PoolConfig::default()
        },
        receives: ReceiveConfig {
            shared: defaults.receives.shared.map(|shared| SharedRecvConfig {
                reserve_per_peer: (args.reserve_per_peer > 0).then_some(args.reserve_per_peer),
                ..shared
            }),
            ..defaults.receives
        },
        connection: ConnectionConfig {
            pool_wait: std::time::Duration::from_secs(args.pool_wait_secs),
            ..defaults.connection
        },
    });
    // Repairs copy through a client of the server's own, on the same device.
    let repair_config = args.transport.apply(NodeConfig {
        transport: TransportConfig {
            device: args.device.clone(),
            ..NodeConfig::default().transport
        },
        ..NodeConfig::default()
    });
    anyhow::ensure!(
        args.cluster.repair_after_secs.is_none() || args.files.files_dir.is_some(),
        "--repair-after-secs needs --files-dir: a server repairs onto its own store"
    );
    let listeners = args
        .listen
        .iter()
        .map(|s| parse_listen(s))
        .collect::<Result<Vec<_>>>()?;
    // With --cluster, each stored copy is recorded by this server before its GOOD.
    let recorder = match &args.files.files_dir {
        Some(_) => args.cluster.recorder()?,
        None => None,
    };
    let files = args.files.service(recorder.clone())?;
    let regions = read_regions(&args)?;
    // Before the server starts: connections register their metric handles as they are
    // set up.
    let metrics = args.metrics;
    if let Some(addr) = metrics {
        install_metrics(addr)?;
    }
    actix::System::new().block_on(async move {
        let mut builder = Server::builder()
            .config(config)
            .max_connections(args.max_connections)
            .max_connections_per_peer(args.max_connections_per_peer)
            .service("echo", Echo)
            .service("discard", Discard)
            .service("raw-echo", RawEcho::default())
            .service("pingpong", PingPongService)
            .service("rping", Rping::default())
            .service("lambda", lambda_service())
            .service("read", ReadService::new(regions.clone()))
            .service(
                "ingest",
                IngestService::new(
                    IngestConfig::default(),
                    Arc::new(|r: Record| {
                        tracing::debug!(
                            conn = r.connection,
                            seq = r.seq,
                            len = r.data.len(),
                            "record"
                        )
                    }),
                ),
            );
        // A clone shares the service's state: kept to drain it at shutdown.
        let files_drain = files.clone();
        if let Some(files) = files {
            builder = builder.service("files", files);
        }
        // With --cluster: clients that know this server's address learn the others
        // here (`members`), and need no etcd of their own.
        if let Some(directory) = args.cluster.directory(files_drain.is_some())? {
            builder = builder.handler("members", MembersService::new(directory));
        }
        let stock = StockConfig {
            size: args.oob_size,
            iters: args.oob_iters,
            idle: std::time::Duration::from_millis(args.oob_idle_ms),
            ..StockConfig::default()
        };
        builder = builder
            .service("stock-rc", StockPingPongService::connected(stock))
            .service("stock-ud", StockPingPongService::datagram(stock))
            .service("stock-srq", StockPingPongService::shared(stock));
        for port in oob_ports(&args)? {
            builder = builder.oob(port);
        }
        for (addr, default) in &listeners {
            builder = builder.listen(*addr, default.as_deref());
        }
        let builder = rdmactor_examples::identity::keyed(
            builder,
            args.authorized_keys.as_deref(),
            &args.anonymous,
        )?;
        let server = builder.start().context("starting the server")?;
        // Files given with --region are pinned now, not on the poller at first lookup.
        // The PD is not kept: what is registered on it would keep the device open if it
        // goes (the read service lets its regions go with the device).
        let pd = server
            .protection_domain()
            .await
            .context("the RDMA device went right after start")?;
        regions
            .register_all(&pd)
            .context("registering the read regions")?;
        drop(pd);
        for addr in server.local_addrs() {
            println!("listening on {addr}");
        }
        for (addr, stats) in server.oob_addrs().iter().zip(server.oob_stats().await) {
            let transport = stats.transport.map_or("?".into(), |t| t.to_string());
            println!("listening out of band on {addr} ({transport})");
        }
        // Registered only once it listens: a client never finds a server not yet ready.
        if let Some(recorder) = &recorder {
            args.cluster.name_recorder(recorder, server.local_addrs())?;
        }
        let registrar = args
            .cluster
            .start_registrar(server.local_addrs(), files_drain.is_some())?;
        let pool_max_bytes = (args.pool_mib as u64) << 20;
        // Once a second, from `Server::stats`: the pool's gauges (with --metrics), and a
        // line whenever the RDMA device goes or comes back, and while it is gone whenever
        // the count of connections still letting go of it changes (the first sample
        // after a removal may come before the last of them closed).
        let sample = async {
            let mut shown = (true, None);
            loop {
                let stats = server.stats().await;
                if let Some(registrar) = &registrar {
                    // Written to etcd only when it changed, at most every 2 s.
                    registrar.set_load(Load {
                        connections: stats.connections as u64,
                        pool_bytes: (stats.pool.registered_bytes + stats.pool.charged_bytes) as u64,
                        pool_max_bytes,
                    });
                }
                if metrics.is_some() {
                    rdmactor::metrics::record_pool(&stats.pool);
                    rdmactor::metrics::record_shared_receives(&stats.shared_receives_posted);
                    for (queue, r) in stats.shared_reserves.iter().enumerate() {
                        rdmactor::metrics::record_shared_reserve(queue, r.free, r.lowest);
                    }
                }
                let now = (
                    stats.device_present,
                    (!stats.device_present).then_some(stats.connections),
                );
                if now != shown {
                    shown = now;
                    println!(
                        "stats: device_present={} connections={} device_losses={}",
                        stats.device_present, stats.connections, stats.device_losses
                    );
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        };
        let repair_client = match args.cluster.repair_after_secs {
            Some(_) => {
                let client =
                    Client::start(repair_config).context("starting the repairs' client")?;
                let key = rdmactor_examples::identity::Key {
                    key: args.cluster.repair_key.clone(),
                };
                Some(key.apply(client).context("--repair-key")?)
            }
            None => None,
        };
        let repairs = async {
            match &repair_client {
                Some(client) => {
                    let store = args
                        .files
                        .files_dir
                        .as_deref()
                        .context("--repair-after-secs needs --files-dir")?;
                    let (addrs, max) = (server.local_addrs(), args.files.max_file_size);
                    args.cluster.repairs(addrs, client, store, max).await
                }
                None => std::future::pending().await,
            }
        };
        let reload = rdmactor_examples::identity::reload_on_sighup(&server);
        tokio::select! {
            r = rdmactor_examples::signals::shutdown_requested() => r?,
            () = sample => {}
            r = repairs => r?,
            r = reload => r?,
        }
        if let Some(client) = repair_client {
            client.shutdown().await;
        }
        tracing::info!("signal received; shutting down");
        // First out of the registry (draining, then the lease revoked), so that clients
        // stop picking this server; then the drain.
        if let Some(registrar) = registrar {
            match registrar.withdraw().await {
                Ok(()) => println!("cluster: withdrawn"),
                Err(err) => {
                    eprintln!("cluster: withdraw: {err} (the lease expires within its TTL)")
                }
            }
        }
        if let Some(files) = &files_drain {
            // New transfers are refused with "the server is shutting down"; uploads
            // under way get up to --files-drain-secs to finish.
            files.refuse_new_transfers();
            let deadline = std::time::Instant::now()
                + std::time::Duration::from_secs(args.files.files_drain_secs);
            while files.uploads_in_flight() > 0 && std::time::Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
        let stats = server.stats().await;
        server.shutdown().await;
        println!(
            "shut down cleanly: {} accepted, {} rejected, {} closed",
            stats.accepted, stats.rejected, stats.closed
        );
        Ok(())
    })
}
