//! The state of large messages moving by rendezvous (what `rendezvous.rs` does with it):
//! ours, offered to the peer or being registered for it, and the peer's, being READ.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use std::sync::mpsc;
use std::time::Instant;

use super::buf::Buf;
use crate::memory::{Charge, HeapCharge, RegisteredChunks};
use crate::proto::frame::RendezvousOffer;
use crate::runtime::close::CloseReason;
use crate::transport::{Transport, Verbs};

/// A large message exposed to the peer for its RDMA READ: a window bound to this
/// connection's QP with REMOTE_READ over exactly the message's bytes. Field order is drop
/// order: the window (the peer's access) goes before the memory, and the memory before
/// the pool stops counting it.
pub(super) struct RendezvousOut<T: Transport = Verbs> {
    pub(super) _window: T::Window,
    pub(super) _buf: Buf<T>,
    pub(super) _charge: Charge<RegisteredChunks<T>>,
    pub(super) len: usize,
    /// The message's tag, for the session when the peer refuses it.
    pub(super) tag: u32,
    pub(super) offered: Instant,
}

/// A large message on its way to being offered: counted by the budget and the pool,
/// and registered on the framework's registration threads (`runtime::registrar`, not
/// the blocking pool, where service jobs could queue ahead of it). Pinning a message's pages costs a
/// system call whose time grows with its size (0.4 ms on average for 8 MiB in the test
/// VM, 2 ms at worst, and as much again to unpin it), and the poller thread that would
/// pay it serves every other connection on it.
pub(super) struct PendingOffer<T: Transport = Verbs> {
    pub(super) tag: u32,
    pub(super) len: usize,
    pub(super) charge: Charge<RegisteredChunks<T>>,
    pub(super) registration: Registration<T>,
}

pub(super) enum Registration<T: Transport> {
    Running(mpsc::Receiver<Result<T::Region, T::Error>>),
    Done(T::Region),
}

impl<T: Transport> PendingOffer<T> {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// True once the message is registered (the answer is taken on the first call
    /// after it came).
    pub(super) fn poll_registered(&mut self) -> Result<bool, CloseReason> {
        if let Registration::Running(rx) = &self.registration {
            self.registration = match rx.try_recv() {
                Ok(Ok(mr)) => Registration::Done(mr),
                Ok(Err(e)) => return Err(CloseReason::from_verbs(e)),
                Err(mpsc::TryRecvError::Empty) => return Ok(false),
                Err(mpsc::TryRecvError::Disconnected) => {
                    return Err(CloseReason::Memory(
                        "registering a rendezvous message: the task ended without an answer".into(),
                    ))
                }
            };
        }
        Ok(true)
    }
}

/// An offer of the peer's being READ, chunk by chunk, into `data`.
pub(super) struct IncomingOffer<T: Transport = Verbs> {
    pub(super) seq: u64,
    pub(super) tag: u32,
    pub(super) offer: RendezvousOffer,
    pub(super) len: usize,
    pub(super) data: Vec<u8>,
    /// Bytes for which READs have been posted.
    pub(super) posted: usize,
    /// Its share of the server-wide heap budget, held until the message is complete
    /// (or the connection is gone).
    pub(super) _heap: Option<HeapCharge<RegisteredChunks<T>>>,
}
