//! The service-wide bound on input READs in flight, as one connection's session meets
//! it: a READ that finds no room is held, with the machine paused behind it, until a
//! completing READ of any connection of the service grants it room.

use rdmactor::runtime::{ChunkWaiter, Flow, MachineCx, Op, SessionError};
use rdmactor::transport::Transport;
use rdmactor::verbs::RemoteRegion;

use super::{LambdaSession, PendingOp};

/// The wake-up token of a grant of room for a READ (job tokens are slab keys, far
/// below it).
pub(super) const READ_ROOM: u64 = u64::MAX;

/// A job's first READ skips the service's line when it is at most this many bytes. The
/// line bounds the bytes at the NIC, and a READ this small adds next to nothing to them;
/// in line, a polite client's 4 KiB input waited behind every large input's 1 MiB
/// chunks (1-5 s on Soft-RoCE with 512 hostile connections). Unbounded they are not:
/// only a job's first READ may skip, and a job holds its slot before it reads, so the
/// job slots (`LambdaConfig::max_jobs`) bound them to 64 × 64 KiB.
pub(super) const SMALL_READ: usize = 64 * 1024;

/// A chunk READ of a job's input waiting for room among the service's.
pub(super) struct HeldRead {
    pub(super) job: usize,
    pub(super) offset: usize,
    pub(super) src: RemoteRegion,
    pub(super) len: usize,
}

impl LambdaSession {
    /// Posts `read` if the service has room for one more READ in flight (or it is a
    /// job's first and small: [`SMALL_READ`]); else keeps it and returns `Flow::Pause` (the machine
    /// waits behind it, keeping its order) until a completing READ of any connection
    /// grants this one room.
    pub(super) fn post_read<T: Transport>(
        &mut self,
        cx: &mut MachineCx<'_, '_, Self, T>,
        read: HeldRead,
    ) -> Result<Flow, SessionError> {
        let waiter = self
            .waiter
            .get_or_insert_with(|| ChunkWaiter::new(cx.conn.waker(), READ_ROOM));
        let room = if read.offset == 0 && read.len <= SMALL_READ {
            None
        } else if let Some(room) = self.reads.take(waiter) {
            Some(room)
        } else {
            tracing::trace!(
                client = self.client.id.0,
                job = read.job,
                "READ waits for room"
            );
            self.held_read = Some(read);
            return Ok(Flow::Pause);
        };
        let HeldRead {
            job,
            offset,
            src,
            len,
        } = read;
        // At the pool's cap this one request fails, not the connection.
        let buf = match Self::buffer(cx.conn, len) {
            Ok(buf) => buf,
            Err(e) => {
                tracing::warn!(error = %e, len, "no buffer for a lambda's input chunk");
                cx.machine.input_refused(job, &e.to_string());
                return Ok(Flow::Continue);
            }
        };
        let op = Op::Read {
            buf,
            range: 0..len,
            src,
        };
        let pending = PendingOp::Read {
            job,
            buf,
            offset,
            len,
            _room: room,
        };
        cx.post(op, pending)?;
        tracing::trace!(client = self.client.id.0, job, offset, len, "READ posted");
        Ok(Flow::Continue)
    }
}
