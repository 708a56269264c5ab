//! Carrying out the state machine's outputs for one connection (registering, sending,
//! posting WRITEs, freeing): apart from the session's callbacks (`session.rs`) because
//! every callback's outputs end here, and this is where the driver touches verbs.

use std::sync::Arc;

use rdmactor::runtime::{Flow, MachineCx, Op, SessionError};
use rdmactor::transport::Transport;
use rdmactor::verbs::{Access, RemoteRegion};

use super::{
    fail, Committed, FileSession, ADMITTED, CHUNK_READ, COMMIT_DONE, CONSUMED, DELETED, PREPARED,
};
use crate::file_transfer::endpoint::Endpoint;
use crate::file_transfer::output::{ChunkWrite, Outcome, Output};
use crate::file_transfer::owner::Admit;
use crate::file_transfer::store::StoreError;
use crate::file_transfer::wire::{RejectReason, RemoteWindow};
use crate::file_transfer::{Recorder, StoredCopy};

fn remote_window(r: RemoteRegion) -> RemoteWindow {
    RemoteWindow {
        addr: r.addr,
        len: r.len,
        rkey: r.rkey,
    }
}

impl FileSession {
    /// Carries out one output (see [`Endpoint`] for the order they come in); pauses at
    /// a chunk to read off the poller, so that the outputs after it keep their order.
    pub(super) fn carry_out<T: Transport>(
        &mut self,
        cx: &mut MachineCx<'_, '_, Self, T>,
        out: Output,
    ) -> std::result::Result<Flow, SessionError> {
        let (server, conn) = (&mut *cx.machine, &mut *cx.conn);
        match out {
            Output::Send(msg) => conn.send(0, msg.encode())?,
            Output::GrantWindow { len } => {
                let len = usize::try_from(len)
                    .map_err(|_| SessionError::new(format!("window of {len} bytes")))?;
                // Out of registrable memory is the server's condition: the
                // client is told why its offer is refused, the connection stays.
                let buf = match conn.register(len, Access::REMOTE_WRITE) {
                    Ok(buf) => buf,
                    Err(e) => {
                        tracing::warn!(error = %e, len, "cannot register an upload window");
                        server.window_refused(e.to_string()).map_err(fail)?;
                        return Ok(Flow::Continue);
                    }
                };
                self.window = Some(buf);
                let region = remote_window(conn.remote(buf)?);
                server.handle_window(region).map_err(fail)?;
            }
            Output::Revoke => {
                if let Some(buf) = self.window.take() {
                    conn.free(buf);
                }
            }
            Output::Stage { len } => {
                let len = usize::try_from(len)
                    .map_err(|_| SessionError::new(format!("staging of {len} bytes")))?;
                if let Some(old) = self.staging.take() {
                    conn.free(old);
                }
                self.staging = Some(conn.register(len, Access::NONE)?);
            }
            Output::WriteChunk(chunk) => {
                if self.staging.is_none() {
                    return Err(SessionError::new("file transfer: chunk before Stage"));
                }
                // Read on the blocking pool; the outputs after this one (more
                // chunks, `Done`) wait for it, so they keep their order.
                // The chunk's bytes are read into the heap, `slot_len` of the client's
                // grant (up to `Config::max_window`): counted against the server's heap
                // budget until they are copied into the staging buffer. Past it the
                // fetch ends with the reason; the connection goes on.
                let held = match conn.heap_budget().try_hold(chunk.len as usize) {
                    Ok(held) => held,
                    Err(e) => {
                        tracing::debug!(error = %e, len = chunk.len, "no heap budget for a chunk");
                        server.handle_job_refused(RejectReason::Unavailable {
                            reason: format!("no room for a chunk of {} bytes: {e}", chunk.len),
                        });
                        return Ok(Flow::Continue);
                    }
                };
                let job = server.take_read(&chunk).map_err(fail)?;
                let reading = conn.spawn_blocking(CHUNK_READ, move || job.run());
                self.reading = Some((chunk, reading, held));
                return Ok(Flow::Pause);
            }
            Output::Consume => {
                if let Some(job) = server.take_consume() {
                    self.consume = Some(conn.spawn_blocking(CONSUMED, move || job.run()));
                }
            }
            Output::Admit { client, len, free } => {
                let admit = Admit { client, len, free };
                self.admitting = Some(conn.ask(ADMITTED, &self.quota, admit));
            }
            Output::Prepare => {
                let job = server.take_prepare().ok_or_else(|| {
                    SessionError::new("file transfer: a fetch to prepare without a job")
                })?;
                let closed = Arc::clone(&self.closed);
                self.prepare =
                    Some(conn.spawn_blocking(PREPARED, move || job.run_cancellable(&closed)));
            }
            Output::Delete => {
                let job = server.take_delete().ok_or_else(|| {
                    SessionError::new("file transfer: a delete asked for without a job")
                })?;
                self.deleting = Some(conn.spawn_blocking(DELETED, move || job.run()));
            }
            Output::Commit => {
                let temp = server.take_commit().ok_or_else(|| {
                    SessionError::new("file transfer: a commit asked for without a file")
                })?;
                let record = server.commit_copy().zip(self.recorder.clone());
                self.commit = Some(conn.spawn_blocking(COMMIT_DONE, move || {
                    if let Some((copy, recorder)) = &record {
                        // Refused before the rename: the name keeps what it held, and
                        // dropping the temporary file removes it.
                        recorder
                            .admit(copy)
                            .map_err(|why| StoreError::NotRecorded {
                                name: copy.name.clone(),
                                why,
                            })?;
                    }
                    let committed = temp.commit_identified()?;
                    match record {
                        Some((copy, recorder)) => record_copy(&*recorder, &copy, committed),
                        None => Ok(committed),
                    }
                }));
            }
            Output::Finished(outcome) => {
                self.log(&outcome);
                // The digest the upload was verified against is the stored file's:
                // a fetch of it need not read it again.
                if let (Outcome::Stored { len, digest, .. }, Some(key)) =
                    (&outcome, self.stored_key.take())
                {
                    if key.len == *len {
                        self.digests.insert(key, *digest);
                    }
                }
                // Freed after the WRITEs still reading it complete.
                if let Some(buf) = self.staging.take() {
                    conn.free(buf);
                }
                if let Some(buf) = self.window.take() {
                    conn.free(buf);
                }
                self.transfer += 1;
            }
        }
        Ok(Flow::Continue)
    }

