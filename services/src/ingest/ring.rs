//! Who owns which slot, on each side, with no I/O.
//!
//! A slot is either **granted** (the client may write it) or **held** by the server
//! (written, being processed, or processed and waiting to be returned). Every slot
//! starts granted. A WRITE_WITH_IMM hands a granted slot to the server
//! ([`ServerRing::handle_write`]); once processed ([`ServerRing::handle_processed`]) it
//! waits in a batch that [`ServerRing::poll_credits`] returns to the client in a
//! [`Credits`](super::Credits) message. The client writes only slots it was granted, so
//! a fast writer waits for credits instead of overrunning records not yet processed.
//!
//! Batching never deadlocks: a client that has no slot left has handed all of them to
//! the server, so they all end up processed and the batch (at most the ring size) fills.

use std::collections::VecDeque;
use std::ops::Range;

use super::wire::{ImmCodec, CHECKSUM_LEN};
use super::IngestError;

/// A record that landed: which slot, and its bytes' range in the ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    /// The slot written.
    pub slot: u32,
    /// The record and its checksum trailer, as a byte range of the whole ring.
    pub range: Range<usize>,
}

/// The server's view of one connection's ring.
#[derive(Debug)]
pub struct ServerRing {
    codec: ImmCodec,
    slot_len: u32,
    granted: Vec<bool>,
    to_return: Vec<u32>,
    batch: usize,
}

impl ServerRing {
    /// A ring of `slots` slots of `slot_len` bytes, all granted, returning slots in
    /// batches of `batch` (clamped to 1..=slots).
    ///
    /// # Errors
    /// [`IngestError::BadRing`] (see [`ImmCodec::new`]).
    pub fn new(slots: u32, slot_len: u32, batch: u32) -> Result<ServerRing, IngestError> {
        Ok(ServerRing {
            codec: ImmCodec::new(slots, slot_len)?,
            slot_len,
            granted: vec![true; slots as usize],
            to_return: Vec::new(),
            batch: batch.clamp(1, slots) as usize,
        })
    }

    /// Bytes of the whole ring.
    pub fn ring_len(&self) -> usize {
        // Our own ring, allocated at this size: no overflow.
        self.granted.len().saturating_mul(self.slot_len as usize)
    }

    /// A WRITE_WITH_IMM arrived with `imm`: the slot must be granted and the length fit.
    ///
    /// # Errors
    /// [`IngestError::SlotOutOfRange`], [`IngestError::SlotNotGranted`] (the client
    /// overran the ring), [`IngestError::BadLength`].
    pub fn handle_write(&mut self, imm: u32) -> Result<Arrival, IngestError> {
        let (slot, len) = self.codec.decode(imm);
        let Some(granted) = self.granted.get_mut(slot as usize) else {
            return Err(IngestError::SlotOutOfRange {
                slot,
                slots: u32::try_from(self.granted.len()).unwrap_or(u32::MAX),
            });
        };
        if !*granted {
            return Err(IngestError::SlotNotGranted { slot });
        }
        if (len as usize) < CHECKSUM_LEN || len > self.slot_len {
            return Err(IngestError::BadLength {
                len,
                slot_len: self.slot_len,
            });
        }
        *granted = false;
        // Slot and length checked above: within our own ring (`ring_len`).
        let start = (slot as usize).saturating_mul(self.slot_len as usize);
        Ok(Arrival {
            slot,
            range: start..start.saturating_add(len as usize),
        })
    }

    /// The record in `slot` was processed; the slot may go back to the client.
    pub fn handle_processed(&mut self, slot: u32) {
        debug_assert!(!self.granted[slot as usize], "slot {slot} is not held");
        self.to_return.push(slot);
    }

    /// Slots to return now, when a batch is full.
    #[must_use]
    pub fn poll_credits(&mut self) -> Option<Vec<u32>> {
        if self.to_return.len() >= self.batch {
            self.flush_credits()
        } else {
            None
        }
    }

    /// Every processed slot not returned yet, whatever the batch size.
    #[must_use]
    pub fn flush_credits(&mut self) -> Option<Vec<u32>> {
        if self.to_return.is_empty() {
            return None;
        }
        for &slot in &self.to_return {
            self.granted[slot as usize] = true;
        }
        Some(std::mem::take(&mut self.to_return))
    }
}

/// The client's view: the slots it may write.
#[derive(Debug)]
pub struct ClientRing {
    codec: ImmCodec,
    slot_len: u32,
    free: VecDeque<u32>,
    granted: Vec<bool>,
}

impl ClientRing {
    /// A ring as the server described it; every slot starts granted.
    ///
    /// # Errors
    /// [`IngestError::BadRing`].
    pub fn new(slots: u32, slot_len: u32) -> Result<ClientRing, IngestError> {
        Ok(ClientRing {
            codec: ImmCodec::new(slots, slot_len)?,
            slot_len,
            free: (0..slots).collect(),
            granted: vec![true; slots as usize],
        })
    }

    /// The largest record a slot holds.
    pub fn max_record(&self) -> usize {
        // `ImmCodec::new` refused slots that cannot hold the checksum.
        (self.slot_len as usize).saturating_sub(CHECKSUM_LEN)
    }

    /// Slots the client may write now.
    pub fn free_slots(&self) -> usize {
        self.free.len()
    }

    /// Takes a free slot for a sealed record of `sealed_len` bytes and returns it with
    /// the immediate to send; `None` when every slot is with the server.
    ///
    /// # Errors
    /// [`IngestError::RecordTooLarge`].
    pub fn take_slot(&mut self, sealed_len: usize) -> Result<Option<(u32, u32)>, IngestError> {
        if sealed_len > self.slot_len as usize {
            return Err(IngestError::RecordTooLarge {
                len: sealed_len.saturating_sub(CHECKSUM_LEN),
                max: self.max_record(),
            });
        }
        Ok(self.free.pop_front().map(|slot| {
            self.granted[slot as usize] = false;
            // At most `slot_len` (checked above), a u32.
            let len = u32::try_from(sealed_len).unwrap_or(self.slot_len);
            (slot, self.codec.encode(slot, len))
        }))
    }

    /// The server returned `slots`.
    ///
    /// # Errors
    /// [`IngestError::BadCredit`] for a slot out of range or one the client holds.
    pub fn handle_credits(&mut self, slots: &[u32]) -> Result<(), IngestError> {
        for &slot in slots {
            match self.granted.get_mut(slot as usize) {
                Some(granted) if !*granted => {
                    *granted = true;
                    self.free.push_back(slot);
                }
                _ => return Err(IngestError::BadCredit { slot }),
            }
        }
        Ok(())
    }
}
