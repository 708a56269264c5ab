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

/// A chunk READ of a job's input waiting for room among the service's.
pub(super) struct HeldRead {
    pub(super) job: usize,
    pub(super) offset: usize,
    pub(super) src: RemoteRegion,
    pub(super) len: usize,
}

impl LambdaSession {
    /// Posts `read` if the service has room for one more READ in flight; else keeps it
    /// and returns `Flow::Pause` (the machine waits behind it, keeping its order) until
    /// a completing READ of any connection grants this one room.
    pub(super) fn post_read<T: Transport>(
        &mut self,
        cx: &mut MachineCx<'_, '_, Self, T>,
        read: HeldRead,
    ) -> Result<Flow, SessionError> {
        let waiter = self
            .waiter
            .get_or_insert_with(|| ChunkWaiter::new(cx.conn.waker(), READ_ROOM));
        let Some(room) = self.reads.take(waiter) else {
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
