//! Rates under load: 64 B echoes with a window of requests in flight on every
//! connection (the server's CPU per request, and the requests its one poller serves),
//! and one-way 64 B messages into `discard`.
//!
//! The echo load comes from client-side sessions that send the next request from the
//! reply's handler: the cheapest client rdmactor has, so that on two cores the client
//! leaves the server as much CPU as it can.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _, Result};
use futures::StreamExt as _;
use rdmactor::runtime::{
    Client, ClientConnection, CloseReason, Incoming, Session, SessionCx, SessionError,
};
use rdmactor::transport::loopback::Loopback;
use tokio::sync::oneshot;

use super::cpu;

/// Keeps `window` echo requests in flight on its connection until told to stop.
struct Pump {
    req: Vec<u8>,
    window: u32,
    in_flight: u32,
    done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    finished: Option<oneshot::Sender<Result<(), String>>>,
}

impl Pump {
    fn finish(&mut self, outcome: Result<(), String>) {
        if let Some(f) = self.finished.take() {
            let _ = f.send(outcome);
        }
    }
}

impl Session<Loopback> for Pump {
    fn on_established(&mut self, cx: &mut SessionCx<'_, Loopback>) -> Result<(), SessionError> {
        for tag in 1..=self.window {
            cx.send(tag, self.req.clone())?;
        }
        self.in_flight = self.window;
        Ok(())
    }

    fn on_message(
        &mut self,
        cx: &mut SessionCx<'_, Loopback>,
        msg: Incoming,
    ) -> Result<(), SessionError> {
        if msg.data != self.req {
            self.finish(Err("an echo came back different".into()));
            return Err(SessionError::new("echo payload differs"));
        }
        self.done.fetch_add(1, Ordering::Relaxed);
        if self.stop.load(Ordering::Relaxed) {
            self.in_flight -= 1;
            if self.in_flight == 0 {
                self.finish(Ok(()));
            }
            return Ok(());
        }
        cx.send(msg.tag, self.req.clone())
    }

    fn on_close(&mut self, reason: &CloseReason) {
        self.finish(Err(format!("the connection closed: {reason}")));
    }
}

/// Echo load on many connections: requests answered so far, and a way to stop it.
pub struct EchoLoad {
    /// Requests answered so far, over every connection.
    pub done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    conns: Vec<ClientConnection<Loopback>>,
    finished: Vec<oneshot::Receiver<Result<(), String>>>,
}

impl EchoLoad {
    /// Opens `connections` sessions to `addr` (64 at a time), each keeping `window`
    /// requests of the encoded `req` in flight from the moment it is established.
    pub async fn start(
        client: &Client<Loopback>,
        addr: SocketAddr,
        connections: usize,
        window: u32,
        req: &[u8],
    ) -> Result<EchoLoad> {
        let done = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut finished = Vec::with_capacity(connections);
        let mut pumps = Vec::with_capacity(connections);
        for _ in 0..connections {
            let (tx, rx) = oneshot::channel();
            finished.push(rx);
            pumps.push(Pump {
                req: req.to_vec(),
                window,
                in_flight: 0,
                done: done.clone(),
                stop: stop.clone(),
                finished: Some(tx),
            });
        }
        let mut conns = Vec::with_capacity(connections);
        let mut connecting = futures::stream::iter(pumps)
            .map(|pump| client.connect_session(addr, "echo", pump))
            .buffer_unordered(64);
        while let Some(conn) = connecting.next().await {
            conns.push(
                conn.with_context(|| format!("connection {} of {connections}", conns.len() + 1))?,
            );
        }
        Ok(EchoLoad {
            done,
            stop,
            conns,
            finished,
        })
    }

    /// Lets every request in flight come back, then closes the connections.
    pub async fn stop(self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        for f in self.finished {
            f.await
                .map_err(|_| anyhow!("an echo session ended without a word"))?
                .map_err(|e| anyhow!("echo load: {e}"))?;
        }
        futures::future::join_all(self.conns.into_iter().map(ClientConnection::close)).await;
        Ok(())
    }
}

/// One timed window of a load: what the counter and the server's threads did in it.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Operations counted per second of wall time.
    pub per_s: f64,
    /// Server CPU nanoseconds per operation.
    pub cpu_ns_per_op: f64,
    /// Cores the server's threads kept busy on average.
    pub server_cores: f64,
}

/// `reps` windows of `len` each, after a warm-up of `len / 4`, on a load that counts
/// into `counter`, with the CPU of `server` measured over the same windows.
pub async fn windows(
    counter: &AtomicU64,
    server: &cpu::Threads,
    reps: usize,
    len: Duration,
) -> Vec<Window> {
    tokio::time::sleep(len / 4).await;
    let mut out = Vec::with_capacity(reps);
    for _ in 0..reps {
        let (c0, s0, t0) = (
            counter.load(Ordering::Relaxed),
            server.cpu_ns(),
            Instant::now(),
        );
        tokio::time::sleep(len).await;
        let (c1, s1, t1) = (
            counter.load(Ordering::Relaxed),
            server.cpu_ns(),
            Instant::now(),
        );
        let (ops, cpu, secs) = ((c1 - c0) as f64, (s1 - s0) as f64, (t1 - t0).as_secs_f64());
        out.push(Window {
            per_s: ops / secs,
            cpu_ns_per_op: if ops > 0.0 { cpu / ops } else { f64::INFINITY },
            server_cores: cpu / 1e9 / secs,
        });
    }
    out
}

/// One-way messages of `size` bytes into `discard` on every connection of `conns`:
/// `batch` at a time (one `send_all`), then a request whose answer (the server's count)
/// confirms every one arrived, as `client --service discard stream` does. Measures
/// `reps` windows of `len`; messages confirmed per second, and the server's CPU.
pub async fn oneway(
    client: &Client<Loopback>,
    conns: Vec<ClientConnection<Loopback>>,
    server: &cpu::Threads,
    size: usize,
    batch: usize,
    reps: usize,
    len: Duration,
) -> Result<Vec<Window>> {
    let sent = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (counter, halt) = (sent.clone(), stop.clone());
    let work = async move {
        let streams = conns.into_iter().map(|conn| {
            let (sent, stop) = (counter.clone(), halt.clone());
            async move {
                let payload = vec![0x3c; size];
                let mut mine = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    conn.send_all(vec![payload.clone(); batch]).await?;
                    mine += batch as u64;
                    let count: u64 = conn.request_typed(&()).await?;
                    anyhow::ensure!(count == mine, "discard counted {count}, {mine} were sent");
                    sent.fetch_add(batch as u64, Ordering::Relaxed);
                }
                conn.close().await;
                anyhow::Ok(())
            }
        });
        for r in futures::future::join_all(streams).await {
            r?;
        }
        anyhow::Ok(())
    };
    let measure = async {
        let w = windows(&sent, server, reps, len).await;
        stop.store(true, Ordering::Relaxed);
        w
    };
    let (ran, w) = futures::join!(client.run_on_poller(work), measure);
    ran.ok_or_else(|| anyhow!("the client's poller stopped"))??;
    Ok(w)
}
