//! What a file-transfer state machine hands its driver: the actions ([`Output`]), the
//! chunk WRITEs among them, and how a transfer ended ([`Outcome`]). The bottom of the
//! machines: the sender and the receiver build these, and the [`Endpoint`] trait, which
//! names both machines, returns them.
//!
//! [`Endpoint`]: super::Endpoint

use std::ops::Range;
use std::path::PathBuf;

use super::error::TransferError;
use super::wire::{BadReason, Digest, Msg, RejectReason, RemoteWindow, SecretKey};

/// One RDMA WRITE_WITH_IMM the sender's driver must post: fill staging bytes
/// [`range`](Self::range) with [`Endpoint::fill_chunk`](super::Endpoint::fill_chunk), then
/// write them to [`remote`](Self::remote) with immediate [`imm`](Self::imm). The staging
/// buffer and the window have the same layout, so the offset is the same in both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkWrite {
    /// Chunk index (0, 1, 2, ...), also the immediate value.
    pub index: u32,
    /// Slot of the window (and of the staging buffer): `index % slots`.
    pub slot: u32,
    /// Byte offset of that slot: `slot * slot_len`.
    pub offset: u64,
    /// Bytes in this chunk (`slot_len`, or less for the last chunk).
    pub len: u32,
    /// The exact remote destination (`len` bytes at `offset` into the window).
    pub remote: RemoteWindow,
}

impl ChunkWrite {
    /// The immediate value to send with the WRITE: the chunk index.
    pub fn imm(&self) -> u32 {
        self.index
    }

    /// The chunk's bytes within the staging buffer.
    pub fn range(&self) -> Range<usize> {
        let start = self.offset as usize;
        start..start + self.len as usize
    }
}

/// The receiver's answer to an [`Msg::Identify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// The key configured for the ID.
    Secret(SecretKey),
    /// The ID is unknown.
    Refused,
}

/// How a transfer ended, as seen from one side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Receiver: the digest matched, the file is durably in place, GOOD was sent.
    Stored {
        /// Final path.
        path: PathBuf,
        /// Bytes.
        len: u64,
        /// The verified digest.
        digest: Digest,
    },
    /// Sender: the receiver answered GOOD, and then (if the sender identified itself)
    /// answered the identification.
    Delivered {
        /// The answer to `Identify`, if one was sent.
        auth: Option<Auth>,
    },
    /// Both: BAD was sent or received; nothing was stored.
    Bad(BadReason),
    /// Both: the offer or fetch was refused; nothing was transferred.
    Rejected(RejectReason),
    /// Both: the transfer was ended midway ([`Msg::Abort`], sent or
    /// received) for this reason; nothing was stored, the connection stays usable.
    Aborted(RejectReason),
    /// Both: a [`Msg::Stat`] was answered: the server holds a file of
    /// `len` bytes with `digest` under the name. Nothing moved.
    Held {
        /// Bytes.
        len: u64,
        /// The file's digest.
        digest: Digest,
    },
    /// Both: a [`Msg::Delete`] was carried out: the file is gone.
    Deleted,
}

/// An action for the driver, from [`Endpoint::poll_output`](super::Endpoint::poll_output).
/// Which side emits what:
///
/// | output | receiver | sender |
/// |---|---|---|
/// | [`Send`](Self::Send) | yes | yes |
/// | [`GrantWindow`](Self::GrantWindow), [`Revoke`](Self::Revoke), [`Consume`](Self::Consume), [`Commit`](Self::Commit) | yes | |
/// | [`Prepare`](Self::Prepare) | (the server, before it becomes a sender) | |
/// | [`Admit`](Self::Admit) | (the server, when its service keeps quotas) | |
/// | [`Stage`](Self::Stage), [`WriteChunk`](Self::WriteChunk) | | yes |
/// | [`Finished`](Self::Finished) | yes | yes |
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Send this message (postcard: [`Msg::encode`]).
    Send(Msg),
    /// Register a window of `len` bytes with REMOTE_WRITE access (nothing more), then call
    /// [`Endpoint::handle_window`](super::Endpoint::handle_window) with its address, length
    /// and rkey.
    GrantWindow {
        /// Exactly `slots * slot_len`.
        len: u64,
    },
    /// Deregister the window: every chunk is in, no WRITE may land any more.
    Revoke,
    /// Get a local staging buffer of `len` bytes (the window's size) for the chunk
    /// WRITEs that follow. Keep it until [`Finished`](Self::Finished) and until every
    /// WRITE completed.
    Stage {
        /// Bytes.
        len: u64,
    },
    /// Fill and post one chunk (see [`ChunkWrite`]); report its completion with
    /// [`Endpoint::handle_write_done`](super::Endpoint::handle_write_done).
    WriteChunk(ChunkWrite),
    /// The file checked out: take it with
    /// [`Endpoint::take_commit`](super::Endpoint::take_commit), run
    /// [`TempFile::commit`](super::TempFile::commit) (fsync, rename, fsync of the
    /// directory) off the thread that serves the connection, and hand the result to
    /// [`Endpoint::handle_committed`](super::Endpoint::handle_committed). The verdict
    /// (GOOD, or BAD with `NotStored`) follows from it.
    Commit,
    /// Received chunks wait to be hashed and appended: take them with
    /// [`Endpoint::take_consume`](super::Endpoint::take_consume), run
    /// [`ConsumeJob::run`](super::receiver::ConsumeJob::run) off the thread that serves the
    /// connection, and hand the result to
    /// [`Endpoint::handle_consumed`](super::Endpoint::handle_consumed). Acks for their
    /// slots, and the verdict after `Done`, follow from it. At most one job is out at a
    /// time.
    Consume,
    /// A `Fetch` was asked for: take the job with
    /// [`Endpoint::take_prepare`](super::Endpoint::take_prepare), run
    /// [`PrepareFetch::run`](super::PrepareFetch::run) (open the file and find its digest:
    /// known, or by hashing all of it) off the thread that serves the connection, and hand
    /// the result to [`Endpoint::handle_prepared`](super::Endpoint::handle_prepared). The
    /// offer (or the refusal) follows from it.
    Prepare,
    /// A `Delete` was allowed: take the job with
    /// [`Endpoint::take_delete`](super::Endpoint::take_delete), run
    /// [`DeleteJob::run`](super::DeleteJob::run) (the owner checked on the open file, the
    /// recorder told, the name removed) off the thread that serves the connection, and hand
    /// the result to [`Endpoint::handle_deleted`](super::Endpoint::handle_deleted). The
    /// answer follows from it.
    Delete,
    /// An offer passed the checks a connection can make alone: ask the service's
    /// [`QuotaOwner`](super::QuotaOwner) to admit it ([`Admit`](super::Admit) with these
    /// fields) and hand its answer to
    /// [`Endpoint::handle_admitted`](super::Endpoint::handle_admitted). The grant (or the
    /// refusal) follows from it.
    Admit {
        /// The client whose share the upload counts against.
        client: String,
        /// The offered length.
        len: u64,
        /// What the file system reported free when the offer came.
        free: u64,
    },
    /// The transfer is over (a receiver may still answer one `Identify` after
    /// [`Outcome::Stored`]).
    Finished(Outcome),
}

/// The error for `what` arriving while a machine is in `state`, which does not take it.
pub(crate) fn unexpected_in(state: &'static str, what: String) -> TransferError {
    TransferError::Unexpected { what, state }
}
