//! The sender driven: every event the driver feeds it ([`Endpoint`]) matched against
//! the state it is in. Kept whole because a trait implementation cannot be split, and
//! the match is easier to check against the message flow in one place.

use std::io::Read;

use super::read::{ChunkRead, ReadJob};
use super::state::State;
use super::Sender;
use crate::file_transfer::endpoint::{unexpected, Endpoint};
use crate::file_transfer::error::{Result, TransferError};
use crate::file_transfer::output::{Auth, ChunkWrite, Outcome, Output};
use crate::file_transfer::wire::{chunk_len, Msg, RejectReason};

impl Endpoint for Sender {
    fn state_name(&self) -> &'static str {
        self.state.name()
    }

    fn handle_msg(&mut self, msg: Msg) -> Result<()> {
        match (self.state, msg) {
            (State::Offered, Msg::Grant { window }) => match self.check_grant(window) {
                Ok(pipe) => {
                    if let Some(p) = &pipe {
                        // Slot `s` stages at `s * slot_len`; with fewer chunks than
                        // slots the last one ends at the file's end.
                        // A window `check_grant` found addressable: no overflow.
                        let slots = u64::try_from(p.slots.len())
                            .unwrap_or(u64::MAX)
                            .saturating_mul(u64::from(p.grant.slot_len));
                        self.out.push_back(Output::Stage {
                            len: slots.min(self.offer.len),
                        });
                    }
                    self.pipe = pipe;
                    self.state = State::Sending;
                    self.issue()
                }
                Err(why) => self.fail(TransferError::BadGrant(why)),
            },
            (State::Offered, Msg::Reject { reason }) => {
                self.finish(Outcome::Rejected(reason));
                Ok(())
            }
            (State::Sending | State::AwaitVerdict, Msg::Ack { next }) => self.ack(next),
            (State::AwaitVerdict, Msg::Good) => {
                match self.identity.clone() {
                    Some(id) => {
                        self.out.push_back(Output::Send(Msg::Identify { id }));
                        self.state = State::Identifying;
                    }
                    None => self.finish(Outcome::Delivered { auth: None }),
                }
                Ok(())
            }
            (State::AwaitVerdict, Msg::Bad { reason }) => {
                self.finish(Outcome::Bad(reason));
                Ok(())
            }
            // The receiver gave up midway (no space, an I/O error): stop writing. `Done`
            // follows the WRITEs already posted on the queue pair, so it tells the
            // receiver that nothing more lands in its window.
            (State::Sending, Msg::Abort { reason }) => {
                self.out.retain(|o| !matches!(o, Output::WriteChunk(_)));
                self.out.push_back(Output::Send(Msg::Done));
                self.finish(Outcome::Aborted(reason));
                Ok(())
            }
            (State::Offered | State::AwaitVerdict, Msg::Abort { reason }) => {
                self.finish(Outcome::Aborted(reason));
                Ok(())
            }
            // Acks the receiver sent before it saw our Abort: the slots no longer matter.
            (State::Aborting, Msg::Ack { .. }) => Ok(()),
            // The receiver's answer (or its own abort, crossing ours): over.
            (State::Aborting, Msg::Abort { .. }) => {
                let reason = self.aborting.take().expect("set with Aborting");
                self.finish(Outcome::Aborted(reason));
                Ok(())
            }
            (State::Identifying, Msg::Secret { key }) => {
                self.finish(Outcome::Delivered {
                    auth: Some(Auth::Secret(key)),
                });
                Ok(())
            }
            (State::Identifying, Msg::Refused) => {
                self.finish(Outcome::Delivered {
                    auth: Some(Auth::Refused),
                });
                Ok(())
            }
            (state, msg) => self.fail(TransferError::Unexpected {
                what: msg.kind().to_owned(),
                state: state.name(),
            }),
        }
    }

    fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    fn is_finished(&self) -> bool {
        self.state == State::Finished
    }

    fn waits_on_peer(&self) -> bool {
        matches!(
            self.state,
            State::Offered
                | State::Sending
                | State::AwaitVerdict
                | State::Identifying
                | State::Aborting
        )
    }

    fn give_up(&mut self, reason: RejectReason) {
        if !self.waits_on_peer() {
            return;
        }
        self.end_now(reason);
    }

    fn handle_job_refused(&mut self, reason: RejectReason) {
        if matches!(self.state, State::Finished | State::Failed) {
            return;
        }
        self.end_now(reason);
    }

    fn stopped_sending(&self) -> bool {
        matches!(
            self.state,
            State::Aborting | State::Finished | State::Failed
        )
    }

    fn fill_chunk(&mut self, chunk: &ChunkWrite, dst: &mut [u8]) -> Result<()> {
        let at = self.check_fill(chunk, dst.len())?;
        let Some(source) = self.source.as_mut() else {
            let e = TransferError::Driver(format!(
                "fill of chunk {} while a read job has the source",
                chunk.index
            ));
            return self.fail(e);
        };
        let result = source.read_exact(dst);
        self.filled(at, result)
    }

    fn take_read(&mut self, chunk: &ChunkWrite) -> Result<ReadJob> {
        let at = self.check_fill(chunk, chunk.len as usize)?;
        let Some(source) = self.source.take() else {
            let e = TransferError::Driver(format!(
                "read of chunk {} while another read job has the source",
                chunk.index
            ));
            return self.fail(e);
        };
        Ok(ReadJob {
            source,
            index: chunk.index,
            at,
            len: chunk.len,
        })
    }

    fn handle_read(&mut self, read: ChunkRead) -> Result<Vec<u8>> {
        let ChunkRead {
            source,
            index,
            at,
            result,
        } = read;
        if self.source.is_some() {
            let e =
                TransferError::Driver(format!("a read of chunk {index} that was never handed out"));
            return self.fail(e);
        }
        self.source = Some(source);
        let chunk = self.pipe.as_ref().map(|p| {
            let len = chunk_len(self.offer.len, p.grant.slot_len, u64::from(index));
            ChunkWrite {
                index,
                slot: 0,
                offset: 0,
                len,
                remote: p.grant.region,
            }
        });
        // The same checks as when it was handed out: still the next chunk to fill.
        let Some(chunk) = chunk else {
            let e = unexpected(self, format!("read of chunk {index}"));
            return self.fail(e);
        };
        let checked = self.check_fill(&chunk, chunk.len as usize)?;
        if checked != at {
            let e =
                TransferError::Driver(format!("read of chunk {index} at the wrong offset {at}"));
            return self.fail(e);
        }
        match result {
            Ok(bytes) if bytes.len() == chunk.len as usize => {
                self.filled(at, Ok(()))?;
                Ok(bytes)
            }
            Ok(bytes) => {
                let e = TransferError::Driver(format!(
                    "read of chunk {index} gave {} bytes, not {}",
                    bytes.len(),
                    chunk.len
                ));
                self.fail(e)
            }
            Err(e) => self.filled(at, Err(e)).map(|()| Vec::new()),
        }
    }

    fn handle_write_done(&mut self, index: u32) -> Result<()> {
        let ok_state = !matches!(self.state, State::Offered | State::Failed);
        let slot = self.pipe.as_mut().filter(|_| ok_state).and_then(|p| {
            let i = u64::from(index);
            // `check_grant` refused a grant of no slots.
            let slot = i.checked_rem(u64::from(p.grant.slots))?;
            let slot = usize::try_from(slot).ok()?;
            // The index is the driver's word: with fewer chunks than granted slots, a
            // slot past the file's chunks has no state at all.
            p.slots
                .get_mut(slot)?
                .as_mut()
                .filter(|u| u.index == i && !u.written && i < p.filled)
        });
        match slot {
            Some(u) => {
                u.written = true;
                self.issue()
            }
            None => {
                let e = TransferError::Driver(format!(
                    "completion of chunk {index}, which is not in flight"
                ));
                self.fail(e)
            }
        }
    }
}
