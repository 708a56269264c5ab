//! The `files` service: drives one [`Server`] state machine per connection over
//! rdmactor, in a [`MachineSession`]. The state machine decides; this driver only turns
//! its [`Output`]s into verbs work (register, send, post
//! WRITE_WITH_IMM, deregister) and feeds events back.
//!
//! Buffers, per connection and per transfer:
//!
//! * the **window** of an upload: registered with REMOTE_WRITE only when the receiver
//!   asks for it, and freed (deregistered, so its rkey is dead) on
//!   [`Output::Revoke`], before the verdict goes out;
//! * the **staging buffer** of a download: registered without remote access (the NIC
//!   only reads it), freed when the transfer finishes; the framework keeps it until the
//!   WRITEs still reading it complete.
//!
//! Both are registered rather than leased from the connection pool: a window of
//! `slots × slot_len` is larger than the pool's largest class by default, and a
//! registration per transfer costs little next to a file.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Addr, Recipient};
use rdmactor::runtime::{
    Asked, Blocking, BlockingError, BufId, CloseReason, Driver, Flow, Held, Incoming, MachineCx,
    MachineSession, PeerInfo, Service, Session, SessionError, StateMachine,
};
use rdmactor::transport::Transport;

use super::config::Config;
use super::digests::{DigestCache, DigestStats};
use super::endpoint::Endpoint;
use super::error::{Result, TransferError};
use super::file_key::FileKey;
use super::output::{ChunkWrite, Output};
use super::owner::{Admission, Admit, QuotaOwner};
use super::quota::PreparationLimit;
use super::receiver::Consumed;
use super::recorder::Recorder;
use super::sender::ChunkRead;
use super::server::Server;
use super::store::{Reaper, StoreError};
use super::wire::{Msg, RejectReason};
use rdmactor::shared::Owner;

mod carry;
mod stall;

/// The file-transfer service (register it as `files`): uploads into
/// [`Config::dir`], downloads from it, and `Identify` answered from
/// [`Config::secrets`]. See the [module docs](super) for the protocol.
///
/// Blocking file work stays off the connection's poller thread (which serves many
/// connections): the whole-file hash of a `Fetch` and the fsync and rename that end an
/// upload run on the runtime's blocking pool (`SessionCx::spawn_blocking`), and the
/// offer or verdict goes out when they are done. So do hashing and appending received
/// chunks: each chunk is copied out of the window on the poller thread (a memcpy) and
/// consumed by a job, one at a time per transfer; a slot is acked once its chunk is
/// consumed, which bounds what waits to the window. The temporary file of an upload
/// whose hash did not match is removed by the commit job, before BAD goes out; one
/// abandoned otherwise (an error, a closed connection) goes to the service's
/// `Reaper` thread. A download's chunks are read from the file on the blocking pool
/// too, one at a time, and copied into the staging buffer and posted when read.
///
/// A `Fetch` reads its file whole only when the service does not know its digest
/// already: digests verified by uploads and computed for earlier fetches are kept in a
/// [`DigestCache`] ([`Config::digest_cache`]) under the file's identity and times, and
/// each client may have at most [`Config::fetch_preparations`] files being hashed at
/// once ([`PreparationLimit`]), so that asking for large files over many connections
/// does not turn a few bytes of request into whole-disk reads that fill the blocking
/// pool.
#[derive(Debug, Clone)]
pub struct FileTransfer {
    config: Arc<Config>,
    /// Removes the temporary files of failed or abandoned uploads off the poller.
    reaper: Reaper,
    /// Owns every client's share of uploads and reserved bytes, and the bytes promised
    /// to admitted uploads: sessions ask it once per offer.
    owner: Owner<QuotaOwner>,
    /// Uploads admitted now, as the owner last published them.
    uploads: Arc<AtomicU64>,
    /// Set by [`FileTransfer::refuse_new_transfers`]: offers and fetches are answered
    /// with [`RejectReason::ShuttingDown`].
    draining: Arc<AtomicBool>,
    /// Digests of stored and served files, shared by every connection.
    digests: Arc<DigestCache>,
    /// Fetches being hashed, per client, over every connection.
    preparations: Arc<PreparationLimit>,
}

