//! The service-wide bound on input READs in flight, as one connection's session meets
//! it: a READ that finds no room is held, with the machine paused behind it, until a
//! completing READ of any connection of the service grants it room.

use std::sync::Arc;

use rdmactor::runtime::{ChunkRoom, ChunkWaiter, ServiceChunks, SessionWaker};
use rdmactor::verbs::RemoteRegion;

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

/// One session's place in the service's READ bound: its waiter in the line (made with
/// its first READ) and the one READ it holds back while the line has no room for it.
pub(super) struct ReadRoom {
    reads: Arc<ServiceChunks>,
    waiter: Option<ChunkWaiter>,
    held: Option<HeldRead>,
}

impl ReadRoom {
    pub(super) fn new(reads: Arc<ServiceChunks>) -> ReadRoom {
        ReadRoom {
            reads,
            waiter: None,
            held: None,
        }
    }

    /// `read` with the room it may be posted in (none for a job's first small READ:
    /// [`SMALL_READ`]), or `None` when the service has no room: the READ is then kept
    /// until a completing READ of any connection grants this session room, which wakes
    /// it with [`READ_ROOM`]. The caller pauses its machine behind it, keeping its order.
    pub(super) fn admit(
        &mut self,
        waker: impl FnOnce() -> SessionWaker,
        read: HeldRead,
    ) -> Option<(HeldRead, Option<ChunkRoom>)> {
        let waiter = self
            .waiter
            .get_or_insert_with(|| ChunkWaiter::new(waker(), READ_ROOM));
        if read.offset == 0 && read.len <= SMALL_READ {
            return Some((read, None));
        }
        match self.reads.take(waiter) {
            Some(room) => Some((read, Some(room))),
            None => {
                self.held = Some(read);
                None
            }
        }
    }

    /// The READ held back, now that room was granted; `None` when there is none (its job
    /// failed meanwhile), and the room goes on to the next connection in line.
    pub(super) fn granted(&mut self) -> Option<HeldRead> {
        let held = self.held.take();
        if held.is_none() {
            if let Some(waiter) = &self.waiter {
                self.reads.return_grants(waiter);
            }
        }
        held
    }

    /// Leaves the line for good (the session closes): rooms granted and not used go to
    /// the next connection in line.
    pub(super) fn leave(&self) {
        if let Some(waiter) = &self.waiter {
            waiter.leave();
            self.reads.return_grants(waiter);
        }
    }
}
