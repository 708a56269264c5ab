//! The states a sender goes through: the machine's shape in one place, so that every
//! handler matches on the same picture of a transfer.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// `Offer` sent; waiting for `Grant` or `Reject`.
    Offered,
    /// Writing chunks.
    Sending,
    /// `Done` sent; waiting for `Good` or `Bad`.
    AwaitVerdict,
    /// `Identify` sent; waiting for `Secret` or `Refused`.
    Identifying,
    /// Reading the file failed and `Abort` went out: waiting for the receiver's
    /// `Abort` in answer (the Acks it sent meanwhile are dropped), so that nothing of
    /// this transfer reaches the next one.
    Aborting,
    /// Over.
    Finished,
    /// An error ended the transfer.
    Failed,
}

impl State {
    pub(super) fn name(self) -> &'static str {
        match self {
            State::Offered => "waiting for the grant",
            State::Sending => "sending chunks",
            State::AwaitVerdict => "waiting for the verdict",
            State::Identifying => "waiting for the answer to Identify",
            State::Aborting => "aborted, waiting for the receiver's answer",
            State::Finished => "finished",
            State::Failed => "failed",
        }
    }
}
