//! The blocking part of serving a `Fetch` (see [`PrepareFetch`]).

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::digests::DigestCache;
use super::file_key::FileKey;
use super::quota::PreparationLimit;
use super::sender::{hashed, open_fetched, unavailable, Sender};
use super::wire::{FileOffer, HashAlg, RejectReason};

/// The blocking part of serving a `Fetch`: open the file and find its digest, in the
/// service's [`DigestCache`] if it knows the file as it is now, else by hashing all of
/// it (under one of its client's [`PreparationPermit`](super::PreparationPermit)s).
#[derive(Debug, Clone)]
pub struct PrepareFetch {
    /// The served directory.
    pub dir: PathBuf,
    /// The name asked for (checked by `run`).
    pub name: String,
    /// The hash asked for.
    pub alg: HashAlg,
    /// Where known digests are looked up and new ones stored; `None` hashes every time.
    pub digests: Option<Arc<DigestCache>>,
    /// The fetching client's share of preparations, and the client; `None` is
    /// unlimited.
    pub limit: Option<(Arc<PreparationLimit>, String)>,
    /// Serve the file only if this identity owns it (see `ownership.rs`); any other
    /// file is `NotFound`, as a missing one, so that a fetch learns nothing of others'
    /// files. `None`: no owner asked for.
    pub owner: Option<String>,
}

impl PrepareFetch {
    /// A job for `name` in `dir` hashed with `alg`, without a digest store or a limit.
    pub fn new(dir: PathBuf, name: String, alg: HashAlg) -> PrepareFetch {
        PrepareFetch {
            dir,
            name,
            alg,
            digests: None,
            limit: None,
            owner: None,
        }
    }

    /// Opens the file and finds its digest: the sender that serves it, or why not.
    /// Blocks (reads the whole file unless its digest is known).
    ///
    /// # Errors
    ///
    /// The reason to send back in a `Reject` (see [`Sender::for_fetch`]), and
    /// [`RejectReason::Quota`] when the file must be hashed and its client has as many
    /// preparations running as it may.
    pub fn run(self) -> std::result::Result<Sender, RejectReason> {
        self.run_cancellable(&AtomicBool::new(false))
    }

    /// [`run`](Self::run) that gives up as soon as `cancel` is set (the driver sets it
    /// when the connection closes).
    ///
    /// The digest found describes the bytes the sender will read only as far as the
    /// key can tell (see [`DigestCache`]): a hit is taken on the open file's `fstat`,
    /// and a hash is stored only if the file's key after hashing is the one before,
    /// so a file written to while it was hashed is not remembered.
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run), and `Unavailable` once cancelled.
    pub fn run_cancellable(self, cancel: &AtomicBool) -> std::result::Result<Sender, RejectReason> {
        let file = open_fetched(&self.dir, &self.name)?;
        if let Some(who) = &self.owner {
            // An attribute we cannot read is no proof of ownership either.
            let owner = super::ownership::owner_of(&file).ok().flatten();
            if owner.as_deref() != Some(who.as_str()) {
                return Err(RejectReason::NotFound);
            }
        }
        // The key, if the file system tells: without one, the file is just hashed.
        let key = file.metadata().ok().map(|m| FileKey::of(&m));
        if let (Some(cache), Some(key)) = (&self.digests, key) {
            if let Some(digest) = cache.get(&key, self.alg) {
                rdmactor::metrics::file_fetch_digest(true);
                let offer = FileOffer {
                    name: self.name,
                    len: key.len,
                    digest,
                    overwrite: false,
                };
                return Ok(Sender::for_fetched(offer, file)?.with_fetched_key(key));
            }
        }
        let _permit = match &self.limit {
            Some((limit, client)) => Some(limit.try_acquire(client)?),
            None => None,
        };
        if let Some(cache) = &self.digests {
            cache.note_hashed();
        }
        rdmactor::metrics::file_fetch_digest(false);
        let (file, offer) =
            hashed(file, &self.name, self.alg, false, cancel).map_err(unavailable)?;
        let after = file.metadata().ok().map(|m| FileKey::of(&m));
        let digest = offer.digest;
        let unchanged = key.filter(|k| after == Some(*k) && offer.len == k.len);
        let mut sender = Sender::for_fetched(offer, file)?;
        if let (Some(cache), Some(key)) = (&self.digests, unchanged) {
            cache.insert(key, digest);
            sender = sender.with_fetched_key(key);
        }
        Ok(sender)
    }
}