    /// Copies a chunk read off the poller into its range of the staging buffer (a
    /// memcpy) and posts its WRITE_WITH_IMM.
    pub(super) fn post_chunk<T: Transport>(
        &mut self,
        cx: &mut MachineCx<'_, '_, Self, T>,
        chunk: &ChunkWrite,
        bytes: &[u8],
    ) -> std::result::Result<(), SessionError> {
        let buf = self
            .staging
            .ok_or_else(|| SessionError::new("file transfer: chunk before Stage"))?;
        let range = chunk.range();
        if range.len() != bytes.len() {
            return Err(SessionError::new("file transfer: chunk outside stage"));
        }
        cx.conn
            .copy_in(buf, range.start, bytes)
            .map_err(|_| SessionError::new("file transfer: chunk outside stage"))?;
        let write = Op::Write {
            buf,
            range,
            dst: RemoteRegion {
                addr: chunk.remote.addr,
                len: chunk.remote.len,
                rkey: chunk.remote.rkey,
            },
            imm: Some(chunk.imm()),
        };
        cx.post(write, (self.transfer, chunk.index))?;
        Ok(())
    }

    pub(super) fn log(&self, outcome: &Outcome) {
        let peer = &self.peer;
        match outcome {
            Outcome::Stored { path, len, digest } => {
                rdmactor::metrics::file_transfer(true, *len);
                tracing::info!(%peer, path = %path.display(), len, %digest, "stored");
            }
            Outcome::Delivered { .. } => tracing::info!(%peer, "delivered"),
            Outcome::Bad(reason) => {
                rdmactor::metrics::file_transfer(false, 0);
                tracing::warn!(%peer, %reason, "BAD")
            }
            Outcome::Rejected(reason) => tracing::info!(%peer, %reason, "rejected"),
            Outcome::Held { len, digest } => tracing::debug!(%peer, len, %digest, "stat"),
            Outcome::Deleted => tracing::info!(%peer, "deleted"),
            Outcome::Aborted(reason) => {
                rdmactor::metrics::file_transfer(false, 0);
                tracing::warn!(%peer, %reason, "aborted")
            }
        }
    }
}

/// Records a committed copy; a new file the recorder refuses is removed again, so that
/// the name holds nothing the catalog does not know of (see [`Recorder`]).
fn record_copy(
    recorder: &dyn Recorder,
    copy: &StoredCopy,
    committed: Committed,
) -> std::result::Result<Committed, StoreError> {
    let Err(why) = recorder.record(copy) else {
        return Ok(committed);
    };
    tracing::warn!(name = %copy.name, %why, "stored, but not recorded");
    if !copy.overwrite {
        if let Err(e) = std::fs::remove_file(&committed.0) {
            tracing::warn!(path = %committed.0.display(), error = %e, "cannot remove a copy not recorded");
        }
    }
    Err(StoreError::NotRecorded {
        name: copy.name.clone(),
        why,
    })
}
