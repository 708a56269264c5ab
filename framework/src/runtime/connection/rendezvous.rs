//! Large messages sent by rendezvous: the bytes exposed to this peer alone, for its
//! RDMA READ, until it says Done.

use super::{Buf, CloseReason, Core, Wr};
use crate::proto::frame::{FrameKind, RendezvousOffer, OFFER_LEN};
use crate::verbs::{Access, MemoryRegion, MemoryWindow};

/// A large message exposed to the peer for its RDMA READ: a window bound to this
/// connection's QP with REMOTE_READ over exactly the message's bytes. Field order is drop
/// order: the window (the peer's access) goes before the memory.
pub(super) struct RendezvousOut {
    _window: MemoryWindow,
    _buf: Buf,
}

impl Core {
    /// Offers `bytes` by rendezvous: copies them into a buffer registered for this
    /// message with `MW_BIND` and no remote access, exactly as long as the message, binds
    /// a window to this QP over it with REMOTE_READ, and sends the offer. Least access for
    /// the shortest time: only this peer can READ, only those bytes, and only until it
    /// says Done (the window is deallocated then, or when the connection closes). Needs
    /// two send-queue slots (the bind, then the offer), which `pump` checks.
    ///
    /// Not a window over a pool chunk: rxe checks a READ through a window against the
    /// range of the MR underneath, not the window's (observed in the Soft-RoCE VM, see
    /// `tests/shared_grants.rs`), so a window over one chunk of a pool arena would let
    /// the peer read every chunk of that arena. An MR of exactly the message bounds it on
    /// any provider.
    pub(super) fn post_rendezvous_offer(
        &mut self,
        tag: u32,
        bytes: Vec<u8>,
    ) -> Result<(), CloseReason> {
        // The bind goes on the send queue now; SENDs queued before it go first.
        self.flush_sends()?;
        let len = bytes.len();
        let mut mr = MemoryRegion::register(&self.pd, len, Access::LOCAL_WRITE | Access::MW_BIND)
            .map_err(CloseReason::from_verbs)?;
        mr.as_mut_slice().copy_from_slice(&bytes);
        let buf = Buf::Registered(mr);
        let window = MemoryWindow::alloc(&self.pd).map_err(CloseReason::from_verbs)?;
        let slot = self.inflight.vacant_entry();
        let remote = self
            .qp
            .bind_window(
                slot.key() as u64,
                &window,
                buf.region(),
                Access::REMOTE_READ,
            )
            .map_err(CloseReason::from_verbs)?;
        slot.insert(Wr::Bind);
        self.send_outstanding += 1;
        let key = self.rendezvous_out.insert(RendezvousOut {
            _window: window,
            _buf: buf,
        }) as u32;
        let offer = RendezvousOffer {
            addr: remote.addr,
            rkey: remote.rkey,
            key,
        };
        let mut body = [0u8; OFFER_LEN];
        offer.encode(&mut body);
        self.post_frame(FrameKind::RendezvousOffer, tag, len as u32, &body)
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        // Windows hold a reference on the QP they are bound to (rxe waits for it when the
        // QP is destroyed): the rendezvous windows go before the fields drop, QP included.
        self.rendezvous_out.clear();
    }
}
