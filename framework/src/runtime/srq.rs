//! Receive buffers shared by several connections: one shared receive queue and the pool
//! leases posted to it.
//!
//! Each connection whose QP was created on the SRQ holds a clone. A receive posted here
//! may be consumed by any of those QPs; its completion reaches the connection that owns
//! the consuming QP (the poller routes by `qp_num`), which copies the bytes out and
//! reposts the buffer at once through [`SharedRecv::take`]. The wr_ids of these receives
//! carry [`SharedRecv::TAG`], so a connection tells them from its own work requests.
//!
//! Teardown: moving one QP to the error state does not flush the SRQ, so the other
//! connections keep their receives. The SRQ is destroyed when the last clone of this
//! handle goes, which is after the last QP (a connection drops its QP before its
//! handle), and only then are the buffers returned to the pool. Receives a leaving
//! member's QP consumed may complete after its connection is gone (in the rest of the
//! batch that closed it, or later in the CQ): the poller gives those back through an
//! [`OrphanedRecv`], which does not keep the queue alive.

use std::sync::{Arc, Mutex, Weak};

use crate::memory::{Lease, MrPool};
use crate::verbs::{RecvWr, SharedReceiveQueue, VerbsError, WorkCompletion};

/// A shared receive queue with its buffers. Cheap to clone.
#[derive(Clone)]
pub(crate) struct SharedRecv {
    inner: Arc<Mutex<Inner>>,
    srq: SharedReceiveQueue,
}

/// A handle that does not keep the queue alive: for completions whose connection is
/// gone (see [`SharedRecv::orphan`]).
#[derive(Clone)]
pub(crate) struct OrphanedRecv(Weak<Mutex<Inner>>);

struct Inner {
    // Field order is drop order: the queue (this clone of it) before the memory it
    // points at; see the module comment for why no QP can still use it then.
    srq: SharedReceiveQueue,
    bufs: Vec<Lease>,
    size: usize,
    /// Receives posted and not yet seen completing: the queue's depth while every
    /// completion is taken. A consumed receive whose completion nobody takes is a
    /// buffer lost until the queue goes, which is what this shows.
    posted: usize,
}

impl Inner {
    fn post(&mut self, slot: usize) -> Result<(), VerbsError> {
        let sge = self.bufs[slot].sge(0..self.size)?;
        self.srq.post_recv(&[RecvWr {
            wr_id: SharedRecv::TAG | slot as u64,
            local: Some(sge),
        }])?;
        self.posted += 1;
        Ok(())
    }

    /// The receive in `slot` completed: it is no longer posted.
    fn completed(&mut self, slot: usize) -> Result<(), VerbsError> {
        if slot >= self.bufs.len() {
            return Err(VerbsError::InvalidArgument(format!(
                "shared receive slot {slot} does not exist"
            )));
        }
        self.posted = self.posted.saturating_sub(1);
        Ok(())
    }
}

impl SharedRecv {
    /// Marks the wr_id of a receive posted to a shared queue.
    pub const TAG: u64 = 1 << 63;

    /// Creates the SRQ on the pool's PD with `depth` receives of `size` bytes, all posted.
    pub fn new(
        pool: &MrPool,
        srq: SharedReceiveQueue,
        depth: u32,
        size: usize,
    ) -> Result<Self, String> {
        let bufs = (0..depth)
            .map(|_| pool.lease(size))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let mut inner = Inner {
            srq: srq.clone(),
            bufs,
            size,
            posted: 0,
        };
        for slot in 0..depth as usize {
            inner.post(slot).map_err(|e| e.to_string())?;
        }
        Ok(SharedRecv {
            inner: Arc::new(Mutex::new(inner)),
            srq,
        })
    }

    /// The queue, to create QPs on.
    pub fn queue(&self) -> &SharedReceiveQueue {
        &self.srq
    }

    /// The slot of a shared receive's wr_id, or `None` for any other wr_id.
    pub fn slot_of(wr_id: u64) -> Option<usize> {
        (wr_id & Self::TAG != 0).then_some((wr_id & !Self::TAG) as usize)
    }

    /// Receives posted now (see `Inner::posted`).
    pub fn posted(&self) -> usize {
        self.inner.lock().expect("srq lock").posted
    }

    /// Hands what the completed receive in `slot` holds (`None` when it failed) to `read`,
    /// which copies out what it needs, then posts the buffer again, for whichever QP
    /// needs it next.
    pub fn take_with<R>(
        &self,
        slot: usize,
        wc: &WorkCompletion,
        read: impl FnOnce(Option<&[u8]>) -> R,
    ) -> Result<R, VerbsError> {
        let mut inner = self.inner.lock().expect("srq lock");
        inner.completed(slot)?;
        let got = read(
            wc.is_ok()
                .then(|| &inner.bufs[slot].as_slice()[..(wc.byte_len as usize).min(inner.size)]),
        );
        inner.post(slot)?;
        Ok(got)
    }

    /// A handle for the completions a leaving member's QP may still produce: receives it
    /// consumed before it closed, whose buffers the other members need back.
    pub fn orphan(&self) -> OrphanedRecv {
        OrphanedRecv(Arc::downgrade(&self.inner))
    }
}

impl OrphanedRecv {
    /// Posts the buffer of the completed receive in `slot` again, unread. Nothing to do
    /// when the queue itself is gone (its buffers went back to the pool with it).
    pub fn repost(&self, slot: usize) -> Result<(), VerbsError> {
        let Some(inner) = self.0.upgrade() else {
            return Ok(());
        };
        let mut inner = inner.lock().expect("srq lock");
        inner.completed(slot)?;
        inner.post(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_wr_ids_name_their_slot() {
        assert_eq!(SharedRecv::slot_of(SharedRecv::TAG | 7), Some(7));
        assert_eq!(SharedRecv::slot_of(7), None);
        assert_eq!(SharedRecv::slot_of(0), None);
    }
}
