//! The sending side: offers a file, then pushes it through the receiver's window with
//! up to `slots` chunk WRITEs in flight, says DONE, takes the verdict and, if it has an
//! ID, identifies itself. Plays the client for uploads ([`Sender::new`],
//! [`Sender::from_file`]) and the server for downloads ([`Sender::for_fetch`]).
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

mod events;
mod flow;
mod grant;
mod pipeline;
mod read;
mod source;
mod state;

use std::collections::VecDeque;
use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use super::error::{Result, TransferError};
use super::name::validate_name;
use super::output::{Outcome, Output};
use super::wire::{FileOffer, HashAlg, Msg, RejectReason, MIN_GRANT_SLOT_LEN};
use super::Config;
use pipeline::Pipeline;
use state::State;

pub use read::{ChunkRead, ReadJob};
pub(crate) use source::{hashed, open_fetched, unavailable};

/// The sending state machine (see [`Endpoint`](super::Endpoint) for how to drive it).
///
/// Message flow, one transfer:
///
/// ```text
/// Offer → · Grant ← · [WRITE_WITH_IMM(i) → · Ack ←]* · Done → · Good|Bad ← · (Identify → · Secret|Refused ←)
/// ```
///
/// The grant is checked against the offer and against the largest window the sender
/// stages (`max_window`); the receiver's acknowledgements must be cumulative and cover
/// only chunks that were written.
pub struct Sender {
    offer: FileOffer,
    /// `None` while a [`ReadJob`] has it.
    source: Option<Box<dyn Read + Send>>,
    identity: Option<String>,
    max_window: u64,
    /// Smallest slot accepted (unless the file is smaller).
    min_slot_len: u32,
    state: State,
    pipe: Option<Pipeline>,
    out: VecDeque<Output>,
    /// Why this sender aborted (while [`State::Aborting`]).
    aborting: Option<RejectReason>,
    /// See [`Sender::fetched_key`].
    fetched_key: Option<super::file_key::FileKey>,
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("offer", &self.offer)
            .field("identity", &self.identity)
            .field("state", &self.state)
            .field("pipe", &self.pipe)
            .finish_non_exhaustive()
    }
}

impl Sender {
    /// A sender of `offer`, reading its bytes in order from `source` (exactly
    /// `offer.len` of them). Its first output is the `Offer` message.
    ///
    /// # Errors
    ///
    /// The offered name is not a plain file name.
    pub fn new(offer: FileOffer, source: Box<dyn Read + Send>) -> Result<Sender> {
        validate_name(&offer.name)?;
        let mut out = VecDeque::new();
        out.push_back(Output::Send(Msg::Offer(offer.clone())));
        Ok(Sender {
            offer,
            source: Some(source),
            identity: None,
            max_window: Config::DEFAULT_MAX_WINDOW,
            min_slot_len: MIN_GRANT_SLOT_LEN,
            state: State::Offered,
            pipe: None,
            out,
            aborting: None,
            fetched_key: None,
        })
    }

    /// A sender of the file at `path`, offered as `name`: hashes it with `alg` first
    /// (reading it whole), then sends it.
    ///
    /// # Errors
    ///
    /// A bad name, or the file cannot be read.
    pub fn from_file(path: &Path, name: &str, alg: HashAlg, overwrite: bool) -> Result<Sender> {
        validate_name(name)?;
        let file = File::open(path).map_err(TransferError::Source)?;
        let (file, offer) = hashed(file, name, alg, overwrite, &AtomicBool::new(false))
            .map_err(TransferError::Source)?;
        Sender::new(offer, Box::new(file))
    }

    /// The server's side of a download: the file `name` in `dir`, hashed with `alg`.
    /// Hashing reads the whole file before returning.
    ///
    /// # Errors
    ///
    /// The reason to send back in a `Reject`: a bad name, no such regular file, or a
    /// file that cannot be read.
    pub fn for_fetch(
        dir: &Path,
        name: &str,
        alg: HashAlg,
    ) -> std::result::Result<Sender, RejectReason> {
        Sender::for_fetch_cancellable(dir, name, alg, &AtomicBool::new(false))
    }

