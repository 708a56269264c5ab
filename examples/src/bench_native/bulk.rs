//! 8 MiB echoes (each a rendezvous READ in both directions), and what they do to a
//! 64 B client's tail: its p99 next to two clients echoing 8 MiB, over its p99 alone,
//! and over its p99 through an idle second server under the same load. Every client is
//! a `Client` of its own (its own device and poller thread), as the processes of
//! `scripts/lib/bench-fairness` are in the VM.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _, Result};
use rdmactor::runtime::Client;
use rdmactor::transport::loopback::Loopback;

/// MB/s (10^6 bytes) an 8 MiB echo moves, counting both directions: `reps` windows of
/// at least `len` and 2 round trips, one echo after another on one connection, after one
/// unmeasured echo.
pub async fn echo_rate(
    client: &Client<Loopback>,
    addr: SocketAddr,
    req: &[u8],
    reps: usize,
    len: Duration,
) -> Result<Vec<f64>> {
    let conn = client.connect(addr, "echo").await.context("connecting")?;
    let req = req.to_vec();
    let looped = conn.clone();
    let rates = client
        .run_on_poller(async move {
            let got = looped.request(req.clone()).await?;
            anyhow::ensure!(got == req, "an 8 MiB echo came back different");
            let mut rates = Vec::with_capacity(reps);
            for _ in 0..reps {
                let started = Instant::now();
                let mut n = 0usize;
                while n < 2 || started.elapsed() < len {
                    let got = looped.request(req.clone()).await?;
                    anyhow::ensure!(got.len() == req.len(), "an 8 MiB echo came back short");
                    n += 1;
                }
                let secs = started.elapsed().as_secs_f64();
                rates.push((2 * n * req.len()) as f64 / secs / 1e6);
            }
            anyhow::Ok(rates)
        })
        .await
        .ok_or_else(|| anyhow!("the client's poller stopped"))??;
    conn.close().await;
    Ok(rates)
}

/// Runs `measure` while every client of `clients` echoes `req` (8 MiB) through `addr`
/// one echo after another; stops them once `measure` is done. Returns the echoes each
/// big client completed and what `measure` returned. `measure` should first let the
/// load get under way (the big clients connect when this starts).
pub async fn under_load<M: std::future::Future>(
    clients: &[Client<Loopback>],
    addr: SocketAddr,
    req: &[u8],
    measure: M,
) -> Result<(Vec<usize>, M::Output)> {
    let stop = Arc::new(AtomicBool::new(false));
    let loads = clients.iter().map(|client| {
        let (req, stop) = (req.to_vec(), stop.clone());
        async move {
            let conn = client
                .connect(addr, "echo")
                .await
                .context("connecting a big client")?;
            let looped = conn.clone();
            let n = client
                .run_on_poller(async move {
                    let mut n = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let got = looped.request(req.clone()).await?;
                        anyhow::ensure!(got.len() == req.len(), "an 8 MiB echo came back short");
                        n += 1;
                    }
                    anyhow::Ok(n)
                })
                .await
                .ok_or_else(|| anyhow!("a big client's poller stopped"))??;
            conn.close().await;
            anyhow::Ok(n)
        }
    });
    let halt = stop.clone();
    let measured = async move {
        let out = measure.await;
        halt.store(true, Ordering::Relaxed);
        out
    };
    let (counts, out) = futures::join!(futures::future::join_all(loads), measured);
    let counts = counts.into_iter().collect::<Result<Vec<usize>>>()?;
    Ok((counts, out))
}

/// The small client's p99 in microseconds over one repetition of up to `rounds` round
/// trips or `limit`, through the async request API (as `client latency` in the VM).
pub async fn small_p99(
    client: &Client<Loopback>,
    addr: SocketAddr,
    req: &[u8],
    rounds: usize,
    limit: Duration,
) -> Result<f64> {
    let h = super::latency::request_api(client, addr, req, rounds, limit).await?;
    Ok(super::stats::quantile_us(&h, 0.99))
}

/// A pause in which nothing is measured.
pub async fn settle(d: Duration) {
    tokio::time::sleep(d).await;
}
