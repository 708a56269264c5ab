//! CQ-polling threads. Each thread owns a set of CQs shared by many QPs, polls them in
//! batches and routes each completion to the connection that owns its QP (looked up by
//! `qp_num`), one message per connection per batch.
//!
//! Busy mode spins (lowest latency, one core per poller); event mode sleeps on a
//! completion channel and re-arms (costs a wake-up, frees the core). A poller grows a new
//! CQ when the existing ones cannot hold another connection's worst case, so a CQ never
//! overflows (an overflow would put every QP on it in the error state).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use actix::prelude::*;
use dashmap::DashMap;

use crate::verbs::{CompletionChannel, CompletionQueue, Context, Result, WorkCompletion};

/// How poller threads wait for completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollMode {
    /// Spin on the CQs.
    Busy,
    /// Sleep on a completion channel until a CQ has work.
    Event,
}

/// Completions for one connection, in CQ order.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Completions(pub Vec<WorkCompletion>);

/// Where each QP's completions go.
pub(crate) type Routes = Arc<DashMap<u32, Recipient<Completions>>>;

/// The entries of a CQ the poller creates (rxe allows up to 32767).
const CQ_ENTRIES: u32 = 16384;

struct CqSlot {
    cq: CompletionQueue,
    reserved: u32,
}

struct PollerShared {
    cqs: Mutex<Vec<CqSlot>>,
    generation: AtomicU64,
    stop: AtomicBool,
}

struct Poller {
    shared: Arc<PollerShared>,
    channel: Option<CompletionChannel>,
    thread: Option<JoinHandle<()>>,
}

/// The set of poller threads of one device.
pub struct Pollers {
    ctx: Context,
    pollers: Vec<Poller>,
    next: AtomicU64,
}

/// A connection's claim on CQ capacity; returned when dropped.
pub struct CqReservation {
    shared: Arc<PollerShared>,
    cq: CompletionQueue,
    entries: u32,
}

impl CqReservation {
    /// The CQ to create the QP with.
    pub fn cq(&self) -> &CompletionQueue {
        &self.cq
    }
}

impl Drop for CqReservation {
    fn drop(&mut self) {
        let mut cqs = self.shared.cqs.lock().expect("poller lock");
        if let Some(slot) = cqs.iter_mut().find(|s| s.cq.key() == self.cq.key()) {
            slot.reserved -= self.entries;
        }
    }
}

impl std::fmt::Debug for CqReservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CqReservation")
            .field("entries", &self.entries)
            .finish()
    }
}

impl Pollers {
    /// Starts `count` poller threads on `ctx`.
    pub(crate) fn start(
        ctx: &Context,
        count: usize,
        mode: PollMode,
        routes: Routes,
    ) -> Result<Self> {
        let mut pollers = Vec::with_capacity(count.max(1));
        for i in 0..count.max(1) {
            let shared = Arc::new(PollerShared {
                cqs: Mutex::new(Vec::new()),
                generation: AtomicU64::new(0),
                stop: AtomicBool::new(false),
            });
            let channel = match mode {
                PollMode::Event => Some(CompletionChannel::new(ctx)?),
                PollMode::Busy => None,
            };
            let thread = {
                let shared = shared.clone();
                let channel = channel.clone();
                let routes = routes.clone();
                std::thread::Builder::new()
                    .name(format!("rdmactor-poll-{i}"))
                    .spawn(move || poll_loop(shared, channel, routes))
                    .expect("spawn poller thread")
            };
            pollers.push(Poller {
                shared,
                channel,
                thread: Some(thread),
            });
        }
        Ok(Pollers {
            ctx: ctx.clone(),
            pollers,
            next: AtomicU64::new(0),
        })
    }

