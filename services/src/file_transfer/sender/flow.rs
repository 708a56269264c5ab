//! The sender's steps through its [`Pipeline`](super::pipeline::Pipeline): issuing chunks
//! into free slots, checking each fill, and taking the receiver's acknowledgements.

use std::io;

use super::pipeline::SlotUse;
use super::state::State;
use super::Sender;
use crate::file_transfer::error::{Result, TransferError};
use crate::file_transfer::output::{unexpected_in, ChunkWrite, Output};
use crate::file_transfer::wire::{chunk_len, Msg, RejectReason};

impl Sender {
    /// Hands out every chunk that has a free slot; `Done` after the last one.
    ///
    /// # Errors
    ///
    /// [`TransferError::BadGrant`] if a slot falls outside the granted window (which
    /// `check_grant` rules out; checked again because the window is the peer's word).
    pub(super) fn issue(&mut self) -> Result<()> {
        if self.state != State::Sending {
            return Ok(());
        }
        if let Some(p) = &mut self.pipe {
            while p.issued < p.chunks && p.slot_free_for(p.issued) {
                let index = p.issued;
                // `check_grant` refused a grant of no slots; the remainder fits u32, the
                // product of two u32s fits u64, and chunk indices fit u32 (MAX_CHUNKS).
                let slot = index.checked_rem(u64::from(p.grant.slots)).unwrap_or(0);
                let slot = u32::try_from(slot).unwrap_or(u32::MAX);
                let offset = u64::from(slot).saturating_mul(u64::from(p.grant.slot_len));
                let len = chunk_len(self.offer.len, p.grant.slot_len, index);
                let (Some(remote), Ok(index32), Some(at)) = (
                    p.grant.region.slice(offset, u64::from(len)),
                    u32::try_from(index),
                    usize::try_from(slot).ok().filter(|&s| s < p.slots.len()),
                ) else {
                    let e = TransferError::BadGrant(format!(
                        "chunk {index} ({len} bytes at offset {offset}) outside the window"
                    ));
                    return self.fail(e);
                };
                p.slots[at] = Some(SlotUse {
                    index,
                    written: false,
                });
                // Below `chunks`, so one more fits.
                p.issued = p.issued.saturating_add(1);
                self.out.push_back(Output::WriteChunk(ChunkWrite {
                    index: index32,
                    slot,
                    offset,
                    len,
                    remote,
                }));
            }
            if p.issued < p.chunks {
                return Ok(());
            }
        }
        self.out.push_back(Output::Send(Msg::Done));
        self.state = State::AwaitVerdict;
        Ok(())
    }

    /// Checks that `chunk` is the next one to fill and `len` its length; returns its
    /// offset in the file.
    pub(super) fn check_fill(&mut self, chunk: &ChunkWrite, len: usize) -> Result<u64> {
        let ok_state = !matches!(self.state, State::Offered | State::Failed);
        let Some(p) = self.pipe.as_mut().filter(|_| ok_state) else {
            let e = unexpected_in(self.state.name(), format!("fill of chunk {}", chunk.index));
            return self.fail(e);
        };
        let index = u64::from(chunk.index);
        if index != p.filled || index >= p.issued {
            let e = TransferError::Driver(format!(
                "fill of chunk {}, expected chunk {} (issued {})",
                chunk.index, p.filled, p.issued
            ));
            return self.fail(e);
        }
        let expected = chunk_len(self.offer.len, p.grant.slot_len, index);
        if u64::try_from(len).ok() != Some(u64::from(expected)) || chunk.len != expected {
            let e = TransferError::Driver(format!(
                "chunk {} is {expected} bytes, given {len} to fill",
                chunk.index,
            ));
            return self.fail(e);
        }
        // Below `chunks`, so within the file: no overflow.
        Ok(index.saturating_mul(u64::from(p.grant.slot_len)))
    }

    /// Counts the next chunk as filled (so it may be acknowledged), or fails with the
    /// source's error.
    pub(super) fn filled(&mut self, at: u64, result: io::Result<()>) -> Result<()> {
        if let Some(p) = self.pipe.as_mut() {
            // Only after a `check_fill` below `issued`.
            p.filled = p.filled.saturating_add(1);
        }
        if let Err(e) = result {
            let e = match e.kind() {
                io::ErrorKind::UnexpectedEof => TransferError::SourceTruncated {
                    at,
                    len: self.offer.len,
                },
                _ => TransferError::Source(e),
            };
            // The receiver hears why ([`Msg::Abort`], after the WRITEs already posted)
            // instead of seeing the connection close; the chunk just read is not sent
            // (the driver checks `is_finished` before posting it).
            tracing::warn!(error = %e, "reading the file being sent failed; aborting the transfer");
            self.abort(RejectReason::Unavailable {
                reason: e.to_string(),
            });
        }
        Ok(())
    }

    /// Ends the transfer midway for `reason`: no more chunks, `Abort` to the receiver
    /// (it follows the WRITEs already posted, so the receiver may revoke its window on
    /// it), then wait for the receiver's `Abort` in answer.
    fn abort(&mut self, reason: RejectReason) {
        self.out.retain(|o| !matches!(o, Output::WriteChunk(_)));
        self.out.push_back(Output::Send(Msg::Abort {
            reason: reason.clone(),
        }));
        self.aborting = Some(reason);
        self.state = State::Aborting;
    }

    pub(super) fn ack(&mut self, next: u32) -> Result<()> {
        let bad = |why: String| TransferError::BadAck { next, why };
        let Some(p) = &mut self.pipe else {
            return self.fail(bad("no chunks were written".into()));
        };
        let n = u64::from(next);
        if n <= p.acked {
            let e = bad(format!(
                "chunks below {} were acknowledged already",
                p.acked
            ));
            return self.fail(e);
        }
        if n > p.filled {
            let e = bad(format!("only {} chunks were written", p.filled));
            return self.fail(e);
        }
        p.acked = n;
        self.issue()
    }
}
