//! A hook between a verified upload's commit and its GOOD: where a cluster's servers
//! record their copy in the file catalog (rdmactor-cluster's `CatalogRecorder`).
//!
//! Why here, and not in the client: a catalog that clients write lets any client
//! record files on nodes that never stored them, or rewrite other people's records
//! (issue 47). When each server records the copy it has just verified and made
//! durable, before its client hears GOOD, a file is acknowledged only once a server
//! has recorded it, and clients need no write access to the catalog at all.

use std::fmt;

use super::wire::Digest;

/// A copy the service has verified and made durable under its final name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCopy {
    /// The file's name in the store.
    pub name: String,
    /// Its length in bytes.
    pub len: u64,
    /// The digest it was verified against.
    pub digest: Digest,
    /// The identity that uploaded it, if it proved one at connect.
    pub owner: Option<String>,
    /// Whether the upload replaced a file of the same name.
    pub overwrite: bool,
    /// A replicator's copy made for [`owner`](Self::owner) (`OfferFor`): it fills a gap
    /// in a file already recorded, and must not bring back a record its owner deleted
    /// meanwhile.
    pub replica: bool,
}

/// Told of each upload the service verified and stored, before the client hears the
/// verdict (see the module docs).
pub trait Recorder: Send + Sync + fmt::Debug + 'static {
    /// Asked before `copy` takes its final name (on the blocking pool too): a refusal
    /// leaves the name as it was, which [`record`](Self::record)'s cannot do for a file
    /// that replaced another. The default lets every copy through.
    ///
    /// # Errors
    ///
    /// Why the copy must not be stored: the client gets BAD with this reason.
    fn admit(&self, copy: &StoredCopy) -> Result<(), String> {
        let _ = copy;
        Ok(())
    }

    /// Records `copy`. Runs on the service's blocking pool, so it may wait (on etcd,
    /// say), but every second it takes is a second the client waits for its verdict.
    ///
    /// # Errors
    ///
    /// Why the copy cannot be recorded (the name is taken by other bytes, the catalog
    /// cannot be reached, ...): the client gets BAD with this reason, and a new file
    /// is removed again. A file that replaced another ([`StoredCopy::overwrite`]) stays:
    /// the old bytes are gone by then, and the new ones were verified.
    fn record(&self, copy: &StoredCopy) -> Result<(), String>;

    /// Asked before the file `name`, owned by `owner` (its owner attribute), is
    /// removed at a client's `Delete`, after the service checked that the client may:
    /// a cluster's catalog forgets the file first, so that no record ever names bytes
    /// that are gone. The default forgets nothing.
    ///
    /// # Errors
    ///
    /// Why the file must stay (the catalog cannot be reached, its record names
    /// another owner): the client gets the reason, and the file is kept.
    fn forget(&self, name: &str, owner: Option<&str>) -> Result<(), String> {
        let _ = (name, owner);
        Ok(())
    }
}
