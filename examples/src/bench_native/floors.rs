//! The floors: the loopback transport alone, driven as the runtime drives it (a receive
//! reposted per message, one send in 16 signaled), with none of rdmactor's runtime in
//! between. Two threads, each spinning on its CQ, as the client's and the server's
//! pollers do while they have work. The ping-pong spins without a break (as
//! `ib_send_lat` does, and a poller within its spin window); the one-way SEND rate's
//! threads yield their CPU after [`IDLE_SPINS`] empty polls in a row, so that on a
//! machine with more runnable threads than cores the sender waiting for credits does not
//! burn the receiver's time slice (the runtime's pollers sleep after their spin window
//! for the same reason).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use hdrhistogram::Histogram;
use rdmactor::transport::loopback::{connect_pair, Cq, Device, Fabric, Mr, Qp};
use rdmactor::transport::{RecvWr, SendWr};
use rdmactor::verbs::{Access, ConnParam, QpCaps, SendOp, WcOpcode, WcStatus, WorkCompletion};

use super::cpu::{self, Sched};
use super::stats;

/// Round trips a latency repetition measures even when its time is up: fewer make a p99
/// of a handful of samples.
pub const MIN_ROUNDS: u64 = 200;

/// Empty polls in a row after which a floor thread yields its CPU.
pub const IDLE_SPINS: u32 = 256;

/// Counts empty polls, and yields the CPU after [`IDLE_SPINS`] of them in a row.
#[derive(Default)]
struct Idle(u32);

impl Idle {
    fn found(&mut self, anything: bool) {
        if anything {
            self.0 = 0;
        } else {
            self.0 += 1;
            if self.0 >= IDLE_SPINS {
                self.0 = 0;
                std::thread::yield_now();
            }
        }
    }
}

/// One end of a bare connection.
struct Side {
    _dev: Device,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn side(fabric: &Fabric, name: &str, mr_len: usize) -> Result<Side> {
    let dev = fabric.device(name);
    let cq = dev.create_cq(4096, None)?;
    let caps = QpCaps {
        max_send_wr: 256,
        max_recv_wr: 1024,
        ..QpCaps::default()
    };
    let qp = dev.create_qp(&cq, &cq, caps, None)?;
    let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let mr = dev.register(mr_len, access)?;
    Ok(Side {
        _dev: dev,
        cq,
        qp,
        mr,
    })
}

/// Two connected ends on a fabric of their own, each with `mr_len` registered bytes.
fn pair(mr_len: usize) -> Result<(Fabric, Side, Side)> {
    let fabric = Fabric::default();
    let a = side(&fabric, "floor-a", mr_len)?;
    let b = side(&fabric, "floor-b", mr_len)?;
    connect_pair(&a.qp, &b.qp, &ConnParam::default())?;
    Ok((fabric, a, b))
}

fn post_recv(s: &Side, wr_id: u64, range: std::ops::Range<usize>) -> Result<()> {
    let local = Some(s.mr.sge(range)?);
    s.qp.post_recv(&[RecvWr { wr_id, local }])?;
    Ok(())
}

/// Fails on a completion in error.
fn check(wcs: &[WorkCompletion]) -> Result<()> {
    match wcs.iter().find(|w| w.status != WcStatus::Success) {
        Some(w) => anyhow::bail!("floor: a completion in error: {w:?}"),
        None => Ok(()),
    }
}

/// SEND ping-pong of `len` bytes: one round trip after another, each timed, for at most
/// `rounds` round trips or `limit` (at least [`MIN_ROUNDS`]), after up to 1,000
/// unmeasured ones (at most a fifth of `limit` of them).
pub fn ping_pong(len: usize, rounds: usize, limit: Duration) -> Result<Histogram<u64>> {
    Ok(ping_pong_sched(len, rounds, limit)?.0)
}

/// [`ping_pong`], and what the scheduler did with its two threads meanwhile (summed,
/// warm-up included): the fairness figures set it beside the runtime's under the same
/// load.
pub fn ping_pong_sched(
    len: usize,
    rounds: usize,
    limit: Duration,
) -> Result<(Histogram<u64>, Sched)> {
    let (_fabric, a, b) = pair(len.max(64))?;
    post_recv(&a, 0, 0..len)?;
    post_recv(&b, 0, 0..len)?;
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        // The responder: answers every message it receives.
        let responder = scope.spawn(|| -> Result<Sched> {
            let from = cpu::sched_self().unwrap_or_default();
            let mut wcs = Vec::with_capacity(32);
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                wcs.clear();
                b.cq.poll(&mut wcs)?;
                check(&wcs)?;
                for _ in wcs.iter().filter(|w| w.opcode == WcOpcode::Recv) {
                    i += 1;
                    post_recv(&b, i, 0..len)?;
                    let mut wr = SendWr::new(i, SendOp::Send, Some(b.mr.sge(0..len)?));
                    wr.signaled = i % 16 == 0;
                    b.qp.post_send(&wr)?;
                }
            }
            Ok(cpu::sched_self().unwrap_or_default().since(&from))
        });
        let run = || -> Result<Histogram<u64>> {
            let mut h = stats::histogram();
            let mut wcs = Vec::with_capacity(32);
            let started = Instant::now();
            let mut measuring: Option<(u64, Instant)> = None;
            for i in 0.. {
                match measuring {
                    None if i >= 1000 || started.elapsed() > limit / 5 => {
                        measuring = Some((i, Instant::now()));
                    }
                    Some((from, since))
                        if i - from >= rounds as u64
                            || (i - from >= MIN_ROUNDS && since.elapsed() > limit) =>
                    {
                        break;
                    }
                    _ => {}
                }
                let t = Instant::now();
                let mut wr = SendWr::new(i, SendOp::Send, Some(a.mr.sge(0..len)?));
                wr.signaled = i % 16 == 0;
                a.qp.post_send(&wr)?;
                loop {
                    wcs.clear();
                    a.cq.poll(&mut wcs)?;
                    check(&wcs)?;
                    if wcs.iter().any(|w| w.opcode == WcOpcode::Recv) {
                        break;
                    }
                }
                post_recv(&a, i + 1, 0..len)?;
                if measuring.is_some() {
                    stats::record(&mut h, t.elapsed());
                }
            }
            Ok(h)
        };
        let from = cpu::sched_self().unwrap_or_default();
        let h = run();
        let mine = cpu::sched_self().unwrap_or_default().since(&from);
        stop.store(true, Ordering::Relaxed);
        let theirs = responder.join().expect("the responder thread")?;
        Ok((h?, mine.plus(&theirs)))
    })
}

