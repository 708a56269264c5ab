//! Chunks through the granted window: which slot each chunk uses, when a slot may
//! take the next chunk (acknowledged remotely and completed locally), and the counts
//! that acknowledgements and fills are checked against.

use crate::file_transfer::wire::WindowGrant;

/// The chunk currently using a slot.
#[derive(Debug, Clone, Copy)]
pub(super) struct SlotUse {
    pub(super) index: u64,
    /// Its WRITE completed locally, so the staging bytes may be overwritten.
    pub(super) written: bool,
}

/// Chunks through the granted window. A slot can take chunk `n` once chunk `n - slots`
/// is both acknowledged by the receiver (remote slot consumed) and completed locally
/// (staging slot no longer read by the NIC).
#[derive(Debug)]
pub(super) struct Pipeline {
    pub(super) grant: WindowGrant,
    pub(super) chunks: u64,
    /// Chunks handed out as `WriteChunk`.
    pub(super) issued: u64,
    /// Chunks filled by the driver (so possibly posted).
    pub(super) filled: u64,
    /// Every chunk below this is consumed by the receiver.
    pub(super) acked: u64,
    pub(super) slots: Vec<Option<SlotUse>>,
}

impl Pipeline {
    pub(super) fn slot_free_for(&self, n: u64) -> bool {
        // `check_grant` refused a grant of no slots, and sized `slots` to the ones used.
        let slot = n
            .checked_rem(u64::from(self.grant.slots))
            .and_then(|s| usize::try_from(s).ok());
        match slot.and_then(|s| self.slots.get(s)) {
            Some(None) => true,
            Some(Some(u)) => u.written && u.index < self.acked,
            None => false,
        }
    }
}
