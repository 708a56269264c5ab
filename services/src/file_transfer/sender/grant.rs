//! Checking the receiver's grant before anything is written through it: the window is
//! the peer's word, and every slot address the sender computes from it must stay in
//! range, so a grant is refused whole rather than trusted in part.

use super::pipeline::Pipeline;
use super::Sender;
use crate::file_transfer::wire::{chunk_count, WindowGrant, MAX_CHUNKS, MAX_GRANT_SLOTS};

impl Sender {
    pub(super) fn check_grant(
        &self,
        window: Option<WindowGrant>,
    ) -> std::result::Result<Option<Pipeline>, String> {
        let len = self.offer.len;
        let Some(grant) = window else {
            return if len == 0 {
                Ok(None)
            } else {
                Err(format!("no window for a file of {len} bytes"))
            };
        };
        if len == 0 {
            return Err("a window for an empty file".into());
        }
        if grant.slots == 0 || grant.slot_len == 0 {
            return Err(format!("{} slots of {} bytes", grant.slots, grant.slot_len));
        }
        if grant.slots > MAX_GRANT_SLOTS {
            return Err(format!(
                "{} slots, more than the {MAX_GRANT_SLOTS} accepted",
                grant.slots
            ));
        }
        let floor = u64::from(self.min_slot_len).min(len);
        if u64::from(grant.slot_len) < floor {
            return Err(format!(
                "slots of {} bytes, fewer than the {floor} required",
                grant.slot_len
            ));
        }
        // Two u32s: the product fits u64.
        let window_len = u64::from(grant.slots).saturating_mul(u64::from(grant.slot_len));
        if grant.region.len != window_len {
            return Err(format!(
                "region of {} bytes for {} slots of {} bytes",
                grant.region.len, grant.slots, grant.slot_len
            ));
        }
        // The last byte of the window must be addressable: a peer-chosen address near
        // u64::MAX would make every slot's address overflow.
        if grant.region.addr.checked_add(window_len).is_none() {
            return Err(format!(
                "window of {window_len} bytes at {:#x} wraps around the address space",
                grant.region.addr
            ));
        }
        if window_len > self.max_window || usize::try_from(window_len).is_err() {
            return Err(format!(
                "window of {window_len} bytes, more than the {} accepted",
                self.max_window
            ));
        }
        let chunks = chunk_count(len, grant.slot_len);
        if chunks > MAX_CHUNKS {
            return Err(format!("{chunks} chunks do not fit 32-bit indices"));
        }
        // Only this many slots ever hold a chunk (chunk `n` uses slot `n % slots`, and
        // with fewer chunks than slots that is `n` itself): the slot state and the
        // staging buffer are sized by it, not by the grant.
        let in_flight = usize::try_from(u64::from(grant.slots).min(chunks))
            .map_err(|_| format!("{} slots do not fit this machine", grant.slots))?;
        Ok(Some(Pipeline {
            grant,
            chunks,
            issued: 0,
            filled: 0,
            acked: 0,
            slots: vec![None; in_flight],
        }))
    }
}