impl FileTransfer {
    /// The service over `config`, checked once here so that no connection meets a bad
    /// geometry or a missing directory later.
    ///
    /// # Errors
    ///
    /// [`TransferError::Invalid`] for a bad window geometry or a `dir` that is not a
    /// directory; [`TransferError::Store`] if leftover temporary files cannot be
    /// removed.
    ///
    /// Removes the temporary files an earlier server left after a crash
    /// ([`sweep_temp_files`](super::store::sweep_temp_files)), so create the service
    /// before any other process uses the directory for transfers.
    pub fn new(config: Config) -> Result<FileTransfer> {
        config.validate()?;
        if !config.dir.is_dir() {
            return Err(TransferError::Invalid(format!(
                "{} is not a directory",
                config.dir.display()
            )));
        }
        let swept = super::store::sweep_temp_files(&config.dir)?;
        if swept > 0 {
            tracing::info!(dir = %config.dir.display(), swept, "removed temporary files left by a crash");
        }
        let reaper = Reaper::start().map_err(|source| StoreError::Io {
            op: "spawn the temporary-file reaper for",
            path: config.dir.clone(),
            source,
        })?;
        Ok(FileTransfer {
            owner: Owner::new(),
            uploads: Arc::new(AtomicU64::new(0)),
            draining: Arc::new(AtomicBool::new(false)),
            digests: Arc::new(DigestCache::new(config.digest_cache)),
            preparations: PreparationLimit::new(config.fetch_preparations),
            config: Arc::new(config),
            reaper,
        })
    }

    /// The settings every connection uses.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The actor that owns every client's admitted uploads and reserved bytes (ask it
    /// [`Usage`](super::Usage)); `None` until the first connection.
    pub fn quota_owner(&self) -> Option<Addr<QuotaOwner>> {
        self.owner.get()
    }

    /// From now on every new offer and fetch, on every connection (clones of this
    /// service included), is refused with [`RejectReason::ShuttingDown`], while the
    /// transfers under way go on: call it when shutdown begins, wait for
    /// [`uploads_in_flight`](Self::uploads_in_flight) to reach 0 (or a deadline), then
    /// shut the server down, so that clients hear why instead of losing their
    /// connection mid-file.
    pub fn refuse_new_transfers(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Uploads admitted and not yet stored or ended, over every connection.
    pub fn uploads_in_flight(&self) -> u64 {
        self.uploads.load(Ordering::Relaxed)
    }

    /// Whole files read to hash them for a fetch, over every connection since the
    /// service started: fetches of files whose digest was known are not counted.
    pub fn files_hashed(&self) -> u64 {
        self.digests.stats().hashed
    }

    /// What the store of known digests did so far.
    pub fn digest_stats(&self) -> DigestStats {
        self.digests.stats()
    }
}

impl<T: Transport> Service<T> for FileTransfer {
    fn max_message(&self) -> Option<usize> {
        Some(crate::CONTROL_MESSAGE_MAX)
    }

