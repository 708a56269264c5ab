//! Connection setup (many connects at once) and the heap an idle connection holds.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use futures::StreamExt as _;
use rdmactor::runtime::{Client, ClientConnection};
use rdmactor::transport::loopback::Loopback;

/// Opens `n` connections to `echo` at `addr`, all connects in flight at once; returns
/// them and the rate (connections per second, from the first connect to the last
/// connection established).
pub async fn connect_at_once(
    client: &Client<Loopback>,
    addr: SocketAddr,
    n: usize,
) -> Result<(Vec<ClientConnection<Loopback>>, f64)> {
    let started = Instant::now();
    let all = futures::future::join_all((0..n).map(|_| client.connect(addr, "echo"))).await;
    let secs = started.elapsed().as_secs_f64();
    let conns = all
        .into_iter()
        .enumerate()
        .map(|(i, c)| c.with_context(|| format!("connect {} of {n}", i + 1)))
        .collect::<Result<Vec<_>>>()?;
    Ok((conns, n as f64 / secs))
}

/// Closes `conns`, all at once.
pub async fn close_all(conns: Vec<ClientConnection<Loopback>>) {
    futures::future::join_all(conns.into_iter().map(ClientConnection::close)).await;
}

/// Opens connections to `echo` at `addr` (`parallel` connects in flight) until `conns`
/// holds `target`, then waits a moment for the work the connects set off (welcome
/// handling, receives posted) to finish on the pollers.
pub async fn open_until(
    client: &Client<Loopback>,
    addr: SocketAddr,
    conns: &mut Vec<ClientConnection<Loopback>>,
    target: usize,
    parallel: usize,
) -> Result<()> {
    let more = target.saturating_sub(conns.len());
    let mut connecting = futures::stream::iter(0..more)
        .map(|_| client.connect(addr, "echo"))
        .buffer_unordered(parallel.max(1));
    while let Some(c) = connecting.next().await {
        let open = conns.len();
        conns.push(c.with_context(|| format!("connect {} of {target}", open + 1))?);
    }
    drop(connecting);
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(())
}
