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
//! handle), and only then are the buffers returned to the pool.

use std::sync::{Arc, Mutex};

use crate::memory::{Lease, MrPool};
use crate::verbs::{RecvWr, SharedReceiveQueue, VerbsError, WorkCompletion};

/// A shared receive queue with its buffers. Cheap to clone.
#[derive(Clone)]
pub(crate) struct SharedRecv {
    inner: Arc<Mutex<Inner>>,
    srq: SharedReceiveQueue,
}

struct Inner {
    // Field order is drop order: the queue (this clone of it) before the memory it
    // points at; see the module comment for why no QP can still use it then.
    _srq: SharedReceiveQueue,
    bufs: Vec<Lease>,
    size: usize,
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
        let shared = SharedRecv {
            inner: Arc::new(Mutex::new(Inner {
                _srq: srq.clone(),
                bufs,
                size,
            })),
            srq,
        };
        for slot in 0..depth as usize {
            shared
                .post(&shared.inner.lock().expect("srq lock"), slot)
                .map_err(|e| e.to_string())?;
        }
        Ok(shared)
    }

    /// The queue, to create QPs on.
    pub fn queue(&self) -> &SharedReceiveQueue {
        &self.srq
    }

    /// The slot of a shared receive's wr_id, or `None` for any other wr_id.
    pub fn slot_of(wr_id: u64) -> Option<usize> {
        (wr_id & Self::TAG != 0).then_some((wr_id & !Self::TAG) as usize)
    }

    fn post(&self, inner: &Inner, slot: usize) -> Result<(), VerbsError> {
        let sge = inner.bufs[slot].sge(0..inner.size)?;
        self.srq.post_recv(&[RecvWr {
            wr_id: Self::TAG | slot as u64,
            local: Some(sge),
        }])
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
        let inner = self.inner.lock().expect("srq lock");
        let Some(buf) = inner.bufs.get(slot) else {
            return Err(VerbsError::InvalidArgument(format!(
                "shared receive slot {slot} does not exist"
            )));
        };
        let got = read(
            wc.is_ok()
                .then(|| &buf.as_slice()[..(wc.byte_len as usize).min(inner.size)]),
        );
        self.post(&inner, slot)?;
        Ok(got)
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