    fn session(&self, peer: &PeerInfo) -> Box<dyn Session<T>> {
        // Quotas are per identity when the client proved one, else per client host:
        // its connections share one share. (An identity name holds no space, so the
        // two kinds of key never meet.)
        let identity = peer.identity.name().map(str::to_owned);
        let client = match &identity {
            Some(who) => format!("identity {who}"),
            None => peer
                .addr
                .map_or_else(|| format!("qp {}", peer.qp_num), |a| a.ip().to_string()),
        };
        let owner = self.owner.get_or_start(|| {
            QuotaOwner::new(self.config.client_quota, Arc::clone(&self.uploads))
                .with_max_uploads(u64::from(self.config.max_uploads))
        });
        let mut server = Server::new(Arc::clone(&self.config));
        if let Some(who) = identity {
            server = server.with_identity(who);
        }
        let server = server
            .with_reaper(self.reaper.clone())
            .with_quota(client)
            .with_drain_flag(Arc::clone(&self.draining))
            .with_digests(Arc::clone(&self.digests))
            .with_preparation_limit(Arc::clone(&self.preparations));
        let driver = FileSession {
            quota: owner.recipient(),
            admitting: None,
            digests: Arc::clone(&self.digests),
            stored_key: None,
            peer: peer
                .addr
                .map_or_else(|| format!("qp {}", peer.qp_num), |a| a.to_string()),
            window: None,
            staging: None,
            transfer: 0,
            commit: None,
            consume: None,
            prepare: None,
            deleting: None,
            closed: Arc::new(AtomicBool::new(false)),
            reading: None,
            stall: self.config.stall,
            heard: Instant::now(),
            stall_armed: false,
            recorder: self.config.recorder.clone(),
        };
        // The adapter drops the state machine when the connection closes, which hands
        // the temporary file of an unfinished upload to the reaper right away, not when
        // the actor goes.
        Box::new(MachineSession::new(server, driver))
    }
}

impl StateMachine for Server {
    type Output = Output;
    fn poll_output(&mut self) -> Option<Output> {
        Endpoint::poll_output(self)
    }
}

/// A chunk WRITE posted: the transfer it belongs to, and the chunk index.
type Posted = (u64, u32);

/// One connection's driver.
struct FileSession {
    /// For logs.
    peer: String,
    /// The service's quota owner, asked to admit each offer.
    quota: Recipient<Admit>,
    /// Its answer to the offer waiting for admission.
    admitting: Option<Asked<std::result::Result<Admission, RejectReason>>>,
    /// The registered window of the upload in progress.
    window: Option<BufId>,
    /// The staging buffer of the download in progress.
    staging: Option<BufId>,
    /// Counts finished transfers. A completion from an earlier transfer is dropped:
    /// after its verdict the state machine may already be in a new role that would
    /// take it for a protocol error.
    transfer: u64,
    /// The commit (fsync, rename) of a verified upload, running on the blocking pool.
    /// If the connection closes first, it still finishes: the file was complete and
    /// verified, only the verdict is lost.
    commit: Option<Blocking<std::result::Result<Committed, StoreError>>>,
    /// The service's known digests: a stored upload's goes in.
    digests: Arc<DigestCache>,
    /// The key of the file the last commit stored, until its outcome says with which
    /// digest.
    stored_key: Option<FileKey>,
    /// Received chunks being hashed and appended on the blocking pool (one job at a
    /// time; the state machine queues what arrives meanwhile).
    consume: Option<Blocking<Consumed>>,
    /// The preparation (open, hash) of a fetched file, running on the blocking pool.
    prepare: Option<Blocking<std::result::Result<super::sender::Sender, RejectReason>>>,
    /// A `Delete` being carried out on the blocking pool.
    deleting: Option<Blocking<std::result::Result<(), RejectReason>>>,
    /// Set when the connection closes, so that a fetch being hashed stops reading.
    closed: Arc<AtomicBool>,
    /// The chunk of a download being read on the blocking pool; its WRITE is posted,
    /// and the state machine's later outputs carried out (the drain is paused till
    /// then), when the read is done.
    /// The chunk's bytes are counted against the heap budget until they are copied
    /// into the staging buffer.
    reading: Option<(ChunkWrite, Blocking<ChunkRead>, Held)>,
    /// [`Config::stall`]: how long a transfer may wait on the peer.
    stall: Option<Duration>,
    /// When the transfer last moved: a message or chunk from the peer, a WRITE
    /// completion, or one of this session's own jobs finishing.
    heard: Instant,
    /// A [`STALL_CHECK`] wake-up is on its way (one at a time).
    stall_armed: bool,
    /// [`Config::recorder`]: told of each stored upload before its verdict.
    recorder: Option<Arc<dyn Recorder>>,
}

/// What a commit job gives back: the final path, and the stored file's key if known.
type Committed = (std::path::PathBuf, Option<FileKey>);

/// The `on_wake` token of a finished commit.
const COMMIT_DONE: u64 = 1;
/// The `on_wake` token of a prepared fetch.
const PREPARED: u64 = 2;
/// The `on_wake` token of consumed chunks.
const CONSUMED: u64 = 3;
/// The `on_wake` token of a chunk read for a download.
const CHUNK_READ: u64 = 4;
/// The `on_wake` token of the quota owner's answer to an offer.
const ADMITTED: u64 = 5;
/// The `on_wake` token of the stall deadline.
const STALL_CHECK: u64 = 6;
/// The `on_wake` token of a finished `Delete`.
const DELETED: u64 = 7;

fn fail(e: TransferError) -> SessionError {
    SessionError::new(format!("file transfer: {e}"))
}

impl<T: Transport> Driver<T> for FileSession {
    type Machine = Server;
    type Posted = Posted;

