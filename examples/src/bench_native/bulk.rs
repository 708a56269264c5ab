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

use super::cpu::{self, Sched, Threads};

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
/// trips or `limit`, through the async request API (as `client latency` in the VM), and
/// how many round trips it measured.
pub async fn small_p99(
    client: &Client<Loopback>,
    addr: SocketAddr,
    req: &[u8],
    rounds: usize,
    limit: Duration,
) -> Result<(f64, u64)> {
    let h = super::latency::request_api(client, addr, req, rounds, limit).await?;
    Ok((super::stats::quantile_us(&h, 0.99), h.len()))
}

/// A pause in which nothing is measured.
pub async fn settle(d: Duration) {
    tokio::time::sleep(d).await;
}

/// One measured stretch of the fairness figures: the p99 in microseconds, the round
/// trips measured, and what the scheduler did meanwhile with the threads on the round
/// trip's path (summed; warm-up included).
#[derive(Debug, Clone, Copy, Default)]
pub struct Stretch {
    /// The p99 round trip, microseconds.
    pub p99: f64,
    /// Round trips measured.
    pub rounds: u64,
    /// The path's threads: on a CPU, waiting for one, slices.
    pub sched: Sched,
    /// Wall-clock seconds the stretch took (warm-up included).
    pub secs: f64,
}

impl Stretch {
    /// Microseconds the path's threads spent runnable but off a CPU, per round trip
    /// measured (the warm-up's waits are in it too, so it errs high by a few percent).
    pub fn wait_per_rtt_us(&self) -> f64 {
        self.sched.wait_ns as f64 / 1e3 / self.rounds.max(1) as f64
    }

    /// Milliseconds per second the path's threads spent runnable but off a CPU: unlike
    /// the wait per round trip, comparable between loops of different speeds.
    pub fn wait_ms_per_s(&self) -> f64 {
        self.sched.wait_ns as f64 / 1e6 / self.secs.max(1e-9)
    }
}

/// Runs `measure` (a p99 and its round trips) and takes what the scheduler did with
/// `path`'s threads meanwhile.
pub async fn traced(
    path: &[&Threads],
    measure: impl std::future::Future<Output = Result<(f64, u64)>>,
) -> Result<Stretch> {
    let before = cpu::sched_all();
    let started = Instant::now();
    let (p99, rounds) = measure.await?;
    let secs = started.elapsed().as_secs_f64();
    let after = cpu::sched_all();
    let sched = path
        .iter()
        .map(|t| t.sched_between(&before, &after))
        .fold(Sched::default(), |a, b| a.plus(&b));
    Ok(Stretch {
        p99,
        rounds,
        sched,
        secs,
    })
}

/// The bare loopback SEND ping-pong of 64 B (the latency figures' floor) measured for
/// `like`'s wall-clock time, on a blocking thread so that the System's thread stays
/// free, with its own threads' schedstat. As long, not as many round trips: the floor
/// makes 20,000 round trips in a few tens of milliseconds, inside one time slice of the
/// scheduler, where the small client's take long enough to meet every preemption the
/// load causes; a control that never meets the load would say nothing.
pub async fn floor_p99(like: &Stretch) -> Result<Stretch> {
    let limit = Duration::from_secs_f64(like.secs);
    let started = Instant::now();
    let (h, sched) =
        tokio::task::spawn_blocking(move || super::floors::ping_pong_sched(64, usize::MAX, limit))
            .await
            .context("the floor's thread")??;
    Ok(Stretch {
        p99: super::stats::quantile_us(&h, 0.99),
        rounds: h.len(),
        sched,
        secs: started.elapsed().as_secs_f64(),
    })
}

