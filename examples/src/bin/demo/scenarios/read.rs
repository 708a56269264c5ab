//! Step 4, **read**: clients read a region with one-sided RDMA READs while the server
//! keeps updating it in place; every value must be whole (one version) and every client
//! must see it change, without ever sending the server a message.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use futures::future::{join_all, try_join_all};
use rdmactor::runtime::{Client, ClientConnection};
use rdmactor_services::read;
use rdmactor_testkit::pattern;

use crate::server::WORDS;
use crate::table::Row;

/// `n` readers of the live region.
pub async fn run(client: &Client, addr: SocketAddr, n: usize) -> Result<Row> {
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
