//! Completion queues and completion channels of the loopback transport.
//!
//! A CQ is a ring of completions behind a mutex, allocated once at its capacity. As on
//! a NIC, arming it (`req_notify`) makes the next completion that arrives, or the next
//! solicited or failed one, raise one event on its channel; completions already in the
//! ring do not, which is why pollers arm, poll once more, then sleep. The channel is a
//! queue of CQ keys with a condition variable: a poller thread blocked in `wait` wakes
//! when an armed CQ of its channel gets a completion.
//!
//! A fault hook delays completions: each is pushed with the time it becomes visible,
//! `poll` stops at the first one not yet visible (order is kept), and an armed CQ is
//! woken by the clock when that time comes.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use super::clock::Tick;
use super::core::FabricCore;
use super::error::{LoopbackError, Result};
use crate::verbs::{WcStatus, WorkCompletion, POLL_BATCH};

/// Which CQ a channel event was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CqKey(u32);

/// A completion channel: where a poller sleeps until one of its armed CQs completes
/// something.
#[derive(Clone, Default)]
pub struct Channel {
    inner: Arc<ChannelInner>,
}

#[derive(Default)]
struct ChannelInner {
    events: Mutex<VecDeque<CqKey>>,
    ready: Condvar,
    /// Wakes a task awaiting [`Channel::wait_ready`]; keeps a permit when none waits, so
    /// an event between a task's check and its await is not lost.
    task: tokio::sync::Notify,
}

impl Channel {
    /// Waits up to `timeout` (forever with `None`) for an event and consumes it; `None`
    /// on timeout.
    pub fn wait(&self, timeout: Option<Duration>) -> Option<CqKey> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut events = self.inner.events.lock().expect("channel lock");
        loop {
            if let Some(key) = events.pop_front() {
                return Some(key);
            }
            events = match deadline {
                None => self.inner.ready.wait(events).expect("channel lock"),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    self.inner
                        .ready
                        .wait_timeout(events, left)
                        .expect("channel lock")
                        .0
                }
            };
        }
    }

    /// Resolves once at least one event arrived, having consumed every event there is
    /// (the poller then arms its CQs again and drains them). Needs no reactor.
    pub async fn wait_ready(&self) {
        loop {
            {
                let mut events = self.inner.events.lock().expect("channel lock");
                if !events.is_empty() {
                    events.clear();
                    return;
                }
            }
            self.inner.task.notified().await;
        }
    }

    fn notify(&self, key: CqKey) {
        self.inner
            .events
            .lock()
            .expect("channel lock")
            .push_back(key);
        self.inner.ready.notify_one();
        self.inner.task.notify_one();
    }
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel").finish_non_exhaustive()
    }
}

struct Entry {
    wc: WorkCompletion,
    /// When it may be polled (only with delayed completions).
    visible_at: Option<Instant>,
}

struct CqState {
    ring: VecDeque<Entry>,
    /// Armed, and whether for solicited (and failed) completions only.
    armed: Option<bool>,
    overrun: bool,
}

/// A loopback completion queue. Cheap to clone.
#[derive(Clone)]
pub struct Cq {
    pub(super) inner: Arc<CqInner>,
}

pub(super) struct CqInner {
    key: CqKey,
    capacity: usize,
    state: Mutex<CqState>,
    channel: Option<Channel>,
    fabric: Arc<FabricCore>,
    /// Fault hook: nanoseconds before a completion becomes visible.
    pub(super) delay_ns: AtomicU64,
    me: Weak<CqInner>,
}

impl Cq {
    pub(super) fn new(fabric: &Arc<FabricCore>, capacity: u32, channel: Option<&Channel>) -> Cq {
        let capacity = capacity.max(1) as usize;
        Cq {
            inner: Arc::new_cyclic(|me| CqInner {
                key: CqKey(fabric.qp_num()),
                capacity,
                state: Mutex::new(CqState {
                    ring: VecDeque::with_capacity(capacity),
                    armed: None,
                    overrun: false,
                }),
                channel: channel.cloned(),
                fabric: fabric.clone(),
                delay_ns: AtomicU64::new(0),
                me: me.clone(),
            }),
        }
    }

