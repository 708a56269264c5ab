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
//! 7. **identity**: the server authenticates (issue 46). At start it makes an Ed25519 key
//!    for one identity, `demo-user`, and an authorized keys file with its public half,
//!    in its work directory; every service above is anonymous on purpose (their clients,
//!    here and on other hosts, need no key), and one more, `whoami`, is
//!    authenticated-only and answers with the caller's identity. `demo-user`'s key is
//!    served and named; an impostor (`demo-user`, another key) is refused as a bad proof,
//!    a client without a key as needing authentication, each with the framework's reason.
//!
//! Run it with `scripts/demo` (inside the Soft-RoCE VM); on a host with an RDMA device,
//! `demo --ip <address of the RDMA interface>`. The exit status is 0 only when no
//! step failed and the server shut down cleanly.
//!
//! With `--cluster NAME --etcd URL[,URL..]` the demo runs only its clients, like
//! `--server`, against the node the cluster's registry lists as least loaded for
//! `echo` (rping on `--rping-port` there); `demo --serve --cluster ..` is such a node:
//! it registers its services, and withdraws before it shuts down.
//!
//! Against another host's server (`--server`, `--cluster`) the identity step needs that
//! server's `demo-user` key: `demo --serve` prints where it wrote it; copy it over and
//! pass `--key FILE`. Without `--key` the step is skipped, and says so: its row reads
//! `SKIPPED: no --key given`, it prints no `RESULT` line, and the run's last line names
//! it; a skip never fails the run and never passes for verified (see [`verify`]).
//!
//! The launcher is this file (options, the server, the steps in order, shutdown); each
//! step is a module of [`scenarios`], run by the [`verify::Verifier`]; [`server`] is the
//! demo's server and [`table`] the table it ends with.

mod scenarios;
mod server;
mod table;
mod verify;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use clap::Parser;
use rdmactor::runtime::{Client, Credential, NodeConfig};
#[cfg(feature = "cluster")]
use rdmactor_cluster::{pick, EtcdConfig, Membership};
#[cfg(feature = "cluster")]
use rdmactor_examples::cluster::ClusterArgs;
use rdmactor_examples::{logs, transport};

use crate::server::DemoServer;
use crate::verify::Verifier;

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
    /// With `--cluster`, the server also registers in the cluster's registry.
    #[arg(long, conflicts_with = "server")]
    serve: bool,
    /// Only run the clients, against a `demo --serve` at this address (another host).
    /// The `files` step then fetches its upload back to compare it, since the store is
    /// not here to look at.
    #[arg(long, value_name = "IP")]
    #[cfg_attr(feature = "cluster", arg(conflicts_with = "cluster"))]
    server: Option<IpAddr>,
    /// Only run the clients, against a node found in the cluster's registry (with
    /// `--serve`: serve, and register there). With the tools' `cluster` feature (on by
    /// default).
    #[cfg(feature = "cluster")]
    #[command(flatten)]
    cluster: ClusterArgs,
    /// With `--server` or `--cluster`: the key file of the `demo-user` identity of the
    /// `demo --serve` there (it prints where it wrote it), for the identity step, which
    /// is skipped without it. The demo's own server makes its own key.
    #[arg(long, value_name = "FILE", conflicts_with = "serve")]
    key: Option<PathBuf>,
    /// Where `--serve` stores uploads (default: a temporary directory, removed at exit).
    #[arg(long, requires = "serve")]
    store: Option<PathBuf>,
    /// Seconds each step may take before it counts as failed.
    #[arg(long, default_value_t = 120)]
    step_secs: u64,
    #[command(flatten)]
    transport: transport::TransportFlags,
}

