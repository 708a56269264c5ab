//! The receiver driven: every event the driver feeds it ([`Endpoint`]) matched against
//! the state it is in. Kept whole because a trait implementation cannot be split, and
//! the match is easier to check against the message flow in one place.

use std::mem;
use std::ops::Range;

use super::consume::{ConsumeJob, Consumed};
use super::incoming::{release, release_early};
use super::offer::store_reason;
use super::state::State;
use super::Receiver;
use crate::file_transfer::endpoint::{unexpected, Endpoint};
use crate::file_transfer::error::{Result, TransferError};
use crate::file_transfer::output::{Outcome, Output};
use crate::file_transfer::owner::Admission;
use crate::file_transfer::store::{StoreError, TempFile};
use crate::file_transfer::wire::{
    chunk_len, BadReason, Msg, RejectReason, RemoteWindow, WindowGrant,
};

impl Endpoint for Receiver {
    fn state_name(&self) -> &'static str {
        self.state.name()
    }

    fn handle_admitted(
        &mut self,
        answer: std::result::Result<Admission, RejectReason>,
    ) -> Result<()> {
        match (mem::replace(&mut self.state, State::Failed), answer) {
            (State::Admitting(pending), Ok(admission)) => {
                self.admitted(*pending, Some(admission));
                Ok(())
            }
            (State::Admitting(_), Err(reason)) => {
                self.reject(reason);
                Ok(())
            }
            (state, _) => {
                self.state = state;
                Err(unexpected(self, "an admission".into()))
            }
        }
    }

    fn handle_msg(&mut self, msg: Msg) -> Result<()> {
        match (mem::replace(&mut self.state, State::Failed), msg) {
            (State::AwaitOffer, Msg::Offer(offer)) => {
                let overwrite = offer.overwrite;
                self.offer(offer, overwrite);
                Ok(())
            }
            (
                State::AwaitFetched {
                    name,
                    alg,
                    overwrite,
                },
                Msg::Offer(offer),
            ) => {
                if offer.name != name || offer.digest.alg != alg {
                    return self.fail(TransferError::FetchMismatch(format!(
                        "asked for {name:?} with {alg}, offered {:?} with {}",
                        offer.name, offer.digest.alg
                    )));
                }
                self.offer(offer, overwrite);
                Ok(())
            }
            (State::AwaitFetched { .. }, Msg::Reject { reason }) => {
                self.out
                    .push_back(Output::Finished(Outcome::Rejected(reason)));
                self.state = State::Finished {
                    may_identify: false,
                };
                Ok(())
            }
            (State::Receiving(inc), Msg::Done) => self.done(inc),
            (State::Aborted { reason, window }, Msg::Done) => {
                self.aborted(window, reason);
                Ok(())
            }
            // The sender gave up (its Abort follows its last WRITE): whatever was
            // received goes; the echo tells it that no Ack of this transfer follows.
            (State::Receiving(inc), Msg::Abort { reason }) => {
                self.out.push_back(Output::Send(Msg::Abort {
                    reason: reason.clone(),
                }));
                self.aborted(inc.window.is_some(), reason);
                Ok(())
            }
            // Both gave up at once: the sender's Abort stands for its Done.
            (State::Aborted { reason, window }, Msg::Abort { .. }) => {
                self.aborted(window, reason);
                Ok(())
            }
            (State::Finished { may_identify: true }, Msg::Identify { id }) => {
                // Only the ID this upload proved, and the same `Refused` for an unknown
                // ID as for an unproved one.
                let proved = self.proved_id.take().filter(|p| *p == id);
                let answer = match proved.and_then(|id| self.config.secrets.get(&id)) {
                    Some(key) => Msg::Secret { key: key.clone() },
                    None => Msg::Refused,
                };
                self.out.push_back(Output::Send(answer));
                self.state = State::Finished {
                    may_identify: false,
                };
                Ok(())
            }
            (state, msg) => {
                let e = TransferError::Unexpected {
                    what: msg.kind().to_owned(),
                    state: state.name(),
                };
                self.fail(e)
            }
        }
    }

    fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    fn is_finished(&self) -> bool {
        matches!(self.state, State::Finished { .. })
    }

    fn waits_on_peer(&self) -> bool {
        matches!(self.state, State::Receiving(_) | State::Aborted { .. })
    }

    fn give_up(&mut self, reason: RejectReason) {
        match mem::replace(&mut self.state, State::Failed) {
            State::Receiving(inc) => {
                self.out.push_back(Output::Send(Msg::Abort {
                    reason: reason.clone(),
                }));
                // Chunks received and not yet consumed are dropped with the transfer.
                self.out.retain(|o| !matches!(o, Output::Consume));
                self.aborted(inc.window.is_some(), reason);
            }
            // Our Abort went out already; the sender's `Done` is not waited for.
            State::Aborted { window, .. } => self.aborted(window, reason),
            state => self.state = state,
        }
    }

    fn chunk_range(&self, index: u32) -> Result<Range<usize>> {
        if matches!(self.state, State::Aborted { .. }) {
            // Chunks in flight when the abort went out: nothing to read.
            return Ok(0..0);
        }
        let State::Receiving(inc) = &self.state else {
            return Err(unexpected(self, format!("chunk {index}")));
        };
        let i = u64::from(index);
        if i >= inc.chunks {
            return Err(TransferError::ChunkOrder {
                got: index,
                expected: inc.next,
            });
        }
        // Within our own window (slot `index % slots` of `slots` × `slot_len` bytes, which
        // we registered), whatever the offer's length: a chunk is at most `slot_len`.
        let slot = u64::from(index.checked_rem(inc.slots).unwrap_or(0));
        let start = slot.saturating_mul(u64::from(inc.slot_len));
        let end = start.saturating_add(u64::from(chunk_len(inc.offer.len, inc.slot_len, i)));
        let start = usize::try_from(start).unwrap_or(usize::MAX);
        let end = usize::try_from(end).unwrap_or(usize::MAX);
        Ok(start..end)
    }

    fn handle_chunk(&mut self, index: u32, bytes: &[u8]) -> Result<()> {
        if matches!(self.state, State::Aborted { .. }) {
            return Ok(());
        }
        let State::Receiving(inc) = &mut self.state else {
            let e = unexpected(self, format!("chunk {index}"));
            return self.fail(e);
        };
        if u64::from(index) != inc.next || inc.next >= inc.chunks {
            let e = TransferError::ChunkOrder {
                got: index,
                expected: inc.next,
            };
            return self.fail(e);
        }
        let expected = chunk_len(inc.offer.len, inc.slot_len, inc.next);
        if u64::try_from(bytes.len()).ok() != Some(u64::from(expected)) {
            let e = TransferError::ChunkLength {
                index,
                got: bytes.len(),
                expected,
            };
            return self.fail(e);
        }
        // Copied out (cheap next to hashing), so the job owns its bytes and a peer
        // writing into the window meanwhile cannot change what is hashed.
        inc.queued.push((index, bytes.to_vec()));
        // Below `chunks` (checked above), so one more fits.
        inc.next = inc.next.saturating_add(1);
        release_early(inc, &mut self.out);
        if inc.sink.is_some() && inc.queued.len() == 1 {
            self.out.push_back(Output::Consume);
        }
        Ok(())
    }

    fn take_consume(&mut self) -> Option<ConsumeJob> {
        let State::Receiving(inc) = &mut self.state else {
            return None;
        };
        if inc.queued.is_empty() {
            return None;
        }
        let sink = inc.sink.take()?;
        Some(ConsumeJob {
            sink,
            chunks: mem::take(&mut inc.queued),
        })
    }

    fn handle_consumed(&mut self, consumed: Consumed) -> Result<()> {
        if matches!(self.state, State::Finished { .. }) {
            // The sender aborted while this job ran: its chunks (and the temporary
            // file, dropped with the sink) belong to a transfer that is over.
            return Ok(());
        }
        let State::Receiving(inc) = &mut self.state else {
            let e = unexpected(self, "consumed chunks".into());
            return self.fail(e);
        };
        if inc.sink.is_some() {
            let e = TransferError::Driver("consumed chunks that were never handed out".into());
            return self.fail(e);
        }
        let Consumed { sink, done, result } = consumed;
        inc.sink = Some(sink);
        if let Err(e) = result {
            // The sender hears why (no space, an I/O error) instead of seeing its
            // connection close under it.
            let reason = store_reason(&e, inc.offer.len);
            tracing::warn!(error = %e, "writing a received file failed; aborting the transfer");
            let State::Receiving(inc) = mem::replace(&mut self.state, State::Failed) else {
                unreachable!("matched above");
            };
            self.abort(inc, reason);
            return Ok(());
        }
        // Chunks released early are simply done; the others release their slots now
        // (in order: consumption follows arrival), and queued ones may go early again.
        for index in done {
            if u64::from(index) < inc.released {
                // Released early, so counted in `early`.
                inc.early = inc.early.saturating_sub(1);
            } else {
                release(inc, index, &mut self.out);
            }
        }
        release_early(inc, &mut self.out);
        if !inc.queued.is_empty() {
            self.out.push_back(Output::Consume);
            return Ok(());
        }
        if inc.done_pending {
            let State::Receiving(inc) = mem::replace(&mut self.state, State::Failed) else {
                unreachable!("matched above");
            };
            return self.done(inc);
        }
        Ok(())
    }

    fn take_commit(&mut self) -> Option<TempFile> {
        match &mut self.state {
            State::Committing(c) => c.temp.take(),
            _ => None,
        }
    }

    fn commit_copy(&self) -> Option<crate::file_transfer::StoredCopy> {
        match &self.state {
            State::Committing(c) if c.mismatch.is_none() => {
                Some(crate::file_transfer::StoredCopy {
                    name: c.name.clone(),
                    len: c.len,
                    digest: c.digest,
                    owner: self.owner.clone(),
                    overwrite: c.overwrite,
                    replica: self.copy,
                })
            }
            _ => None,
        }
    }

    fn handle_committed(
        &mut self,
        result: std::result::Result<std::path::PathBuf, StoreError>,
    ) -> Result<()> {
        match mem::replace(&mut self.state, State::Failed) {
            State::Committing(c) => {
                if let Some(got) = c.mismatch {
                    if let Some(e) = result
                        .as_ref()
                        .err()
                        .filter(|e| !matches!(e, StoreError::Abandoned(_)))
                    {
                        tracing::warn!(error = %e, "cannot remove the temporary file of a mismatch");
                    }
                    self.verdict(Err(BadReason::Mismatch { got }));
                    return Ok(());
                }
                if self.copy {
                    // Made for its owner: the replicator proves nothing by it.
                } else if let (Ok(_), Some(who)) = (&result, &self.owner) {
                    // Bound to the identity proved at connect, not to the file.
                    self.proved_id = Some(who.clone());
                } else if result.is_ok() && c.len > 0 && !c.overwrite {
                    self.proved_id = Some(c.name.clone());
                }
                self.verdict(
                    result
                        .map(|path| Outcome::Stored {
                            path,
                            len: c.len,
                            digest: c.digest,
                        })
                        .map_err(|e| BadReason::NotStored {
                            reason: e.to_string(),
                        }),
                );
                Ok(())
            }
            state => {
                self.state = state;
                let e = unexpected(self, "a commit result".into());
                self.fail(e)
            }
        }
    }

    fn handle_window(&mut self, region: RemoteWindow) -> Result<()> {
        match mem::replace(&mut self.state, State::Failed) {
            State::Granting(mut inc) => {
                if region.len != inc.window_len() {
                    return self.fail(TransferError::Driver(format!(
                        "window of {} bytes registered, {} asked for",
                        region.len,
                        inc.window_len()
                    )));
                }
                inc.window = Some(region);
                self.out.push_back(Output::Send(Msg::Grant {
                    window: Some(WindowGrant {
                        region,
                        slots: inc.slots,
                        slot_len: inc.slot_len,
                    }),
                }));
                self.state = State::Receiving(inc);
                Ok(())
            }
            state => {
                self.state = state;
                let e = unexpected(self, "window registration".into());
                self.fail(e)
            }
        }
    }

    fn window_refused(&mut self, reason: String) -> Result<()> {
        match mem::replace(&mut self.state, State::Failed) {
            // Dropping the transfer removes its temporary file and gives back its
            // reservation and its admission.
            State::Granting(_) => {
                self.reject(RejectReason::Unavailable {
                    reason: format!("no memory for the transfer's window: {reason}"),
                });
                Ok(())
            }
            state => {
                self.state = state;
                let e = unexpected(self, "window refusal".into());
                self.fail(e)
            }
        }
    }
}
