//! The connection's work-request vocabulary: what a posted work request was (keyed by
//! its wr_id), what waits to be posted, and the buffers a session's one-sided operations
//! use. Apart from `Core` because every file of the connection speaks it, while the
//! core's state and completion handling are one concern of their own.

use std::ops::Range;

use super::rendezvous::PendingOffer;
use crate::memory::{Charge, Lease, RegisteredChunks};
use crate::proto::budget::BudgetError;
use crate::proto::frame::RendezvousOffer;
use crate::runtime::service::OpId;
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

/// A one-sided operation for [`SessionCx::post`](super::SessionCx::post).
#[derive(Debug, Clone)]
pub enum Op {
    /// RDMA WRITE `src` bytes of a buffer to `dst`; with `imm`, also consume a receive at
    /// the peer and deliver the immediate value there.
    Write {
        /// Local buffer.
        buf: BufId,
        /// Bytes of it to write.
        range: Range<usize>,
        /// Where.
        dst: RemoteRegion,
        /// Optional immediate value.
        imm: Option<u32>,
    },
    /// RDMA READ `src` into a buffer range.
    Read {
        /// Local buffer.
        buf: BufId,
        /// Where in it the bytes land (the length read).
        range: Range<usize>,
        /// What to read.
        src: RemoteRegion,
    },
    /// Compare-and-swap on a remote 8-byte word; the old value lands in `buf[offset..+8]`.
    CompareSwap {
        /// Local buffer for the old value.
        buf: BufId,
        /// Offset of the 8 bytes in it.
        offset: usize,
        /// Target word.
        remote: RemoteRegion,
        /// Expected value.
        compare: u64,
        /// New value.
        swap: u64,
    },
    /// Fetch-and-add on a remote 8-byte word; the old value lands in `buf[offset..+8]`.
    FetchAdd {
        /// Local buffer for the old value.
        buf: BufId,
        /// Offset of the 8 bytes in it.
        offset: usize,
        /// Target word.
        remote: RemoteRegion,
        /// Amount added.
        add: u64,
    },
}

impl Op {
    pub(super) fn buf(&self) -> BufId {
        match self {
            Op::Write { buf, .. }
            | Op::Read { buf, .. }
            | Op::CompareSwap { buf, .. }
            | Op::FetchAdd { buf, .. } => *buf,
        }
    }
}

/// What a posted work request was, keyed by its wr_id.
pub(super) enum Wr<T: Transport = Verbs> {
    Recv(usize),
    /// A memory-window bind (see `SessionCx::register`).
    Bind,
    /// A keepalive probe: a zero-length RDMA WRITE (see `liveness.rs`).
    Probe,
    /// The `Close` frame telling the peer why the connection ends (see
    /// `Core::post_goodbye`).
    Goodbye {
        lease: Chunk<T>,
    },
    /// A SEND; `seq` orders it among this connection's SENDs (see `Core::unsignaled`).
    Send {
        lease: Option<Chunk<T>>,
        seq: u64,
        signaled: bool,
    },
    /// A chunk of a peer's rendezvous offer READ into `lease[..len]` (see
    /// `Core::post_read_chunks`).
    RendezvousChunk {
        lease: Chunk<T>,
        seq: u64,
        len: usize,
    },
    Op {
        op: OpId,
        buf: BufId,
    },
}

pub(super) enum Outgoing<T: Transport = Verbs> {
    Data {
        tag: u32,
        bytes: Vec<u8>,
    },
    Credit,
    Done {
        tag: u32,
    },
    Raw {
        bytes: Vec<u8>,
        imm: Option<u32>,
    },
    Op {
        op: OpId,
        op_spec: Op,
    },
    Read {
        seq: u64,
        tag: u32,
        offer: RendezvousOffer,
        len: usize,
    },
    /// We will not take the peer's offer `key`.
    Refuse {
        key: u32,
        why: BudgetError,
    },
    /// A large message being registered for its rendezvous offer (see
    /// `Core::begin_offer`): the queue waits behind it, so messages keep their order.
    Offer(Box<PendingOffer<T>>),
}

impl<T: Transport> Outgoing<T> {
    /// Bytes this item holds in memory while queued.
    pub(super) fn bytes(&self) -> usize {
        match self {
            Outgoing::Data { bytes, .. } | Outgoing::Raw { bytes, .. } => bytes.len(),
            Outgoing::Offer(offer) => offer.len(),
            _ => 0,
        }
    }
}
