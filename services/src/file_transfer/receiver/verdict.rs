//! How a transfer ends: verification once every chunk is consumed, the commit handed to
//! the driver, an abort midway, and the verdict the sender is told.

use super::consume::Sink;
use super::incoming::Incoming;
use super::state::{Committing, State};
use super::Receiver;
use crate::file_transfer::error::{Result, TransferError};
use crate::file_transfer::output::{Outcome, Output};
use crate::file_transfer::wire::{BadReason, Msg, RejectReason};

impl Receiver {
    /// `Done`: every chunk must be in. Once all are consumed, verify, then commit or
    /// discard.
    pub(super) fn done(&mut self, mut inc: Box<Incoming>) -> Result<()> {
        if inc.next < inc.chunks {
            return self.fail(TransferError::EarlyDone {
                received: inc.next,
                expected: inc.chunks,
            });
        }
        if inc.sink.is_none() || !inc.queued.is_empty() {
            inc.done_pending = true;
            self.state = State::Receiving(inc);
            return Ok(());
        }
        if inc.window.is_some() {
            self.out.push_back(Output::Revoke);
        }
        let Incoming {
            offer,
            sink,
            admission,
            ..
        } = *inc;
        let Sink { hasher, mut temp } = *sink.expect("checked above");
        let got = hasher.finalize();
        // A mismatch goes the way of a commit too, so that the temporary file is
        // removed off this thread and before BAD tells the peer it is gone.
        let mismatch = (got != offer.digest).then(|| {
            temp.abandon();
            got
        });
        // fsync and rename (or removal) block: the driver runs them elsewhere and
        // reports back.
        self.out.push_back(Output::Commit);
        self.state = State::Committing(Box::new(Committing {
            name: offer.name,
            overwrite: offer.overwrite,
            len: offer.len,
            digest: got,
            temp: Some(temp),
            mismatch,
            _admission: admission,
        }));
        Ok(())
    }

    /// Ends the transfer midway for `reason`, which the sender is told ([`Msg::Abort`]):
    /// the temporary file goes (dropped with the sink), the client's share is given
    /// back, and the window is revoked once the sender's `Done` says nothing more is
    /// written into it (at once if it came already).
    pub(super) fn abort(&mut self, inc: Box<Incoming>, reason: RejectReason) {
        self.out.push_back(Output::Send(Msg::Abort {
            reason: reason.clone(),
        }));
        let window = inc.window.is_some();
        if inc.done_pending {
            self.aborted(window, reason);
        } else {
            self.state = State::Aborted { reason, window };
        }
    }

    /// The aborted transfer is over: revoke and finish.
    pub(super) fn aborted(&mut self, window: bool, reason: RejectReason) {
        if window {
            self.out.push_back(Output::Revoke);
        }
        self.out
            .push_back(Output::Finished(Outcome::Aborted(reason)));
        self.state = State::Finished {
            may_identify: false,
        };
    }

    /// Sends the verdict and finishes: GOOD with what was stored, or BAD.
    pub(super) fn verdict(&mut self, verdict: std::result::Result<Outcome, BadReason>) {
        match verdict {
            Ok(stored) => {
                self.out.push_back(Output::Send(Msg::Good));
                self.out.push_back(Output::Finished(stored));
                self.state = State::Finished { may_identify: true };
            }
            Err(reason) => {
                self.out.push_back(Output::Send(Msg::Bad {
                    reason: reason.clone(),
                }));
                self.out.push_back(Output::Finished(Outcome::Bad(reason)));
                self.state = State::Finished {
                    may_identify: false,
                };
            }
        }
    }
}
