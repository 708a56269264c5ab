//! What every file-transfer state machine has in common: the inputs a driver feeds in
//! ([`Endpoint`]'s `handle_*` methods) and the actions it gets back ([`Output`]).

use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::digests::DigestCache;
use super::error::{Result, TransferError};
use super::file_key::FileKey;
use super::quota::PreparationLimit;
use super::sender::{hashed, open_fetched, unavailable, Sender};
use super::store::{StoreError, TempFile};
use super::wire::{BadReason, Digest, FileOffer, Msg, RejectReason, RemoteWindow, SecretKey};

/// One RDMA WRITE_WITH_IMM the sender's driver must post: fill staging bytes
/// [`range`](Self::range) with [`Endpoint::fill_chunk`], then write them to
/// [`remote`](Self::remote) with immediate [`imm`](Self::imm). The staging buffer and
/// the window have the same layout, so the offset is the same in both.
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
    /// Both: the transfer was ended midway ([`Msg::Abort`](super::Msg::Abort), sent or
    /// received) for this reason; nothing was stored, the connection stays usable.
    Aborted(RejectReason),
    /// Both: a [`Msg::Stat`](super::Msg::Stat) was answered: the server holds a file of
    /// `len` bytes with `digest` under the name. Nothing moved.
    Held {
        /// Bytes.
        len: u64,
        /// The file's digest.
        digest: Digest,
    },
    /// Both: a [`Msg::Delete`](super::Msg::Delete) was carried out: the file is gone.
    Deleted,
}

/// An action for the driver, from [`Endpoint::poll_output`]. Which side emits what:
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
    /// Register a window of `len` bytes with REMOTE_WRITE access (nothing more), then
    /// call [`Endpoint::handle_window`] with its address, length and rkey.
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
    /// [`Endpoint::handle_write_done`].
    WriteChunk(ChunkWrite),
    /// The file checked out: take it with [`Endpoint::take_commit`], run
    /// [`TempFile::commit`] (fsync, rename, fsync of the directory) off the thread that
    /// serves the connection, and hand the result to [`Endpoint::handle_committed`]. The
    /// verdict (GOOD, or BAD with `NotStored`) follows from it.
    Commit,
    /// Received chunks wait to be hashed and appended: take them with
    /// [`Endpoint::take_consume`], run [`ConsumeJob::run`](super::receiver::ConsumeJob::run)
    /// off the thread that serves the connection, and hand the result to
    /// [`Endpoint::handle_consumed`]. Acks for their slots, and the verdict after `Done`,
    /// follow from it. At most one job is out at a time.
    Consume,
    /// A `Fetch` was asked for: take the job with [`Endpoint::take_prepare`], run
    /// [`PrepareFetch::run`] (open the file and find its digest: known, or by hashing
    /// all of it) off the thread that serves
    /// the connection, and hand the result to [`Endpoint::handle_prepared`]. The offer
    /// (or the refusal) follows from it.
    Prepare,
    /// A `Delete` was allowed: take the job with [`Endpoint::take_delete`], run
    /// [`DeleteJob::run`](super::DeleteJob::run) (the owner checked on the open file,
    /// the recorder told, the name removed) off the thread that serves the connection,
    /// and hand the result to [`Endpoint::handle_deleted`]. The answer follows from it.
    Delete,
    /// An offer passed the checks a connection can make alone: ask the service's
    /// [`QuotaOwner`](super::QuotaOwner) to admit it ([`Admit`](super::Admit) with these
    /// fields) and hand its answer to [`Endpoint::handle_admitted`]. The grant (or the
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

/// A file-transfer state machine: [`Sender`](super::Sender),
/// [`Receiver`](super::Receiver), or the [`Server`](super::Server) that plays either.
///
/// # Driving order
///
/// After creating one, and after **every** `handle_*`/`fill_chunk` call, call
/// [`poll_output`](Self::poll_output) until it returns `None` and carry out each
/// [`Output`] in that order (posting in order matters: a `Done` follows the last chunk
/// WRITE on the queue pair, and RC delivers them in that order). Then feed in events:
///
/// * a control message → [`handle_msg`](Self::handle_msg) with [`Msg::decode`] of it;
/// * a WRITE_WITH_IMM arrival with immediate `i` (receiver) → bytes
///   [`chunk_range(i)`](Self::chunk_range) of the window to
///   [`handle_chunk(i, ..)`](Self::handle_chunk);
/// * the window registered after [`Output::GrantWindow`] (receiver) →
///   [`handle_window`](Self::handle_window), before polling on;
/// * [`Output::WriteChunk`] (sender) → [`fill_chunk`](Self::fill_chunk) into the
///   staging bytes at [`ChunkWrite::range`], then post the WRITE;
/// * that WRITE's completion (sender) → [`handle_write_done`](Self::handle_write_done).
///
/// Every `Err` ends the transfer: the driver should end the connection with the error's
/// text and drop the state machine (which fails any later call it gets). Dropping a
/// state machine mid-transfer removes any partial file. Inputs meant for the other
/// role fail with [`TransferError::Unexpected`].
pub trait Endpoint {
    /// Where the state machine is, in words (used in errors).
    fn state_name(&self) -> &'static str;