/// What the scheduler did with each group of `known` between the two snapshots, and
/// with every other thread alive at the end, one line each.
pub fn describe_all(
    known: &[(&str, &Threads)],
    before: &std::collections::BTreeMap<u32, Sched>,
    after: &std::collections::BTreeMap<u32, Sched>,
    secs: f64,
) -> Vec<String> {
    let known_tids: std::collections::BTreeSet<u32> = known
        .iter()
        .flat_map(|(_, t)| t.members.iter().map(|(tid, _)| *tid))
        .collect();
    let others = Threads {
        members: after
            .keys()
            .filter(|tid| !known_tids.contains(tid))
            .map(|&tid| (tid, cpu::name(tid)))
            .collect(),
    };
    let other = "every other thread still alive (System, registrars, ...)";
    known
        .iter()
        .copied()
        .chain(std::iter::once((other, &others)))
        .map(|(what, threads)| describe(what, &threads.sched_between(before, after), secs))
        .collect()
}

/// One line of what the scheduler did, for stderr and the note.
pub fn describe(what: &str, s: &Sched, secs: f64) -> String {
    format!(
        "{what}: on CPU {:.0} ms, waiting for a CPU {:.0} ms, {} slices, over {secs:.1} s",
        s.run_ns as f64 / 1e6,
        s.wait_ns as f64 / 1e6,
        s.slices
    )
}

/// The small client's round trips split by whether the scheduler held them up: before
/// and after each one, the schedstat of the client's poller thread (where the loop
/// runs) and of every thread in `server`. A round trip during which none of them
/// waited on a run queue was slowed by nothing but the code on its path, the server's
/// turns behind bulk chunks included; its p99 is rdmactor's own under the load.
#[derive(Debug, Clone, Copy, Default)]
pub struct Split {
    /// p99 of the round trips with no run-queue wait on their path, microseconds.
    pub unwaited_p99: f64,
    /// p99 of all of them (with the schedstat reads between them), microseconds.
    pub all_p99: f64,
    /// Round trips measured, and how many of them had no wait.
    pub rounds: u64,
    /// Of those, the ones with no wait.
    pub unwaited: u64,
}

/// Measures a [`Split`] over `rounds` round trips (at most `limit`) after 1,000
/// unmeasured ones. The schedstat reads (a few microseconds each) sit between the
/// timed round trips, not inside them.
pub async fn split_by_wait(
    client: &Client<Loopback>,
    addr: SocketAddr,
    req: &[u8],
    server: &Threads,
    rounds: usize,
    limit: Duration,
) -> Result<Split> {
    let conn = client.connect(addr, "echo").await.context("connecting")?;
    let req = req.to_vec();
    let looped = conn.clone();
    let tids: Vec<u32> = server.members.iter().map(|(tid, _)| *tid).collect();
    let split = client
        .run_on_poller(async move {
            let waited = |tids: &[u32]| -> u64 {
                let mine = cpu::sched_self().unwrap_or_default().wait_ns;
                mine + tids
                    .iter()
                    .filter_map(|t| cpu::sched(*t))
                    .map(|s| s.wait_ns)
                    .sum::<u64>()
            };
            for _ in 0..1000 {
                looped.request(req.clone()).await?;
            }
            let (mut all, mut clean) = (super::stats::histogram(), super::stats::histogram());
            let started = Instant::now();
            let mut n = 0u64;
            while n < rounds as u64 && (n < 200 || started.elapsed() < limit) {
                let before = waited(&tids);
                let t = Instant::now();
                let got = looped.request(req.clone()).await?;
                let rtt = t.elapsed();
                let after = waited(&tids);
                anyhow::ensure!(got == req, "an echo came back different");
                super::stats::record(&mut all, rtt);
                if after == before {
                    super::stats::record(&mut clean, rtt);
                }
                n += 1;
            }
            anyhow::Ok(Split {
                unwaited_p99: super::stats::quantile_us(&clean, 0.99),
                all_p99: super::stats::quantile_us(&all, 0.99),
                rounds: all.len(),
                unwaited: clean.len(),
            })
        })
        .await
        .ok_or_else(|| anyhow!("the client's poller stopped"))??;
    conn.close().await;
    Ok(split)
}