/// One-way SENDs of `len` bytes from one thread to another, the receiver reposting each
/// receive and handing the sender a credit for it (as the runtime's credits do): messages
/// per second in each of `reps` windows of `window`.
pub fn send_rate(len: usize, reps: usize, window: Duration) -> Result<Vec<f64>> {
    const DEPTH: usize = 512;
    let (_fabric, a, b) = pair(len * DEPTH)?;
    for slot in 0..DEPTH {
        post_recv(&b, slot as u64, slot * len..(slot + 1) * len)?;
    }
    let posted = AtomicU64::new(DEPTH as u64);
    let received = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let receiver = scope.spawn(|| -> Result<()> {
            let mut wcs = Vec::with_capacity(64);
            let mut again = Vec::with_capacity(64);
            let mut idle = Idle::default();
            while !stop.load(Ordering::Relaxed) {
                wcs.clear();
                b.cq.poll(&mut wcs)?;
                check(&wcs)?;
                idle.found(!wcs.is_empty());
                again.clear();
                for w in wcs.iter().filter(|w| w.opcode == WcOpcode::Recv) {
                    let slot = w.wr_id as usize;
                    again.push(RecvWr {
                        wr_id: w.wr_id,
                        local: Some(b.mr.sge(slot * len..(slot + 1) * len)?),
                    });
                }
                if !again.is_empty() {
                    b.qp.post_recv(&again)?;
                    received.fetch_add(again.len() as u64, Ordering::Relaxed);
                    posted.fetch_add(again.len() as u64, Ordering::Release);
                }
            }
            Ok(())
        });
        let sender = scope.spawn(|| -> Result<()> {
            let mut wcs = Vec::with_capacity(64);
            let mut sent = 0u64;
            let mut idle = Idle::default();
            while !stop.load(Ordering::Relaxed) {
                let credits = posted.load(Ordering::Acquire) - sent;
                idle.found(credits > 0);
                for _ in 0..credits.min(32) {
                    let mut wr = SendWr::new(sent, SendOp::Send, Some(a.mr.sge(0..len)?));
                    wr.signaled = sent % 16 == 0;
                    a.qp.post_send(&wr)?;
                    sent += 1;
                }
                wcs.clear();
                a.cq.poll(&mut wcs)?;
                check(&wcs)?;
            }
            Ok(())
        });
        let rates = sample_rates(&received, reps, window);
        stop.store(true, Ordering::Relaxed);
        receiver.join().expect("the receiver thread")?;
        sender.join().expect("the sender thread")?;
        Ok(rates)
    })
}

/// After a warm-up of a tenth of `window`, the rate at which `counter` grows in each of
/// `reps` consecutive windows.
pub fn sample_rates(counter: &AtomicU64, reps: usize, window: Duration) -> Vec<f64> {
    std::thread::sleep(window / 10);
    let mut rates = Vec::with_capacity(reps);
    for _ in 0..reps {
        let (c0, t0) = (counter.load(Ordering::Relaxed), Instant::now());
        std::thread::sleep(window);
        let (c1, t1) = (counter.load(Ordering::Relaxed), Instant::now());
        rates.push((c1 - c0) as f64 / (t1 - t0).as_secs_f64());
    }
    rates
}

/// RDMA READs of `size` bytes, one after another on one thread: MB/s (10^6 bytes) in
/// each of `reps` windows of at least `window` and 3 READs.
pub fn read_rate(size: usize, reps: usize, window: Duration) -> Result<Vec<f64>> {
    let (_fabric, a, b) = pair(size)?;
    let remote = b.mr.remote();
    let mut wcs = Vec::with_capacity(4);
    let mut read = |i: u64| -> Result<()> {
        a.qp.post_send(&SendWr::new(i, SendOp::Read(remote), Some(a.mr.sge_all())))?;
        loop {
            wcs.clear();
            a.cq.poll(&mut wcs)?;
            check(&wcs)?;
            if !wcs.is_empty() {
                return Ok(());
            }
        }
    };
    read(0).context("the first READ")?;
    let mut rates = Vec::with_capacity(reps);
    let mut i = 1;
    for _ in 0..reps {
        let started = Instant::now();
        let mut n = 0u64;
        while n < 3 || started.elapsed() < window {
            read(i)?;
            i += 1;
            n += 1;
        }
        rates.push((n as usize * size) as f64 / started.elapsed().as_secs_f64() / 1e6);
    }
    Ok(rates)
}
