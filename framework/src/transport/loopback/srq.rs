//! Receive queues: a QP's own, and shared receive queues that several QPs consume from.
//!
//! Both are a ring of posted receives behind a mutex, allocated once at the queue's
//! capacity; an incoming SEND or WRITE_WITH_IMM takes the oldest. A QP that goes to the
//! error state flushes its own receives, never a shared queue's: those stay for the
//! other QPs, as on a NIC.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::error::{LoopbackError, Result};
use super::memory::Slice;
use super::mr::Sge;
use crate::transport::RecvWr;

/// One posted receive.
pub(super) struct Recv {
    pub(super) wr_id: u64,
    pub(super) buf: Option<Slice>,
}

/// A ring of posted receives.
pub(super) struct RecvQueue {
    ring: Mutex<VecDeque<Recv>>,
    capacity: usize,
    what: &'static str,
}

impl RecvQueue {
    pub(super) fn new(capacity: u32, what: &'static str) -> RecvQueue {
        let capacity = capacity.max(1) as usize;
        RecvQueue {
            ring: Mutex::new(VecDeque::with_capacity(capacity)),
            capacity,
            what,
        }
    }

    /// Posts `wrs` in order; none of them if they do not all fit.
    pub(super) fn post(&self, wrs: &[RecvWr<Sge<'_>>]) -> Result<()> {
        let mut ring = self.ring.lock().expect("receive queue lock");
        if ring.len() + wrs.len() > self.capacity {
            return Err(LoopbackError::QueueFull {
                queue: self.what,
                capacity: self.capacity,
            });
        }
        ring.extend(wrs.iter().map(|w| Recv {
            wr_id: w.wr_id,
            buf: w.local.map(|s| s.slice()),
        }));
        Ok(())
    }

    /// The oldest receive, if any.
    pub(super) fn take(&self) -> Option<Recv> {
        self.ring.lock().expect("receive queue lock").pop_front()
    }

    /// Every receive, for a flush.
    pub(super) fn take_all(&self) -> VecDeque<Recv> {
        std::mem::take(&mut *self.ring.lock().expect("receive queue lock"))
    }

    /// Receives posted and not consumed.
    pub(super) fn len(&self) -> usize {
        self.ring.lock().expect("receive queue lock").len()
    }
}

/// A loopback shared receive queue. Cheap to clone.
#[derive(Clone)]
pub struct Srq {
    pub(super) queue: Arc<RecvQueue>,
}

impl Srq {
    pub(super) fn new(max_wr: u32) -> Srq {
        Srq {
            queue: Arc::new(RecvQueue::new(max_wr, "shared receive queue")),
        }
    }

    /// Posts receives; every QP created on this queue consumes from them.
    pub fn post_recv(&self, wrs: &[RecvWr<Sge<'_>>]) -> Result<()> {
        self.queue.post(wrs)
    }

    /// Receives posted and not consumed yet.
    pub fn posted(&self) -> usize {
        self.queue.len()
    }
}

impl std::fmt::Debug for Srq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Srq")
            .field("posted", &self.queue.len())
            .finish()
    }
}