    /// A control message from the peer.
    ///
    /// # Errors
    ///
    /// The message is not allowed in this state, or it is inconsistent.
    fn handle_msg(&mut self, msg: Msg) -> Result<()>;

    /// The next action for the driver.
    #[must_use]
    fn poll_output(&mut self) -> Option<Output>;

    /// True when no transfer is in progress (none started, or the last one finished).
    fn is_finished(&self) -> bool;

    /// True while the transfer waits on the peer (its grant, chunks, acknowledgements,
    /// verdict, or the Abort that answers ours) rather than on nothing: the span a
    /// stall deadline measures. The driver knows about its own jobs (hashing,
    /// appending, reading) and does not count the time they take against the peer.
    fn waits_on_peer(&self) -> bool {
        false
    }

    /// The peer stayed silent past the driver's deadline while
    /// [`waits_on_peer`](Self::waits_on_peer): end the transfer now, without waiting
    /// on the peer for anything more. The peer is told why ([`Msg::Abort`] with
    /// `reason`, read if it is alive but slow or paused), the window (if any) is
    /// revoked at once rather than after the sender's `Done`, the pending chunks are
    /// dropped, and [`Outcome::Aborted`] finishes it; what the transfer held (its
    /// temporary file, quota share and reserved space) goes with it. A peer that
    /// carries on afterwards meets a dead rkey or an unexpected-message error, which
    /// ends its connection. Does nothing when not waiting on the peer.
    fn give_up(&mut self, reason: RejectReason) {
        let _ = reason;
    }

    /// One of this transfer's own jobs (a chunk's read or its consumption) could not
    /// run: the server refused it (`BlockingError::Busy`, the connection's blocking
    /// work at its bound). End the transfer now as [`give_up`](Self::give_up) does,
    /// telling the peer `reason`, whether or not it waits on the peer; the connection
    /// goes on. Does nothing once the transfer ended.
    fn handle_job_refused(&mut self, reason: RejectReason) {
        self.give_up(reason);
    }

    /// Sender: true once no more chunks may be posted (the transfer aborted or
    /// ended). A driver checks it after [`fill_chunk`](Self::fill_chunk) and
    /// [`handle_read`](Self::handle_read): a read that failed aborts the transfer, and
    /// its chunk must not be sent.
    fn stopped_sending(&self) -> bool {
        self.is_finished()
    }

    /// Receiver: where chunk `index` is in the window.
    ///
    /// # Errors
    ///
    /// No window, or no such chunk.
    fn chunk_range(&self, index: u32) -> Result<Range<usize>> {
        Err(unexpected(self, format!("chunk {index}")))
    }

    /// Receiver: chunk `index` landed; `bytes` are its bytes in the window.
    ///
    /// # Errors
    ///
    /// Out of order, wrong length, not receiving, or the temporary file failed.
    fn handle_chunk(&mut self, index: u32, bytes: &[u8]) -> Result<()> {
        let _ = bytes;
        Err(unexpected(self, format!("chunk {index}")))
    }

    /// Receiver: the window asked for by [`Output::GrantWindow`] is registered.
    ///
    /// # Errors
    ///
    /// Not asked for, or the wrong length.
    fn handle_window(&mut self, region: RemoteWindow) -> Result<()> {
        let _ = region;
        Err(unexpected(self, "window registration".into()))
    }

    /// Receiver: the window asked for by [`Output::GrantWindow`] could not be registered
    /// (the pool's cap, a memlock limit). The offer is rejected with
    /// [`RejectReason::Unavailable`] naming `reason`, before any data moved, and nothing
    /// of it is kept (its temporary file, its reservation and its quota share go).
    ///
    /// # Errors
    ///
    /// Not asked for a window.
    fn window_refused(&mut self, reason: String) -> Result<()> {
        let _ = reason;
        Err(unexpected(self, "window refusal".into()))
    }

