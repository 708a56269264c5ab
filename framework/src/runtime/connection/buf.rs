//! The memory a connection holds for its session: the buffers of one-sided operations
//! (leased from the pool or registered for it) and the windows that grant its peer
//! access. The bottom of the connection's files: it names no other.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use crate::memory::{Charge, Lease, RegisteredChunks};
use crate::transport::{Transport, Verbs};
use crate::verbs::RemoteRegion;

/// A chunk of the pool's registered memory, on the connection's transport.
pub(super) type Chunk<T> = Lease<RegisteredChunks<T>>;

/// A buffer a session allocated for one-sided operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufId(pub(super) usize);

pub(super) enum Buf<T: Transport = Verbs> {
    Pooled(Chunk<T>),
    Registered(T::Region),
}

impl<T: Transport> Buf<T> {
    pub(super) fn region(&self) -> &T::Region {
        match self {
            Buf::Pooled(l) => l,
            Buf::Registered(m) => m,
        }
    }
    pub(super) fn region_mut(&mut self) -> &mut T::Region {
        match self {
            Buf::Pooled(l) => l,
            Buf::Registered(m) => m,
        }
    }
}

pub(super) struct BufEntry<T: Transport = Verbs> {
    // Field order is drop order: the window (the peer's access) goes before the memory,
    // and the memory is deregistered before its charge against the pool's cap is given
    // back (a waiter woken by that charge finds the room really free).
    pub(super) grant: Option<(T::Window, RemoteRegion)>,
    pub(super) buf: Buf<T>,
    /// For a buffer [`SessionCx::register`](super::SessionCx::register) made: its bytes, counted against the pool's
    /// cap.
    pub(super) _charge: Option<Charge<RegisteredChunks<T>>>,
    pub(super) inflight: u32,
    pub(super) freed: bool,
}

/// A window over a shared region, bound to this connection's QP. Field order is drop
/// order: the window goes before the region clone that keeps the MR registered.
pub(super) struct GrantEntry<T: Transport = Verbs> {
    pub(super) _window: T::Window,
    pub(super) _region: T::Shared,
    pub(super) remote: RemoteRegion,
}
