//! What every file-transfer state machine has in common: the inputs a driver feeds in
//! ([`Endpoint`]'s `handle_*` methods); what it gets back is in `output.rs`.

use std::ops::Range;
use std::path::PathBuf;

use super::delete::DeleteJob;
use super::error::{Result, TransferError};
use super::output::{unexpected_in, ChunkWrite, Output};
use super::prepare::PrepareFetch;
use super::receiver::{ConsumeJob, Consumed};
use super::sender::{ChunkRead, ReadJob, Sender};
use super::store::{StoreError, TempFile};
use super::wire::{Msg, RejectReason, RemoteWindow};

/// A file-transfer state machine: [`Sender`],
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
    /// dropped, and [`Outcome::Aborted`](super::Outcome::Aborted) finishes it; what the transfer held (its
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
    fn take_read(&mut self, chunk: &ChunkWrite) -> Result<ReadJob> {
        Err(unexpected(self, format!("read of chunk {}", chunk.index)))
    }

    /// Sender: what a `ReadJob` read; returns the chunk's
    /// bytes, to copy into its [`ChunkWrite::range`] of the staging buffer and post.
    ///
    /// # Errors
    ///
    /// The source failed or was short, or a read that was not handed out.
    fn handle_read(&mut self, read: ChunkRead) -> Result<Vec<u8>> {
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
    fn take_consume(&mut self) -> Option<ConsumeJob> {
        None
    }

    /// What a [`super::receiver::ConsumeJob`] did.
    fn handle_consumed(&mut self, consumed: Consumed) -> Result<()> {
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
    fn handle_prepared(&mut self, result: std::result::Result<Sender, RejectReason>) -> Result<()> {
        let _ = result;
        Err(unexpected(self, "a prepared fetch".into()))
    }

    /// The removal to run, after [`Output::Delete`] (once).
    fn take_delete(&mut self) -> Option<DeleteJob> {
        None
    }

    /// How the removal asked for by [`Output::Delete`] ended.
    fn handle_deleted(&mut self, result: std::result::Result<(), RejectReason>) -> Result<()> {
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
pub(crate) fn unexpected<E: Endpoint + ?Sized>(ep: &E, what: String) -> TransferError {
    unexpected_in(ep.state_name(), what)
}