    /// Sender: copy the bytes of `chunk` into `dst` (its [`ChunkWrite::range`] of the
    /// staging buffer).
    ///
    /// # Errors
    ///
    /// Not the next chunk, a `dst` of the wrong length, or the source failed.
    fn fill_chunk(&mut self, chunk: &ChunkWrite, dst: &mut [u8]) -> Result<()> {
        let _ = dst;
        Err(unexpected(self, format!("fill of chunk {}", chunk.index)))
    }

    /// Sender: the chunk of an [`Output::WriteChunk`] to read off the thread that serves
    /// the connection, instead of [`fill_chunk`](Self::fill_chunk). One at a time; the
    /// outputs after the `WriteChunk` wait for [`handle_read`](Self::handle_read).
    ///
    /// # Errors
    ///
    /// Not the next chunk, or a read is out already.
    fn take_read(&mut self, chunk: &ChunkWrite) -> Result<super::sender::ReadJob> {
        Err(unexpected(self, format!("read of chunk {}", chunk.index)))
    }

    /// Sender: what a `ReadJob` read; returns the chunk's
    /// bytes, to copy into its [`ChunkWrite::range`] of the staging buffer and post.
    ///
    /// # Errors
    ///
    /// The source failed or was short, or a read that was not handed out.
    fn handle_read(&mut self, read: super::sender::ChunkRead) -> Result<Vec<u8>> {
        let _ = read;
        Err(unexpected(self, "a chunk read".into()))
    }

    /// Sender: the WRITE of chunk `index` completed locally.
    ///
    /// # Errors
    ///
    /// No such WRITE in flight.
    fn handle_write_done(&mut self, index: u32) -> Result<()> {
        Err(unexpected(self, format!("completion of chunk {index}")))
    }

    /// The chunks to consume, after [`Output::Consume`].
    fn take_consume(&mut self) -> Option<super::receiver::ConsumeJob> {
        None
    }

    /// What a [`super::receiver::ConsumeJob`] did.
    fn handle_consumed(&mut self, consumed: super::receiver::Consumed) -> Result<()> {
        let _ = consumed;
        Err(unexpected(self, "consumed chunks".into()))
    }

    /// Receiver: the service's answer to [`Output::Admit`].
    fn handle_admitted(
        &mut self,
        _answer: std::result::Result<super::Admission, super::wire::RejectReason>,
    ) -> Result<()> {
        Err(unexpected(self, "an admission".into()))
    }

    /// The fetch to prepare, after [`Output::Prepare`] (once).
    fn take_prepare(&mut self) -> Option<PrepareFetch> {
        None
    }

    /// How the preparation asked for by [`Output::Prepare`] ended.
    fn handle_prepared(
        &mut self,
        result: std::result::Result<super::sender::Sender, super::wire::RejectReason>,
    ) -> Result<()> {
        let _ = result;
        Err(unexpected(self, "a prepared fetch".into()))
    }

    /// The removal to run, after [`Output::Delete`] (once).
    fn take_delete(&mut self) -> Option<super::DeleteJob> {
        None
    }

    /// How the removal asked for by [`Output::Delete`] ended.
    fn handle_deleted(
        &mut self,
        result: std::result::Result<(), super::wire::RejectReason>,
    ) -> Result<()> {
        let _ = result;
        Err(unexpected(self, "a deletion".into()))
    }

    /// The verified temporary file to commit, after [`Output::Commit`] (once).
    fn take_commit(&mut self) -> Option<TempFile> {
        None
    }

    /// The copy a successful commit asked for by [`Output::Commit`] stores (`None`
    /// when its hash did not match: the commit only removes it), for a
    /// [`Recorder`](super::Recorder).
    fn commit_copy(&self) -> Option<super::StoredCopy> {
        None
    }

    /// How the commit asked for by [`Output::Commit`] ended.
    fn handle_committed(&mut self, result: std::result::Result<PathBuf, StoreError>) -> Result<()> {
        let _ = result;
        Err(unexpected(self, "a commit result".into()))
    }
}

/// The error for `what` arriving while `ep` is in a state that does not take it.
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
    pub alg: super::wire::HashAlg,
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
    pub fn new(dir: PathBuf, name: String, alg: super::wire::HashAlg) -> PrepareFetch {
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

pub(crate) fn unexpected<E: Endpoint + ?Sized>(ep: &E, what: String) -> TransferError {
    TransferError::Unexpected {
        what,
        state: ep.state_name(),
    }
}
