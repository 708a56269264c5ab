//! What the driver needs from the `files` service of one node: upload, fetch, and ask
//! what a node holds. The answers the rules act on are told apart by type, not by
//! words: a name already taken on the node (`Exists`) is a replica the record may have
//! lost track of, or other bytes to pass over, and a file larger than allowed is
//! refused before its bytes move.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;

use super::plan::Verified;

/// Why a transfer with one node failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransferError {
    /// The destination holds a file of that name already (nothing was replaced).
    #[error("a file of that name exists")]
    Exists,
    /// The node holds no file of that name (or none this client may read).
    #[error("no such file")]
    NotFound,
    /// The file is larger than the fetch allows; refused on its announced size, before
    /// its bytes moved.
    #[error("the file is larger than the {max} bytes allowed")]
    TooLarge {
        /// The limit.
        max: u64,
    },
    /// Anything else (refused for another reason, BAD, aborted, connection lost), in
    /// words.
    #[error("{0}")]
    Failed(String),
}

/// How an upload stores its file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Upload<'a> {
    /// A replicator's copy of this identity's file, stored as its (the `files`
    /// service's `OfferFor`); without it, the file is the uploader's own.
    pub copy_for: Option<&'a str>,
    /// Replace a file of that name (the uploader's own: its owner's overwrite).
    pub overwrite: bool,
}

/// Moves one file to or from one node, verified by its server: the `files` service
/// over RDMA ([`RdmaFiles`](super::RdmaFiles)), or a test's fake.
pub trait FileTransfer {
    /// Uploads the local file `path` as `name` to the node at `addr`, as `how` says;
    /// returns what the node verified (it answered GOOD), or why not.
    fn upload(
        &self,
        addr: SocketAddr,
        path: &Path,
        name: &str,
        how: Upload<'_>,
    ) -> impl Future<Output = Result<Verified, TransferError>>;
    /// Fetches `name` from the node at `addr` into `dir/name`, unless the node
    /// announces more than `max_size` bytes; returns what was verified on arrival, or
    /// why not (then no file is left, and an existing `dir/name` is kept:
    /// [`TransferError::Exists`]). With `copy_for`, the file is stored as that
    /// identity's (a repair fetching into its own store keeps the file's owner).
    fn fetch(
        &self,
        addr: SocketAddr,
        name: &str,
        dir: &Path,
        max_size: u64,
        copy_for: Option<&str>,
    ) -> impl Future<Output = Result<Verified, TransferError>>;
    /// Asks the node at `addr` to remove its copy of `name` (its server allows the
    /// file's owner alone); [`TransferError::NotFound`] for no such file or another's.
    fn delete(
        &self,
        addr: SocketAddr,
        name: &str,
    ) -> impl Future<Output = Result<(), TransferError>>;
    /// What the node at `addr` holds under `name` (its digest with the algorithm the
    /// catalog records), without moving it; [`TransferError::NotFound`] if nothing.
    fn stat(
        &self,
        addr: SocketAddr,
        name: &str,
    ) -> impl Future<Output = Result<Verified, TransferError>>;
    /// [`stat`](Self::stat) of each of `names` on the node at `addr`, answers in the
    /// same order. A scrub asks a node about many files at once: one after another by
    /// default, on one connection over RDMA (a connection and its handshake per file
    /// made a scrub round of 64 questions take minutes under emulation).
    fn stat_many(
        &self,
        addr: SocketAddr,
        names: &[String],
    ) -> impl Future<Output = Vec<Result<Verified, TransferError>>> {
        async move {
            let mut answers = Vec::with_capacity(names.len());
            for name in names {
                answers.push(self.stat(addr, name).await);
            }
            answers
        }
    }
}
