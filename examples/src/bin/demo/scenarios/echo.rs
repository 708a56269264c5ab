//! Step 1, **echo**: many clients connect at once and each makes round trips of 16 B to
//! 64 KiB (the large ones by rendezvous: the server RDMA READs them); every reply is
//! compared with what was sent.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{ensure, Context as _, Result};
use futures::future::{join_all, try_join_all};
use rdmactor::runtime::{Client, ClientConnection};
use rdmactor_services::echo::{EchoRequest, EchoResponse};
use rdmactor_testkit::pattern;

use crate::table::Row;

/// Echo payload sizes; above the inline/eager limit they go by rendezvous.
const ECHO_SIZES: [usize; 7] = [16, 64, 256, 1024, 4096, 16384, 65536];

/// `n` clients, `echoes` round trips each.
pub async fn run(client: &Client, addr: SocketAddr, n: usize, echoes: usize) -> Result<Row> {
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