    fn on_message(
        &mut self,
        cx: &mut MachineCx<'_, '_, Self, T>,
        msg: Incoming,
    ) -> std::result::Result<(), SessionError> {
        self.heard = Instant::now();
        let server = &mut *cx.machine;
        match msg.imm {
            // A chunk landed in the window (WRITE_WITH_IMM: no bytes in the message).
            Some(index) => {
                if !msg.data.is_empty() {
                    return Err(SessionError::new(format!(
                        "file transfer: message with immediate {index} and {} bytes",
                        msg.data.len()
                    )));
                }
                let window = self.window.ok_or_else(|| {
                    SessionError::new(format!("file transfer: chunk {index} without a window"))
                })?;
                let range = server.chunk_range(index).map_err(fail)?;
                let outside = |_| {
                    SessionError::new(format!("file transfer: chunk {index} outside the window"))
                };
                cx.conn
                    .read_with(window, range, |bytes| server.handle_chunk(index, bytes))
                    .map_err(outside)?
                    .map_err(fail)
            }
            None => {
                let msg = Msg::decode(&msg.data).map_err(fail)?;
                server.handle_msg(msg).map_err(fail)
            }
        }
    }

    fn on_op(
        &mut self,
        cx: &mut MachineCx<'_, '_, Self, T>,
        (transfer, index): Posted,
        result: rdmactor::verbs::Result<()>,
    ) -> std::result::Result<(), SessionError> {
        self.heard = Instant::now();
        result.map_err(|e| {
            SessionError::new(format!("file transfer: WRITE of chunk {index} failed: {e}"))
        })?;
        if transfer != self.transfer {
            // From an earlier transfer: the state machine, in a new role now, would take
            // it for a protocol error.
            return Ok(());
        }
        cx.machine.handle_write_done(index).map_err(fail)
    }