    /// Reserves `entries` CQ slots for one connection on the next poller (round robin),
    /// creating a CQ when none has room.
    pub(crate) fn reserve(&self, entries: u32) -> Result<CqReservation> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) as usize % self.pollers.len();
        let poller = &self.pollers[i];
        let mut cqs = poller.shared.cqs.lock().expect("poller lock");
        let slot = match cqs
            .iter_mut()
            .position(|s| s.cq.capacity() - s.reserved >= entries)
        {
            Some(at) => at,
            None => {
                let cq = CompletionQueue::new(
                    &self.ctx,
                    CQ_ENTRIES.max(entries),
                    poller.channel.as_ref(),
                )?;
                if poller.channel.is_some() {
                    cq.req_notify(false)?;
                }
                cqs.push(CqSlot { cq, reserved: 0 });
                poller.shared.generation.fetch_add(1, Ordering::Release);
                cqs.len() - 1
            }
        };
        cqs[slot].reserved += entries;
        Ok(CqReservation {
            shared: poller.shared.clone(),
            cq: cqs[slot].cq.clone(),
            entries,
        })
    }

    /// Number of CQs the pollers own (for metrics).
    pub fn cq_count(&self) -> usize {
        self.pollers
            .iter()
            .map(|p| p.shared.cqs.lock().expect("poller lock").len())
            .sum()
    }
}

impl Drop for Pollers {
    fn drop(&mut self) {
        for p in &self.pollers {
            p.shared.stop.store(true, Ordering::Release);
        }
        for p in &mut self.pollers {
            if let Some(t) = p.thread.take() {
                let _ = t.join();
            }
        }
    }
}

fn poll_loop(shared: Arc<PollerShared>, channel: Option<CompletionChannel>, routes: Routes) {
    let mut cqs: Vec<CompletionQueue> = Vec::new();
    let mut seen = u64::MAX;
    let mut wcs = Vec::with_capacity(crate::verbs::POLL_BATCH);
    let mut idle = 0u32;
    while !shared.stop.load(Ordering::Acquire) {
        let generation = shared.generation.load(Ordering::Acquire);
        if generation != seen {
            seen = generation;
            cqs = shared
                .cqs
                .lock()
                .expect("poller lock")
                .iter()
                .map(|s| s.cq.clone())
                .collect();
        }
        let mut found = 0;
        for cq in &cqs {
            found += drain(cq, &mut wcs, &routes);
        }
        if found > 0 {
            idle = 0;
            continue;
        }
        match &channel {
            Some(ch) => {
                // Re-arm, then poll once more to close the race with completions that
                // arrived between the last poll and the arm, then sleep.
                for cq in &cqs {
                    if let Err(e) = cq.req_notify(false) {
                        tracing::error!(error = %e, "arming a CQ failed");
                    }
                    found += drain(cq, &mut wcs, &routes);
                }
                if found == 0 {
                    if let Err(e) = ch.wait(Some(Duration::from_millis(50))) {
                        tracing::error!(error = %e, "waiting on the completion channel failed");
                    }
                }
            }
            None => {
                idle += 1;
                if idle > 1024 {
                    std::thread::yield_now();
                }
            }
        }
    }
}

/// Polls `cq` empty, routing completions; returns how many there were.
fn drain(cq: &CompletionQueue, wcs: &mut Vec<WorkCompletion>, routes: &Routes) -> usize {
    let mut total = 0;
    loop {
        wcs.clear();
        match cq.poll(wcs) {
            Ok(0) => return total,
            Ok(n) => total += n,
            Err(e) => {
                tracing::error!(error = %e, "ibv_poll_cq failed");
                return total;
            }
        }
        route(wcs, routes);
    }
}

/// Sends each connection its completions from this batch as one message, keeping each
/// connection's completions in CQ order.
fn route(wcs: &[WorkCompletion], routes: &Routes) {
    let mut groups: Vec<(u32, Vec<WorkCompletion>)> = Vec::new();
    for wc in wcs {
        match groups.iter_mut().find(|(qp, _)| *qp == wc.qp_num) {
            Some((_, batch)) => batch.push(*wc),
            None => groups.push((wc.qp_num, vec![*wc])),
        }
    }
    for (qp, batch) in groups {
        match routes.get(&qp) {
            Some(r) => r.do_send(Completions(batch)),
            None => tracing::debug!(qp, n = batch.len(), "completions for an unknown QP dropped"),
        }
    }
}
