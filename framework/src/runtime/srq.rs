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

use crate::memory::{Lease, MrPool, RegisteredChunks};
use crate::transport::{RecvWr, Region, SharedReceiveQueue, Transport, Verbs};
use crate::verbs::WorkCompletion;

/// A shared receive queue with its buffers. Cheap to clone.
pub(crate) struct SharedRecv<T: Transport = Verbs> {
    inner: Arc<Mutex<Inner<T>>>,
    srq: T::Srq,
}

impl<T: Transport> Clone for SharedRecv<T> {
    fn clone(&self) -> Self {
        SharedRecv {
            inner: self.inner.clone(),
            srq: self.srq.clone(),
        }
    }
}

/// A handle that does not keep the queue alive: for completions whose connection is
/// gone (see [`SharedRecv::orphan`]). Not generic: the pollers keep these in a
/// thread-local table, whatever the transport.
#[derive(Clone)]
pub(crate) struct OrphanedRecv(Weak<dyn Repost>);

/// Posting a slot's buffer again, behind [`OrphanedRecv`].
trait Repost: Send + Sync {
    fn repost(&self, slot: usize) -> Result<(), String>;
}

impl<T: Transport> Repost for Mutex<Inner<T>> {
    fn repost(&self, slot: usize) -> Result<(), String> {
        let mut inner = self.lock().expect("srq lock");
        inner.completed(slot)?;
        inner.post(slot)
    }
}

struct Inner<T: Transport> {
    // Field order is drop order: the queue (this clone of it) before the memory it
    // points at; see the module comment for why no QP can still use it then.
    srq: T::Srq,
    bufs: Vec<Lease<RegisteredChunks<T>>>,
    size: usize,
    /// Receives posted and not yet seen completing: the queue's depth while every
    /// completion is taken. A consumed receive whose completion nobody takes is a
    /// buffer lost until the queue goes, which is what this shows.
    posted: usize,
}

impl<T: Transport> Inner<T> {
    fn post(&mut self, slot: usize) -> Result<(), String> {
        let sge = self.bufs[slot]
            .sge(0..self.size)
            .map_err(|e| e.to_string())?;
        self.srq
            .post_recv(&[RecvWr {
                wr_id: SHARED_TAG | slot as u64,
                local: Some(sge),
            }])
            .map_err(|e| format!("posting shared receive {slot}: {e}"))?;
        self.posted += 1;
        Ok(())
    }

    /// The receive in `slot` completed: it is no longer posted.
    fn completed(&mut self, slot: usize) -> Result<(), String> {
        if slot >= self.bufs.len() {
            return Err(format!("shared receive slot {slot} does not exist"));
        }
        self.posted = self.posted.saturating_sub(1);
        Ok(())
    }
}

/// Marks the wr_id of a receive posted to a shared queue.
const SHARED_TAG: u64 = 1 << 63;

/// Received frames up to this size are copied out through a buffer on the stack where
/// the transport cannot lend the bytes in place.
const STACK_COPY: usize = 512;

impl SharedRecv {
    /// Marks the wr_id of a receive posted to a shared queue.
    pub const TAG: u64 = SHARED_TAG;

    /// The slot of a shared receive's wr_id, or `None` for any other wr_id.
    pub fn slot_of(wr_id: u64) -> Option<usize> {
        (wr_id & Self::TAG != 0).then_some((wr_id & !Self::TAG) as usize)
    }
}

impl<T: Transport> SharedRecv<T> {
    /// Creates the SRQ on the pool's PD with `depth` receives of `size` bytes, all posted.
    pub fn new(pool: &MrPool<T>, srq: T::Srq, depth: u32, size: usize) -> Result<Self, String> {
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
            inner.post(slot)?;
        }
        Ok(SharedRecv {
            inner: Arc::new(Mutex::new(inner)),
            srq,
        })
    }

    /// The queue, to create QPs on.
    pub fn queue(&self) -> &T::Srq {
        &self.srq
    }

    /// Receives posted now (see `Inner::posted`).
    pub fn posted(&self) -> usize {
        self.inner.lock().expect("srq lock").posted
    }

    /// Hands what the completed receive in `slot` holds (`None` when it failed) to `read`,
    /// which copies out what it needs, then posts the buffer again, for whichever QP
    /// needs it next.
    /// The bytes are lent in place where the transport can (verbs), and copied out
    /// otherwise.
    pub fn take_with<R>(
        &self,
        slot: usize,
        wc: &WorkCompletion,
        read: impl FnOnce(Option<&[u8]>) -> R,
    ) -> Result<R, String> {
        let mut inner = self.inner.lock().expect("srq lock");
        inner.completed(slot)?;
        let len = (wc.byte_len as usize).min(inner.size);
        let buf = &inner.bufs[slot];
        let got = match (wc.is_ok(), buf.bytes()) {
            (false, _) => read(None),
            (true, Some(bytes)) => read(Some(&bytes[..len])),
            // Copied out (loopback): small frames through the stack, so that a small
            // message costs no allocation here either.
            (true, None) if len <= STACK_COPY => {
                let mut copy = [0u8; STACK_COPY];
                buf.read(0, &mut copy[..len]).map_err(|e| e.to_string())?;
                read(Some(&copy[..len]))
            }
            (true, None) => {
                let mut copy = vec![0; len];
                buf.read(0, &mut copy).map_err(|e| e.to_string())?;
                read(Some(&copy))
            }
        };
        inner.post(slot)?;
        Ok(got)
    }

    /// A handle for the completions a leaving member's QP may still produce: receives it
    /// consumed before it closed, whose buffers the other members need back.
    pub fn orphan(&self) -> OrphanedRecv {
        let weak: Weak<Mutex<Inner<T>>> = Arc::downgrade(&self.inner);
        OrphanedRecv(weak)
    }
}

impl OrphanedRecv {
    /// Posts the buffer of the completed receive in `slot` again, unread. Nothing to do
    /// when the queue itself is gone (its buffers went back to the pool with it).
    pub fn repost(&self, slot: usize) -> Result<(), String> {
        match self.0.upgrade() {
            Some(queue) => queue.repost(slot),
            None => Ok(()),
        }
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