    fn on_wake(
        &mut self,
        cx: &mut MachineCx<'_, '_, Self, T>,
        token: u64,
    ) -> std::result::Result<(), SessionError> {
        if token == STALL_CHECK {
            return self.check_stall(cx.machine, cx.conn);
        }
        // One of this session's own jobs finished: the transfer moved.
        self.heard = Instant::now();
        let server = &mut *cx.machine;
        match token {
            CHUNK_READ => {
                let Some(result) = self
                    .reading
                    .as_ref()
                    .and_then(|(_, blocking, _)| blocking.try_take())
                else {
                    return Ok(());
                };
                let (chunk, _, _held) = self.reading.take().expect("checked above");
                cx.resume();
                if cx.machine.is_finished() {
                    // The transfer was aborted while this chunk was read: it is not sent.
                    return Ok(());
                }
                let read = match result {
                    Ok(read) => read,
                    // The connection's blocking work is at its bound: this transfer ends
                    // with the reason, the connection goes on.
                    Err(e @ BlockingError::Busy { .. }) => {
                        cx.machine.handle_job_refused(busy(&e));
                        return Ok(());
                    }
                    Err(e) => {
                        return Err(SessionError::new(format!(
                            "file transfer: reading chunk {}: {e}",
                            chunk.index
                        )))
                    }
                };
                let bytes = cx.machine.handle_read(read).map_err(fail)?;
                if cx.machine.stopped_sending() {
                    // The read failed and the transfer was aborted: nothing to post.
                    return Ok(());
                }
                self.post_chunk(cx, &chunk, &bytes)
            }
            CONSUMED => {
                let Some(result) = self.consume.as_ref().and_then(Blocking::try_take) else {
                    return Ok(());
                };
                self.consume = None;
                let consumed = match result {
                    Ok(consumed) => consumed,
                    Err(e @ BlockingError::Busy { .. }) => {
                        server.handle_job_refused(busy(&e));
                        return Ok(());
                    }
                    Err(e) => {
                        return Err(SessionError::new(format!(
                            "file transfer: consuming chunks: {e}"
                        )))
                    }
                };
                server.handle_consumed(consumed).map_err(fail)
            }
            ADMITTED => {
                let Some(answer) = self.admitting.as_ref().and_then(Asked::try_take) else {
                    return Ok(());
                };
                self.admitting = None;
                let answer = answer.unwrap_or_else(|e| {
                    Err(RejectReason::Unavailable {
                        reason: format!("the quota keeper: {e}"),
                    })
                });
                server.handle_admitted(answer).map_err(fail)
            }
            PREPARED => {
                let Some(result) = self.prepare.as_ref().and_then(Blocking::try_take) else {
                    return Ok(());
                };
                self.prepare = None;
                let result = result.unwrap_or_else(|e| {
                    Err(RejectReason::Unavailable {
                        reason: e.to_string(),
                    })
                });
                server.handle_prepared(result).map_err(fail)
            }
            DELETED => {
                let Some(result) = self.deleting.as_ref().and_then(Blocking::try_take) else {
                    return Ok(());
                };
                self.deleting = None;
                let result = result.unwrap_or_else(|e| {
                    Err(RejectReason::Unavailable {
                        reason: e.to_string(),
                    })
                });
                server.handle_deleted(result).map_err(fail)
            }
            COMMIT_DONE => {
                let Some(result) = self.commit.as_ref().and_then(Blocking::try_take) else {
                    return Ok(());
                };
                self.commit = None;
                let result = result
                    .unwrap_or_else(|e| {
                        Err(StoreError::Io {
                            op: "commit",
                            path: std::path::PathBuf::new(),
                            source: std::io::Error::other(e.to_string()),
                        })
                    })
                    .map(|(path, key)| {
                        self.stored_key = key;
                        path
                    });
                server.handle_committed(result).map_err(fail)
            }
            _ => Ok(()),
        }
    }

    fn carry(
        &mut self,
        cx: &mut MachineCx<'_, '_, Self, T>,
        out: Output,
    ) -> std::result::Result<Flow, SessionError> {
        self.carry_out(cx, out)
    }

    fn drained(
        &mut self,
        cx: &mut MachineCx<'_, '_, Self, T>,
    ) -> std::result::Result<(), SessionError> {
        if let (false, Some(limit)) = (self.busy(), self.stall) {
            self.arm_stall(cx.machine, cx.conn, limit);
        }
        Ok(())
    }

    fn on_close(&mut self, server: Server, reason: &CloseReason) {
        self.closed.store(true, Ordering::Relaxed);
        let committing = self.commit.take().is_some();
        if committing {
            tracing::info!(peer = %self.peer, %reason,
                "connection closed while its verified file was being stored; the file is kept, the verdict is lost");
        }
        if !committing && !server.is_finished() {
            tracing::info!(peer = %self.peer, %reason, state = server.state_name(),
                "connection closed mid-transfer; discarding it");
        }
        drop(server);
        self.reading = None;
        // An answer still on its way is dropped with it, which gives its share back.
        self.admitting = None;
    }

    fn error(what: String) -> SessionError {
        SessionError::new(format!("file transfer: {what}"))
    }
}

/// Why a transfer ends when one of its jobs was refused by the connection's bound on
/// blocking work (`BlockingError::Busy`). `Skipped` never reaches a session (its
/// connection is gone), and the other errors end the connection as before.
fn busy(e: &BlockingError) -> RejectReason {
    RejectReason::Unavailable {
        reason: format!("the server is busy: {e}"),
    }
}
