//! The states a receiver goes through, and what each holds: the machine's shape in one
//! place, so that every handler matches on the same picture of a transfer.

use super::incoming::Incoming;
use crate::file_transfer::owner::Admission;
use crate::file_transfer::store::TempFile;
use crate::file_transfer::wire::{Digest, FileOffer, HashAlg, RejectReason};

/// An offer that passed the connection's own checks, waiting for the service's quota
/// owner to admit it.
#[derive(Debug)]
pub(super) struct Admitting {
    pub(super) offer: FileOffer,
    pub(super) overwrite: bool,
    pub(super) slots: u32,
    pub(super) slot_len: u32,
    pub(super) chunks: u64,
}

/// A verified file waiting for its commit.
#[derive(Debug)]
pub(super) struct Committing {
    /// The offered name, and whether the offer asked to overwrite: a new file of at
    /// least one byte proves the ID of the same name (see [`Config::secrets`](crate::file_transfer::Config::secrets)).
    pub(super) name: String,
    pub(super) overwrite: bool,
    pub(super) len: u64,
    pub(super) digest: Digest,
    /// Taken by the driver (`take_commit`); dropping it unused removes the temporary file.
    pub(super) temp: Option<TempFile>,
    /// The hash did not match: the temporary file is [abandoned](TempFile::abandon), its
    /// commit removes it, and the verdict is BAD with this digest whatever the commit did.
    pub(super) mismatch: Option<Digest>,
    /// The client's share, given back once the commit is over.
    pub(super) _admission: Option<Admission>,
}

#[derive(Debug)]
pub(super) enum State {
    /// Waiting for an `Offer` (upload, server side).
    AwaitOffer,
    /// A `Fetch` was sent; waiting for the server's `Offer` or `Reject`.
    AwaitFetched {
        name: String,
        alg: HashAlg,
        overwrite: bool,
    },
    /// `Admit` was emitted; waiting for `handle_admitted`.
    Admitting(Box<Admitting>),
    /// `GrantWindow` was emitted; waiting for `handle_window`.
    Granting(Box<Incoming>),
    /// Chunks and then `Done`.
    Receiving(Box<Incoming>),
    /// The hash matched; `Output::Commit` was emitted and the driver commits the file
    /// (off its connection's thread) and reports with `handle_committed`.
    Committing(Box<Committing>),
    /// The verdict was sent (or the offer rejected); `Identify` is still answered when
    /// the verdict was GOOD.
    Finished { may_identify: bool },
    /// The transfer was aborted ([`Msg::Abort`](crate::file_transfer::wire::Msg::Abort) sent) before the sender's `Done`: the
    /// window stays registered, and chunks still landing in it are ignored, until
    /// `Done` says no more come.
    Aborted { reason: RejectReason, window: bool },
    /// An error ended the transfer.
    Failed,
}

impl State {
    pub(super) fn name(&self) -> &'static str {
        match self {
            State::AwaitOffer => "waiting for an offer",
            State::AwaitFetched { .. } => "waiting for the offer of the fetched file",
            State::Admitting(_) => "waiting for the service to admit the offer",
            State::Granting(_) => "registering the window",
            State::Receiving(_) => "receiving chunks",
            State::Committing(_) => "storing the verified file",
            State::Finished { may_identify: true } => "finished with GOOD (Identify allowed)",
            State::Finished {
                may_identify: false,
            } => "finished",
            State::Aborted { .. } => "aborted, waiting for the sender's Done",
            State::Failed => "failed",
        }
    }
}
