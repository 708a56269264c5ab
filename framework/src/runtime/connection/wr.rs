//! The connection's work-request vocabulary: what a posted work request was (keyed by
//! its wr_id), what waits to be posted, and a session's one-sided operations. Apart from
//! `Core` because every file of the connection speaks it, while the core's state and
//! completion handling are one concern of their own.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use std::collections::VecDeque;
use std::ops::Range;

use super::buf::{BufId, Chunk};
use super::offers::PendingOffer;
use crate::proto::budget::BudgetError;
use crate::proto::frame::RendezvousOffer;
use crate::runtime::service::OpId;
use crate::transport::{Transport, Verbs};
use crate::verbs::{Access, RemoteRegion, SendOp};

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
    /// A keepalive probe: a zero-length RDMA WRITE (see `liveness.rs`), posted after
    /// the SENDs numbered below `after`. Signalled, so its success says those are done
    /// too: an idle connection's last unsignalled SENDs give back their slots and
    /// buffers with it.
    Probe {
        after: u64,
    },
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

/// A send-queue request decided and not yet posted. Its memory is found through its
/// entry in the work in flight, at post time.
pub(super) struct QueuedSend {
    pub(super) wr_id: usize,
    pub(super) op: SendOp,
    /// The local bytes: a range of the entry's buffer (`None`: none, as a probe or the
    /// flush marker).
    pub(super) bytes: Option<Range<usize>>,
}

/// What a queued bind binds: the window of a session's buffer, or of a rendezvous offer.
#[derive(Debug, Clone, Copy)]
pub(super) enum BindOf {
    Buf(BufId),
    Offer(usize),
}

/// A window bind decided and not yet posted.
pub(super) struct QueuedBind {
    pub(super) wr_id: usize,
    pub(super) of: BindOf,
    pub(super) access: Access,
    /// What the bind gives the peer: the region's bytes under the window's next rkey.
    pub(super) expect: RemoteRegion,
}

/// One doorbell's worth of decided work: receives, then sends, or a bind alone.
#[derive(Default)]
pub(super) struct Batch {
    pub(super) recvs: Vec<usize>,
    pub(super) sends: Vec<QueuedSend>,
    pub(super) bind: Option<QueuedBind>,
}

impl Batch {
    pub(super) fn is_empty(&self) -> bool {
        self.recvs.is_empty() && self.sends.is_empty() && self.bind.is_none()
    }
}

/// The core's queue of decided work: the batch being filled, and those cut and waiting
/// for the driver (oldest first), with emptied batches kept for reuse (no allocation
/// per turn once warm).
#[derive(Default)]
pub(super) struct Outbox {
    pub(super) open: Batch,
    pub(super) ready: VecDeque<Batch>,
    pub(super) spare: Vec<Batch>,
}

impl Outbox {
    /// Nothing decided that the driver has not posted.
    pub(super) fn is_empty(&self) -> bool {
        self.open.is_empty() && self.ready.iter().all(Batch::is_empty)
    }
}
