//! The key-value example (`rdmactor_examples::kv`): a server, and a client that checks
//! every answer of many connections.
//!
//! ```sh
//! kv serve --listen 192.0.2.1:7471                       # until SIGINT or SIGTERM
//! kv client --server 192.0.2.1:7471 --connections 8 --requests 400  # + a RESULT p50/p99 line
//! kv demo --clients 16 --requests 10000   # server and clients in one process, over loopback
//! ```

use std::net::SocketAddr;

use anyhow::{ensure, Context as _, Result};
use clap::{Parser, Subcommand};
use rdmactor::prelude::*;
use rdmactor_examples::kv::{run_clients, Kv, KvLimits};
use rdmactor_examples::kv_session::KvSessions;
use rdmactor_examples::transport::{PollChoice, TransportFlags};
use rdmactor_examples::{logs, report};

#[derive(Parser)]
#[command(about = "rdmactor's key-value example: Put, Get and Delete on one shared map")]
struct Args {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// Serve the `kv` service until SIGINT or SIGTERM.
    Serve {
        /// Address to listen on.
        #[arg(long, default_value = "192.0.2.1:7471")]
        listen: SocketAddr,
        /// Serve the same service written as a raw session (`kv_session`), to compare.
        #[arg(long)]
        session: bool,
        /// Bytes of keys and values the store holds at once, in MiB; a Put past it is
        /// refused with `StoreFull` (the store kept everything before issue 45).
        #[arg(long, default_value_t = KvLimits::DEFAULT_MAX_BYTES >> 20)]
        max_mib: u64,
        /// The largest value, in bytes; a larger Put is refused with `ValueTooLarge`.
        #[arg(long, default_value_t = KvLimits::DEFAULT_MAX_VALUE)]
        max_value: u64,
        /// Take only clients that prove an identity of this authorized keys file.
        #[arg(long, value_name = "FILE")]
        authorized_keys: Option<std::path::PathBuf>,
    },
    /// Run CONNECTIONS connections of REQUESTS requests each and check every answer.
    Client {
        /// The server's address.
        #[arg(long, default_value = "192.0.2.1:7471")]
        server: SocketAddr,
        /// Connections, all at once.
        #[arg(long, default_value_t = 8)]
        connections: usize,
        /// Requests per connection, one after the other.
        #[arg(long, default_value_t = 400)]
        requests: usize,
        #[command(flatten)]
        key: rdmactor_examples::identity::Key,
    },
    /// The server and CLIENTS connections in this process, over the loopback transport
    /// (no RDMA device): what rdmactor itself costs, and how its poll modes behave on
    /// this machine. Prints the operations per second and a RESULT p50/p99 line.
    Demo {
        /// Connections, all at once.
        #[arg(long, default_value_t = 16)]
        clients: usize,
        /// Requests per connection, one after the other.
        #[arg(long, default_value_t = 10_000)]
        requests: usize,
        /// How the server's and the clients' pollers wait (with `--spin-us`; event with
        /// `--spin-us 0` sleeps at once).
        #[arg(long, value_enum, default_value_t = PollChoice::Event)]
        poll_mode: PollChoice,
        #[command(flatten)]
        transport: TransportFlags,
    },
}

/// `kv demo`: a `kv` server and `clients` connections over one loopback fabric.
fn demo(
    clients: usize,
    requests: usize,
    poll: PollChoice,
    transport: &TransportFlags,
) -> Result<()> {
    use rdmactor::transport::loopback::{Fabric, Loopback};
    let mut config = NodeConfig::default();
    config.transport.poll_mode = poll.mode();
    let config = transport.apply(config);
    let mode = config.transport.poll_mode;
    actix::System::new().block_on(async move {
        let fabric = Fabric::default();
        let at = SocketAddr::from(([10, 0, 0, 1], 7471));
        let server = Server::over(Loopback)
            .config(config.clone())
            .domain(fabric.device("server"))
            .listen(at, None)
            .handler("kv", Kv::default())
            .max_connections_per_peer(0)
            .start()?;
        let client = Client::<Loopback>::on(fabric.device("clients"), config)?;
        let started = std::time::Instant::now();
        let checked = run_clients(&client, at, clients, requests).await;
        let took = started.elapsed();
        client.shutdown().await;
        server.shutdown().await;
        let round_trips = checked?;
        let n = round_trips.len();
        ensure!(n == clients * requests, "{n} answers checked");
        println!(
            "kv demo: {n}/{n} answers verified, {clients} clients, poll {:?}, {:.0} ops/s",
            mode,
            n as f64 / took.as_secs_f64()
        );
        report::latency("kv-demo", 0, n, round_trips);
        Ok(())
    })
}

fn main() -> Result<()> {
    logs::init("info");
    match Args::parse().mode {
        Mode::Serve {
            listen,
            session,
            max_mib,
            max_value,
            authorized_keys,
        } => {
            let limits = KvLimits {
                max_bytes: max_mib
                    .checked_mul(1 << 20)
                    .context("--max-mib too large")?,
                max_value,
            };
            let mut server = Server::builder().listen(listen, None);
            if let Some(path) = authorized_keys {
                server = server.authorized_keys(rdmactor::runtime::Keys::load(&path)?);
            }
            match session {
                false => Ok(server.handler("kv", Kv::with_limits(limits)).run()?),
                true => Ok(server
                    .service("kv", KvSessions::with_limits(limits))
                    .run()?),
            }
        }
        Mode::Demo {
            clients,
            requests,
            poll_mode,
            transport,
        } => demo(clients, requests, poll_mode, &transport),
        Mode::Client {
            server,
            connections,
            requests,
            key,
        } => actix::System::new().block_on(async move {
            let client = key.apply(Client::start(NodeConfig::default())?)?;
            let checked = run_clients(&client, server, connections, requests).await;
            client.shutdown().await;
            let round_trips = checked?;
            let n = round_trips.len();
            ensure!(n == connections * requests, "{n} answers checked");
            println!("kv: {n}/{n} answers verified");
            report::latency("kv", 0, n, round_trips);
            Ok(())
        }),
    }
}
