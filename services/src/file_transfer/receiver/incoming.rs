//! The bookkeeping of one transfer in progress: which chunks arrived, which slots of
//! the window went back to the sender, and which copies still wait to be consumed. The
//! rules for releasing slots (in order, early while few copies wait) live here.

use std::collections::VecDeque;

use super::consume::Sink;
use crate::file_transfer::output::Output;
use crate::file_transfer::owner::Admission;
use crate::file_transfer::wire::{FileOffer, Msg, RemoteWindow};

/// One accepted offer being received.
#[derive(Debug)]
pub(super) struct Incoming {
    pub(super) offer: FileOffer,
    /// Home unless a [`ConsumeJob`](super::ConsumeJob) has it.
    pub(super) sink: Option<Box<Sink>>,
    /// Chunks copied out of the window, not yet handed to a job.
    pub(super) queued: Vec<(u32, Vec<u8>)>,
    /// Chunks below this index have had their slots released (acked when needed).
    pub(super) released: u64,
    /// Released chunks not consumed yet. A chunk's slot is released as soon as it is
    /// copied out while fewer than `slots` such copies wait, so the sender keeps
    /// writing while the job hashes; beyond that, slots are released as chunks are
    /// consumed. At most two windows' worth of bytes are ever held.
    pub(super) early: u32,
    /// `Done` arrived; the verdict waits for the last chunks to be consumed.
    pub(super) done_pending: bool,
    pub(super) slots: u32,
    pub(super) slot_len: u32,
    pub(super) chunks: u64,
    /// Index of the next chunk expected.
    pub(super) next: u64,
    pub(super) window: Option<RemoteWindow>,
    /// This upload's share of its client's quota (server side).
    pub(super) admission: Option<Admission>,
}

/// Releases chunk `index`'s slot: the sender may reuse it. Acks go out only when a later
/// chunk needs the slot (Ack is cumulative, so releases happen in chunk order).
pub(super) fn release(inc: &mut Incoming, index: u32, out: &mut VecDeque<Output>) {
    debug_assert_eq!(
        u64::from(index),
        inc.released,
        "slots are released in order"
    );
    // Chunk indices fit u32 (at most MAX_CHUNKS chunks), so in u64 one more fits.
    inc.released = u64::from(index).saturating_add(1);
    // A later chunk needs the slot, so `index + 1` is a chunk index too: it fits u32.
    if u64::from(index).saturating_add(u64::from(inc.slots)) < inc.chunks {
        if let Some(next) = index.checked_add(1) {
            out.push_back(Output::Send(Msg::Ack { next }));
        }
    }
}

/// Releases the slots of copied-out chunks waiting for the job, oldest first, while
/// fewer than `slots` released copies wait.
pub(super) fn release_early(inc: &mut Incoming, out: &mut VecDeque<Output>) {
    while inc.early < inc.slots && inc.released < inc.next {
        // Below `next`, a chunk index: fits u32.
        let Ok(index) = u32::try_from(inc.released) else {
            return;
        };
        release(inc, index, out);
        // Below `slots` (the loop's condition).
        inc.early = inc.early.saturating_add(1);
    }
}

impl Incoming {
    pub(super) fn window_len(&self) -> u64 {
        // Two u32s: the product fits u64.
        u64::from(self.slots).saturating_mul(u64::from(self.slot_len))
    }
}