    /// Which CQ this is, as [`Channel::wait`] reports it.
    pub fn key(&self) -> CqKey {
        self.inner.key
    }

    /// Completions it holds.
    pub fn capacity(&self) -> u32 {
        self.inner.capacity as u32
    }

    /// Appends up to [`POLL_BATCH`] visible completions to `out`; returns how many.
    pub fn poll(&self, out: &mut Vec<WorkCompletion>) -> Result<usize> {
        let mut st = self.inner.state.lock().expect("cq lock");
        if st.overrun {
            return Err(LoopbackError::CqOverrun(self.inner.key.0));
        }
        let mut now = None;
        let mut n = 0;
        while n < POLL_BATCH {
            let Some(front) = st.ring.front() else { break };
            if let Some(at) = front.visible_at {
                if at > *now.get_or_insert_with(Instant::now) {
                    break;
                }
            }
            out.extend(st.ring.pop_front().map(|e| e.wc));
            n += 1;
        }
        Ok(n)
    }

    /// Arms the CQ for one event: on the next completion, or with `solicited_only` the
    /// next solicited or failed one.
    pub fn req_notify(&self, solicited_only: bool) {
        let mut st = self.inner.state.lock().expect("cq lock");
        st.armed = Some(solicited_only);
        // Completions that are in the ring but not visible yet arrive, for the poller,
        // when they become visible: the clock wakes it then.
        if let Some(at) = st.ring.front().and_then(|e| e.visible_at) {
            drop(st);
            self.inner.schedule(at);
        }
    }

    /// Polls until `count` completions arrived or `timeout` passed: for tests and
    /// simple tools.
    pub fn poll_blocking(&self, count: usize, timeout: Duration) -> Result<Vec<WorkCompletion>> {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::with_capacity(count);
        while out.len() < count && Instant::now() < deadline {
            if self.poll(&mut out)? == 0 {
                std::thread::yield_now();
            }
        }
        Ok(out)
    }
}

impl CqInner {
    /// Adds a completion (the executor's side). A ring that is full overruns: the
    /// completion is lost and `poll` fails from then on, as a NIC's CQ overrun makes the
    /// CQ unusable.
    pub(super) fn push(&self, wc: WorkCompletion, solicited: bool) {
        let delay = self.delay_ns.load(Relaxed);
        let visible_at = (delay > 0).then(|| Instant::now() + Duration::from_nanos(delay));
        let mut st = self.state.lock().expect("cq lock");
        if st.ring.len() >= self.capacity {
            st.overrun = true;
            tracing::error!(cq = self.key.0, "loopback: completion queue overrun");
            return;
        }
        st.ring.push_back(Entry { wc, visible_at });
        let Some(solicited_only) = st.armed else {
            return;
        };
        if solicited_only && !solicited && wc.status == WcStatus::Success {
            return;
        }
        match visible_at {
            None => {
                st.armed = None;
                drop(st);
                if let Some(ch) = &self.channel {
                    ch.notify(self.key);
                }
            }
            Some(at) => {
                drop(st);
                self.schedule(at);
            }
        }
    }

    fn schedule(&self, at: Instant) {
        let me: Weak<dyn Tick> = self.me.clone();
        self.fabric.clock.schedule(at, me);
    }
}

impl Tick for CqInner {
    /// A delayed completion may have become visible: raise the armed event.
    fn tick(&self) {
        let mut st = self.state.lock().expect("cq lock");
        let Some(front) = st.ring.front() else { return };
        match front.visible_at {
            Some(at) if at > Instant::now() => {
                drop(st);
                self.schedule(at);
            }
            _ if st.armed.is_some() => {
                st.armed = None;
                drop(st);
                if let Some(ch) = &self.channel {
                    ch.notify(self.key);
                }
            }
            _ => {}
        }
    }
}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cq")
            .field("key", &self.inner.key)
            .field("capacity", &self.inner.capacity)
            .finish()
    }
}
