//! The receiving side: checks an offer, asks the driver for a window, consumes chunks
//! in order (hash and temporary file), verifies on DONE, answers GOOD or BAD, and then
//! one `Identify`. Plays the server for uploads ([`Receiver::new`]) and the client for
//! downloads ([`Receiver::fetch`]).
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

mod consume;
mod events;
mod incoming;
mod offer;
mod state;
mod verdict;

use std::collections::VecDeque;
use std::sync::Arc;

use super::config::Config;
use super::error::{Result, TransferError};
use super::name::validate_name;
use super::output::{Outcome, Output};
use super::store::Reaper;
use super::wire::{HashAlg, Msg, RejectReason};
use state::State;

pub use consume::{ConsumeJob, Consumed, Sink};

/// The receiving state machine (see [`Endpoint`](super::Endpoint) for how to drive it).
///
/// Message flow, one transfer:
///
/// ```text
/// (Fetch →)  Offer ← · Grant → · [chunks ← · Ack →]* · Done ← · Good|Bad → · (Identify ← · Secret|Refused →)
/// ```
///
/// Refusals (`Reject`) are answers, not errors: a bad name, a file larger than
/// [`Config::max_size`], an existing file without `overwrite`, or a temporary file that
/// cannot be created. Messages out of order, chunks out of order or of the wrong
/// length, and a `Done` before the last chunk are errors.
#[derive(Debug)]
pub struct Receiver {
    config: Arc<Config>,
    state: State,
    out: VecDeque<Output>,
    /// The ID the last GOOD upload proved: the connection's identity when it proved
    /// one at connect, else the file's name if the file was new and not empty. Taken by
    /// the one `Identify` that may follow.
    proved_id: Option<String>,
    /// The identity the connection proved at connect (server side): it owns what it
    /// stores, and may replace only its own files (see `ownership.rs`).
    owner: Option<String>,
    /// The files stored are copies made for [`owner`](Self::owner) by a replicator
    /// (see [`set_copy_owner`](Self::set_copy_owner)): they prove no ID.
    copy: bool,
    /// Given to each temporary file (see [`TempFile::set_reaper`](super::TempFile::set_reaper)).
    reaper: Option<Reaper>,
    /// This connection's client, whose share the service's quota owner keeps (server
    /// side): offers are admitted by asking it ([`Output::Admit`]).
    quota: Option<String>,
}

impl Receiver {
    /// A receiver waiting for an offer (the server of an upload).
    pub fn new(config: Arc<Config>) -> Receiver {
        Receiver {
            config,
            state: State::AwaitOffer,
            out: VecDeque::new(),
            proved_id: None,
            owner: None,
            copy: false,
            reaper: None,
            quota: None,
        }
    }

    /// Has every offer admitted by the service's quota owner ([`Output::Admit`]),
    /// charged to `client`'s share (see [`Config::client_quota`]). Without it (the
    /// client side of a download) the receiver checks the free space alone.
    pub fn set_quota(&mut self, client: String) {
        self.quota = Some(client);
    }

    /// Stores every file as `identity`'s, replacing only files it owns unless
    /// [`Config::overwrite_others`]; `Identify` then answers for `identity` alone.
    pub fn set_owner(&mut self, identity: String) {
        self.owner = Some(identity);
    }

    /// Stores every file as a copy of `owner`'s, made by a replicator (see
    /// [`Config::replicators`]): owned by `owner`, never replacing a file, and proving
    /// no ID, so an `Identify` after it is `Refused` (the owner's secret is the owner's
    /// to ask for). The client side of a fetch gives it too, to keep a fetched copy's
    /// owner.
    pub fn set_copy_owner(&mut self, owner: String) {
        self.owner = Some(owner);
        self.copy = true;
    }

    /// Hands the temporary files this receiver abandons (a failure, a dropped receiver)
    /// to `reaper` to remove instead of removing them on the thread that drops them.
    pub fn set_reaper(&mut self, reaper: Reaper) {
        self.reaper = Some(reaper);
    }

    /// A receiver that asks for `name` hashed with `alg` (the client of a download) and
    /// stores it in `config.dir`, replacing an existing file only with `overwrite`. Its
    /// first output is the `Fetch` message.
    ///
    /// # Errors
    ///
    /// `name` is not a plain file name.
    pub fn fetch(
        config: Arc<Config>,
        name: &str,
        alg: HashAlg,
        overwrite: bool,
    ) -> Result<Receiver> {
        validate_name(name)?;
        let mut r = Receiver::new(config);
        r.out.push_back(Output::Send(Msg::Fetch {
            name: name.to_owned(),
            alg,
        }));
        r.state = State::AwaitFetched {
            name: name.to_owned(),
            alg,
            overwrite,
        };
        Ok(r)
    }

    /// Chunks consumed so far in the current transfer.
    pub fn chunks_received(&self) -> u64 {
        match &self.state {
            State::Receiving(inc) => inc.next,
            _ => 0,
        }
    }

    fn fail<T>(&mut self, e: TransferError) -> Result<T> {
        // Dropping the state drops the temporary file, which removes it.
        self.state = State::Failed;
        Err(e)
    }

    fn reject(&mut self, reason: RejectReason) {
        self.out.push_back(Output::Send(Msg::Reject {
            reason: reason.clone(),
        }));
        self.out
            .push_back(Output::Finished(Outcome::Rejected(reason)));
        self.state = State::Finished {
            may_identify: false,
        };
    }
}

#[cfg(test)]
mod tests;