    /// [`for_fetch`](Self::for_fetch) that gives up, with `Unavailable`, as soon as
    /// `cancel` is set: hashing a file of up to [`Config::max_size`] takes long, and a
    /// client that left should not keep a blocking-pool thread reading for it.
    ///
    /// # Errors
    ///
    /// As [`for_fetch`](Self::for_fetch), and `Unavailable` once cancelled.
    pub fn for_fetch_cancellable(
        dir: &Path,
        name: &str,
        alg: HashAlg,
        cancel: &AtomicBool,
    ) -> std::result::Result<Sender, RejectReason> {
        let file = open_fetched(dir, name)?;
        let (file, offer) = hashed(file, name, alg, false, cancel).map_err(unavailable)?;
        Sender::for_fetched(offer, file)
    }

    /// The sender of a fetched file already opened (by [`open_fetched`]) and whose
    /// digest is known: `offer.len` bytes of `file` are sent from its start.
    pub(crate) fn for_fetched(
        offer: FileOffer,
        file: File,
    ) -> std::result::Result<Sender, RejectReason> {
        Sender::new(offer, Box::new(file)).map_err(|e| RejectReason::BadName {
            reason: e.to_string(),
        })
    }

    /// Remembers where the offered digest came from, so that the service can forget
    /// it if the receiver finds it wrong ([`fetched_key`](Self::fetched_key)).
    pub(crate) fn with_fetched_key(mut self, key: super::file_key::FileKey) -> Sender {
        self.fetched_key = Some(key);
        self
    }

    /// The key, in the service's digest store, of the file this sender serves (set
    /// for fetches served by a `FileTransfer`).
    pub fn fetched_key(&self) -> Option<&super::file_key::FileKey> {
        self.fetched_key.as_ref()
    }

    /// Sends `Identify { id }` after GOOD.
    pub fn with_identity(mut self, id: impl Into<String>) -> Sender {
        self.identity = Some(id.into());
        self
    }

    /// Offers the file as a copy for `owner` ([`Msg::OfferFor`]), as a replicator does:
    /// the server stores it as `owner`'s, or refuses it if this connection's identity
    /// is not one of its replicators. Call it before the first output is taken.
    pub fn for_owner(mut self, owner: impl Into<String>) -> Sender {
        for out in &mut self.out {
            if let Output::Send(Msg::Offer(offer)) = out {
                *out = Output::Send(Msg::OfferFor {
                    offer: offer.clone(),
                    owner: owner.into(),
                });
                break;
            }
        }
        self
    }

    /// Accepts grants of at most `max` bytes (default [`Config::DEFAULT_MAX_WINDOW`]);
    /// the staging buffer has the size of the slots the file can use at once.
    pub fn with_max_window(mut self, max: u64) -> Sender {
        self.max_window = max;
        self
    }

    /// Accepts slots as small as `len` bytes (default [`MIN_GRANT_SLOT_LEN`]). Tiny
    /// chunks cost a WRITE and an acknowledgement each: for tests and experiments.
    pub fn with_min_slot_len(mut self, len: u32) -> Sender {
        self.min_slot_len = len;
        self
    }

    /// What is being offered.
    pub fn offer(&self) -> &FileOffer {
        &self.offer
    }

    /// Chunks written but not yet known to be consumed (at most `slots`).
    pub fn chunks_in_flight(&self) -> u64 {
        self.pipe
            .as_ref()
            .map_or(0, |p| p.issued.saturating_sub(p.acked))
    }

    fn fail<T>(&mut self, e: TransferError) -> Result<T> {
        self.state = State::Failed;
        Err(e)
    }

    fn finish(&mut self, outcome: Outcome) {
        self.out.push_back(Output::Finished(outcome));
        self.state = State::Finished;
    }

    /// Ends the transfer now: the chunks not yet written are dropped, the peer is told
    /// `reason` (unless our Abort went out already), and it finishes aborted.
    fn end_now(&mut self, reason: RejectReason) {
        self.out.retain(|o| !matches!(o, Output::WriteChunk(_)));
        if self.state != State::Aborting {
            self.out.push_back(Output::Send(Msg::Abort {
                reason: reason.clone(),
            }));
        }
        self.finish(Outcome::Aborted(reason));
    }
}

// The tests' own numbers, not a peer's.
#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests;