fn main() -> Result<()> {
    logs::init("error");
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

/// `demo --serve`: the server alone, until SIGINT or SIGTERM.
async fn serve(args: &Args, config: NodeConfig, work: &Path) -> Result<()> {
    let store = args.store.clone().unwrap_or_else(|| work.join("store"));
    let server = DemoServer::start(args, config, work, store, true).await?;
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
    let found = cluster_node(args).await?;
    let local = match (args.server, found) {
        (None, None) => {
            if args.key.is_some() {
                bail!(
                    "--key is for another host's server (--server or --cluster): the \
                     demo's own server makes its own key"
                );
            }
            let store = work.join("store");
            Some(DemoServer::start(args, config.clone(), work, store, false).await?)
        }
        _ => None,
    };
    // The identity step's key: our server's, or the one given for the other host's (a
    // file that does not load ends the run here, rather than pass for "not given").
    let key = match (&local, &args.key) {
        (Some(server), _) => Some(server.user.clone()),
        (None, Some(path)) => {
            Some(Credential::load(path).with_context(|| format!("--key {}", path.display()))?)
        }
        (None, None) => None,
    };
    let addr = found.unwrap_or_else(|| SocketAddr::new(args.server.unwrap_or(args.ip), args.port));
    let rping_addr = SocketAddr::new(addr.ip(), args.rping_port);
    let store = local.as_ref().map(|s| s.store.clone());
    let client = Client::start(config.clone()).context("starting the client node")?;

    // --- The clients, one step at a time; a failed step is reported, the rest run. ---
    let mut steps = Verifier::new(7, Duration::from_secs(args.step_secs));
    steps
        .step(
            "echo",
            scenarios::echo::run(&client, addr, args.echo_clients, args.echoes),
        )
        .await;
    steps
        .step(
            "rping",
            scenarios::rping::run(rping_addr, args.rping_clients, args.rping_count),
        )
        .await;
    steps
        .step(
            "files",
            scenarios::files::run(addr, work, store.as_deref(), args.file_mib << 20),
        )
        .await;
    steps
        .step("read", scenarios::read::run(&client, addr, args.readers))
        .await;
    steps
        .step("lambda", scenarios::lambda::run(&client, addr))
        .await;
    steps
        .step(
            "hostile",
            scenarios::hostile::run(&client, addr, store.as_deref()),
        )
        .await;
    match &key {
        Some(key) => {
            steps
                .step(
                    "identity",
                    scenarios::identity::run(&config, &client, addr, key),
                )
                .await
        }
        None => steps.skip(
            "identity",
            "no --key given",
            "copy over the key file `demo --serve` printed, and pass --key FILE",
        ),
    }

    // --- Shutdown: clients first, then the server; everything must come back. --------
    client.shutdown().await;
    if let Some(server) = local {
        server.stop().await;
    }

    println!();
    table::print(steps.rows());
    println!();
    println!("done in {:.1} s", started.elapsed().as_secs_f64());
    if let Some(skipped) = steps.skipped() {
        println!("{skipped}");
    }
    steps.verdict()
}

/// With `--cluster`: the node of the registry the clients' steps go to.
#[cfg(feature = "cluster")]
async fn cluster_node(args: &Args) -> Result<Option<SocketAddr>> {
    let Some((cluster, etcd)) = args.cluster.etcd()? else {
        return Ok(None);
    };
    let addr = least_loaded(etcd, &cluster, "echo").await?;
    println!("cluster: the registry lists {addr} as the least loaded node of echo");
    Ok(Some(addr))
}

/// Built without the `cluster` feature: no `--cluster`, so never a node of one.
#[cfg(not(feature = "cluster"))]
async fn cluster_node(_: &Args) -> Result<Option<SocketAddr>> {
    Ok(None)
}

/// The address of the least loaded live node of `service` in the registry.
#[cfg(feature = "cluster")]
async fn least_loaded(etcd: EtcdConfig, cluster: &str, service: &str) -> Result<SocketAddr> {
    let members = Membership::watch(etcd, cluster, service)?;
    let listed = members
        .wait_for(Duration::from_secs(10), |n| {
            n.iter().any(|n| !n.record.draining)
        })
        .await
        .with_context(|| {
            format!("no live node of {service:?} in cluster {cluster:?} within 10 s")
        })?;
    let first = pick::by_load(&listed, |_| 0, b"")
        .first()
        .map(|n| n.record.addr);
    first.context("no live node")
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    /// clap checks how flags refer to each other (`conflicts_with = "cluster"`, ...)
    /// only when a debug build parses them, and the flags differ with the `cluster`
    /// feature: checked here for the features of this build.
    #[test]
    fn the_flags_refer_only_to_flags_that_exist() {
        super::Args::command().debug_assert();
    }
}
