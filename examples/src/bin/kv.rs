//! The key-value example (`rdmactor_examples::kv`): a server, and a client that checks
//! every answer of many connections.
//!
//! ```sh
//! kv serve --listen 192.0.2.1:7471                       # until SIGINT or SIGTERM
//! kv client --server 192.0.2.1:7471 --connections 8 --requests 400  # + a RESULT p50/p99 line
//! ```

use std::net::SocketAddr;

use anyhow::{ensure, Context as _, Result};
use clap::{Parser, Subcommand};
use rdmactor::prelude::*;
use rdmactor_examples::kv::{run_clients, Kv, KvLimits};
use rdmactor_examples::kv_session::KvSessions;
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
