//! The rdmactor server: every service of `rdmactor-services` behind one CM actor.
//!
//! ```sh
//! server --listen 192.0.2.1:7471 --listen 192.0.2.1:7174=rping --max-connections 1000
//! ```
//! rdmactor clients pick a service by name in their connect request; plain rdma_cm
//! clients (rping, lab programs) reach the default service of the port they connect to.
//! SIGINT or SIGTERM: stop accepting, disconnect everyone, release everything, exit 0.

use std::net::SocketAddr;

use anyhow::{bail, Context as _, Result};
use clap::{Parser, ValueEnum};
use rdmactor::memory::PoolConfig;
use rdmactor::runtime::{NodeConfig, PollMode, Server};
use rdmactor_services::echo::{Echo, RawEcho};
use rdmactor_services::pingpong::PingPongService;
use rdmactor_services::rping::Rping;

#[derive(Clone, Copy, ValueEnum)]
enum Mode {
    Busy,
    Event,
}

#[derive(Parser)]
#[command(about = "rdmactor server: echo, raw-echo, pingpong and rping services")]
struct Args {
    /// Listen address, optionally with the default service for plain clients:
    /// `ADDR:PORT` or `ADDR:PORT=SERVICE`. Repeatable.
    #[arg(long, required = true)]
    listen: Vec<String>,
    /// Most connections served at once.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Registered memory cap, in MiB.
    #[arg(long, default_value_t = 1024)]
    pool_mib: usize,
    /// CQ-polling threads (each also runs its connections' actors).
    #[arg(long, default_value_t = 1)]
    pollers: usize,
    /// How pollers wait for completions.
    #[arg(long, value_enum, default_value_t = Mode::Event)]
    poll_mode: Mode,
    /// RDMA device (default: whichever rdma_cm routes to).
    #[arg(long)]
    device: Option<String>,
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

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let config = NodeConfig {
        device: args.device.clone(),
        pollers: args.pollers,
        poll_mode: match args.poll_mode {
            Mode::Busy => PollMode::Busy,
            Mode::Event => PollMode::EVENT,
        },
        pool: PoolConfig {
            max_bytes: args.pool_mib << 20,
            ..PoolConfig::default()
        },
        ..NodeConfig::default()
    };
    let listeners = args
        .listen
        .iter()
        .map(|s| parse_listen(s))
        .collect::<Result<Vec<_>>>()?;
    actix::System::new().block_on(async move {
        let mut builder = Server::builder()
            .config(config)
            .max_connections(args.max_connections)
            .service("echo", Echo)
            .service("raw-echo", RawEcho::default())
            .service("pingpong", PingPongService)
            .service("rping", Rping::default());
        for (addr, default) in &listeners {
            builder = builder.listen(*addr, default.as_deref());
        }
        let server = builder.start().context("starting the server")?;
        for addr in server.local_addrs() {
            println!("listening on {addr}");
        }
        wait_for_signal().await?;
        tracing::info!("signal received; shutting down");
        let stats = server.stats().await;
        server.shutdown().await;
        println!(
            "shut down cleanly: {} accepted, {} rejected, {} closed",
            stats.accepted, stats.rejected, stats.closed
        );
        Ok(())
    })
}

async fn wait_for_signal() -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => Ok(()),
        _ = int.recv() => Ok(()),
        else => bail!("signal streams closed"),
    }
}
