//! 64 B echo round trips, one after another on one connection: from a client-side
//! [`Session`] (each reply handled on the client's poller thread, the next request sent
//! from there) and through the async request API (a task on the same poller thread
//! awaiting `ClientConnection::request`). Both send the same encoded `EchoRequest`, so
//! neither pays for encoding and the two differ only in the API.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _, Result};
use hdrhistogram::Histogram;
use rdmactor::runtime::{Client, CloseReason, Incoming, Session, SessionCx, SessionError};
use rdmactor::transport::loopback::Loopback;
use tokio::sync::oneshot;

use super::floors::MIN_ROUNDS;
use super::stats;

/// Round trips driven by the session itself.
struct Pinger {
    req: Vec<u8>,
    warmup: usize,
    left: usize,
    limit: Duration,
    created: Instant,
    started: Option<Instant>,
    measured: u64,
    sent_at: Instant,
    hist: Histogram<u64>,
    done: Option<oneshot::Sender<Result<Histogram<u64>, String>>>,
}

impl Pinger {
    fn ping(&mut self, cx: &mut SessionCx<'_, Loopback>) -> Result<(), SessionError> {
        self.sent_at = Instant::now();
        cx.send(1, self.req.clone())
    }

    fn finish(&mut self, outcome: Result<Histogram<u64>, String>) {
        if let Some(done) = self.done.take() {
            let _ = done.send(outcome);
        }
    }
}

impl Session<Loopback> for Pinger {
    fn on_established(&mut self, cx: &mut SessionCx<'_, Loopback>) -> Result<(), SessionError> {
        self.ping(cx)
    }

    fn on_message(
        &mut self,
        cx: &mut SessionCx<'_, Loopback>,
        msg: Incoming,
    ) -> Result<(), SessionError> {
        let rtt = self.sent_at.elapsed();
        if msg.data != self.req {
            self.finish(Err("an echo came back different".into()));
            return Err(SessionError::new("echo payload differs"));
        }
        if self.warmup > 0 && self.created.elapsed() < self.limit / 5 {
            self.warmup -= 1;
        } else {
            let started = *self.started.get_or_insert_with(Instant::now);
            stats::record(&mut self.hist, rtt);
            self.left -= 1;
            self.measured += 1;
            if self.left == 0 || (self.measured >= MIN_ROUNDS && started.elapsed() > self.limit) {
                let hist = std::mem::replace(&mut self.hist, stats::histogram());
                self.finish(Ok(hist));
                return Ok(());
            }
        }
        self.ping(cx)
    }

    fn on_close(&mut self, reason: &CloseReason) {
        self.finish(Err(format!("the connection closed: {reason}")));
    }
}

/// One repetition through a client-side session: `rounds` round trips (or as many as
/// fit in `limit`, at least [`MIN_ROUNDS`]) after up to 1,000 unmeasured ones (at most
/// a fifth of `limit` of them).
pub async fn session(
    client: &Client<Loopback>,
    addr: SocketAddr,
    req: &[u8],
    rounds: usize,
    limit: Duration,
) -> Result<Histogram<u64>> {
    let (tx, rx) = oneshot::channel();
    let pinger = Pinger {
        req: req.to_vec(),
        warmup: 1000,
        left: rounds,
        limit,
        created: Instant::now(),
        started: None,
        measured: 0,
        sent_at: Instant::now(),
        hist: stats::histogram(),
        done: Some(tx),
    };
    let conn = client
        .connect_session(addr, "echo", pinger)
        .await
        .context("connecting the session")?;
    let hist = rx
        .await
        .map_err(|_| anyhow!("the session ended without a word"))?
        .map_err(|e| anyhow!("echo session: {e}"));
    conn.close().await;
    hist
}

/// One repetition through the async request API (bounded as [`session`]), the loop running on the client's poller
/// thread (where the connection's actor runs, so a reply wakes it without a thread hop).
pub async fn request_api(
    client: &Client<Loopback>,
    addr: SocketAddr,
    req: &[u8],
    rounds: usize,
    limit: Duration,
) -> Result<Histogram<u64>> {
    let conn = client.connect(addr, "echo").await.context("connecting")?;
    let req = req.to_vec();
    let looped = conn.clone();
    let hist = client
        .run_on_poller(async move {
            let mut hist = stats::histogram();
            let warming = Instant::now();
            for _ in 0..1000 {
                looped.request(req.clone()).await?;
                if warming.elapsed() > limit / 5 {
                    break;
                }
            }
            let started = Instant::now();
            for n in 1..=rounds as u64 {
                let t = Instant::now();
                let got = looped.request(req.clone()).await?;
                stats::record(&mut hist, t.elapsed());
                anyhow::ensure!(got == req, "an echo came back different");
                if n >= MIN_ROUNDS && started.elapsed() > limit {
                    break;
                }
            }
            anyhow::Ok(hist)
        })
        .await
        .ok_or_else(|| anyhow!("the client's poller stopped"))??;
    conn.close().await;
    Ok(hist)
}
