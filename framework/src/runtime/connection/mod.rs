//! One connection per cm_id. Its [`Core`] (this file) owns the QP, the pre-posted
//! receive buffers, the work requests in flight (a slab whose index is the wr_id) and the
//! credit window; `actor.rs` holds the lifecycle around it (completions in from the
//! poller, session callbacks, teardown on every path: peer disconnect, local close,
//! error completion, shutdown) and the actor that carries its mailbox.
//!
//! Teardown order: `rdma_disconnect`, QP to the error state, wait until every posted
//! work request has come back (successful or flushed), then drop the QP, the cm_id and
//! the buffers, and tell the CM actor. The flushes are drained, never waited on blindly:
//! a timer forces the end if a provider loses some.

use std::collections::VecDeque;
use std::ops::Range;
use std::time::{Duration, Instant};

use slab::Slab;

mod actor;
mod grants;
mod liveness;
mod rendezvous;
mod wake;

pub(crate) use actor::{panic_message, CmNotice, ConnClosed, ConnectionActor, ConnectionParts};

pub use grants::{Grant, GrantId};
pub use wake::{Blocking, BlockingError, SessionWaker};

use self::grants::GrantEntry;
use self::liveness::{Liveness, Verdict};
use self::rendezvous::RendezvousOut;
use self::wake::Wake;
use super::poller::CqReservation;
use super::recv_groups::Membership;
use super::service::{Framing, Message, OpId, SessionError};
use super::srq::SharedRecv;
use super::CloseReason;
use crate::memory::{Charge, Lease, MrPool, PoolError};
use crate::proto::budget::Budget;
use crate::proto::credits::{CreditError, CreditWindow};
use crate::proto::frame::{FrameKind, Header, RendezvousOffer, HEADER_LEN};
use crate::verbs::{
    Access, CmId, MemoryRegion, MemoryWindow, ProtectionDomain, QueuePair, RecvWr, RemoteRegion,
    SendOp, SendWr, VerbsError, WcOpcode, WcStatus, WorkCompletion,
};

/// SENDs up to this size are copied into the work request (the QP's max_inline_data).
pub(crate) const INLINE_MAX: usize = 48;

/// Send buffers a connection keeps for reuse (of the pool's smallest class).
const SPARE_BUFFERS: usize = 4;

/// Most SENDs posted with one doorbell.
const MAX_BATCH: usize = 32;

/// How long teardown waits for flushed completions before giving up on them.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// At most this many SENDs in a row go unsignalled. Each completion costs the poller a
/// CQ entry and the actor a turn; a send's buffer only needs to come back eventually, and
/// a signalled completion on the send queue means every earlier request there is done.
const SIGNAL_EVERY: usize = 16;

/// Largest message a framed connection can carry (the frame's length field allows up to
/// 4 GiB); each connection's limit is [`NodeConfig::max_message`](super::NodeConfig),
/// 16 MiB by default.
pub const MAX_MESSAGE: usize = 1 << 30;

/// A buffer a session allocated for one-sided operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufId(usize);

enum Buf {
    Pooled(Lease),
    Registered(MemoryRegion),
}

impl Buf {
    fn region(&self) -> &MemoryRegion {
        match self {
            Buf::Pooled(l) => l,
            Buf::Registered(m) => m,
        }
    }
    fn region_mut(&mut self) -> &mut MemoryRegion {
        match self {
            Buf::Pooled(l) => l,
            Buf::Registered(m) => m,
        }
    }
}

struct BufEntry {
    // Field order is drop order: the window (the peer's access) goes before the memory.
    grant: Option<(MemoryWindow, RemoteRegion)>,
    buf: Buf,
    inflight: u32,
    freed: bool,
}

/// A one-sided operation for [`SessionCx::post`].
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
    fn buf(&self) -> BufId {
        match self {
            Op::Write { buf, .. }
            | Op::Read { buf, .. }
            | Op::CompareSwap { buf, .. }
            | Op::FetchAdd { buf, .. } => *buf,
        }
    }
}

/// What a posted work request was, keyed by its wr_id.
enum Wr {
    Recv(usize),
    /// A memory-window bind (see `SessionCx::register`).
    Bind,
    /// A keepalive probe: a zero-length RDMA WRITE (see `liveness.rs`).
    Probe,
    /// A SEND; `seq` orders it among this connection's SENDs (see `Core::unsignaled`).
    Send {
        #[allow(dead_code)]
        lease: Option<Lease>,
        seq: u64,
        signaled: bool,
    },
    RendezvousRead {
        buf: Buf,
        seq: u64,
        tag: u32,
        key: u32,
        len: usize,
        /// Counts a buffer registered for this message alone against the pool's cap.
        _charge: Option<Charge>,
    },
    Op {
        op: OpId,
        buf: BufId,
    },
}

struct QueuedSend {
    wr_id: usize,
    len: usize,
    op: SendOp,
}

enum Outgoing {
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
}

impl Outgoing {
    /// Bytes this item holds in memory while queued.
    fn bytes(&self) -> usize {
        match self {
            Outgoing::Data { bytes, .. } | Outgoing::Raw { bytes, .. } => bytes.len(),
            _ => 0,
        }
    }
}

enum Delivery {
    Ready(Message),
    Waiting(u64),
}

/// Everything a connection owns besides its session. Field order is drop order: windows
/// first, then the QP before the cm_id it was created on and before the memory it could
/// touch.
pub(crate) struct Core {
    // Memory windows hold a reference on the QP they are bound to (rxe waits for it when
    // the QP is destroyed), so the session's buffers and their windows go first.
    bufs: Slab<BufEntry>,
    // Windows over shared regions, for the same reason (see `SessionCx::grant`).
    grants: Slab<GrantEntry>,
    qp: QueuePair,
    /// None for a QP brought up out of band (no rdma_cm).
    id: Option<CmId>,
    /// This connection's place in a shared queue of framed connections, with the
    /// reserve its credits borrow from (after `qp`; see `recv_groups.rs`).
    membership: Option<Membership>,
    /// Receives from a queue shared with other connections (after `qp`: the QP goes first).
    shared_recv: Option<SharedRecv>,
    _cq: CqReservation,
    framing: Framing,
    recv: Vec<Lease>,
    recv_size: usize,
    /// Receive slots of a framed connection consumed this turn, reposted after the turn's
    /// SENDs are posted: the answer to a message goes out first, and the repost's credit
    /// rides a later frame (credits keep the peer from sending into the gap). Raw
    /// connections repost at once.
    reposts: Vec<usize>,
    credits: Option<CreditWindow>,
    inflight: Slab<Wr>,
    /// Unsignalled SENDs still holding a send-queue slot and their buffer, oldest first,
    /// as (seq, wr_id): released when a later signalled SEND completes.
    unsignaled: VecDeque<(u64, usize)>,
    send_seq: u64,
    /// Buffers of completed small SENDs, reused by the next ones.
    spare: Vec<Lease>,
    /// SENDs decided this turn, posted together by `flush_sends`.
    batch: Vec<QueuedSend>,
    send_outstanding: u32,
    send_depth: u32,
    /// Work decided but not posted yet (no credit, or the send queue is full).
    pending: VecDeque<Outgoing>,
    /// Bytes of the messages in `pending`, bounded by `max_queued_bytes`.
    pending_bytes: usize,
    max_queued_bytes: usize,
    max_queued_sends: usize,
    deliveries: VecDeque<Delivery>,
    rendezvous_out: Slab<RendezvousOut>,
    next_op: u64,
    next_seq: u64,
    pool: MrPool,
    pd: ProtectionDomain,
    /// Bytes registered for rendezvous messages being READ from the peer.
    budget_in: Budget,
    /// Bytes registered for rendezvous messages offered to the peer, until its Done.
    budget_out: Budget,
    /// How long an offer may wait for the peer's Done (see `rendezvous.rs`).
    rendezvous_deadline: Duration,
    /// A timer for the oldest offer's deadline is armed.
    rendezvous_timer: bool,
    closing: Option<CloseReason>,
    established: bool,
    /// When to probe a silent peer (see `liveness.rs`).
    liveness: Liveness,
    /// Close if not established within this (`None`: established already).
    handshake_timeout: Option<Duration>,
    /// Close when no message arrived for this long.
    idle_timeout: Option<Duration>,
    /// When the last message was delivered (or the connection was established).
    last_message: Instant,
    /// When the QP was created (just before this): the poller tells this QP's
    /// completions from those of an earlier QP with the same number by it.
    created: Instant,
    /// This connection's actor, for `SessionCx::waker` (set when the actor is created,
    /// before the poller can deliver anything).
    waker: Option<actix::WeakRecipient<Wake>>,
    /// Metric handles, set by `count_as` once the service is known.
    metrics: Option<crate::metrics::ConnectionMetrics>,
}

/// What [`Core::new`] needs.
pub(crate) struct CoreParts {
    pub qp: QueuePair,
    pub id: Option<CmId>,
    pub shared_recv: Option<SharedRecv>,
    pub membership: Option<Membership>,
    pub cq: CqReservation,
    pub framing: Framing,
    pub recv: Vec<Lease>,
    pub recv_size: usize,
    pub credits: Option<CreditWindow>,
    pub send_depth: u32,
    pub max_queued_bytes: usize,
    pub max_queued_sends: usize,
    pub pool: MrPool,
    pub pd: ProtectionDomain,
    pub max_message: usize,
    pub rendezvous_budget: usize,
    pub rendezvous_deadline: Duration,
    pub keepalive: Option<Duration>,
    pub retry_span: Duration,
    pub handshake_timeout: Option<Duration>,
    pub idle_timeout: Option<Duration>,
}

impl Core {
    pub(crate) fn new(p: CoreParts) -> Core {
        Core {
            qp: p.qp,
            id: p.id,
            shared_recv: p.shared_recv,
            membership: p.membership,
            _cq: p.cq,
            framing: p.framing,
            recv: p.recv,
            recv_size: p.recv_size,
            reposts: Vec::new(),
            credits: p.credits,
            inflight: Slab::new(),
            unsignaled: VecDeque::new(),
            send_seq: 0,
            spare: Vec::new(),
            batch: Vec::new(),
            send_outstanding: 0,
            send_depth: p.send_depth,
            pending: VecDeque::new(),
            pending_bytes: 0,
            max_queued_bytes: p.max_queued_bytes,
            max_queued_sends: p.max_queued_sends,
            deliveries: VecDeque::new(),
            bufs: Slab::new(),
            rendezvous_out: Slab::new(),
            next_op: 0,
            next_seq: 0,
            pool: p.pool,
            pd: p.pd,
            budget_in: Budget::new(p.rendezvous_budget, p.max_message),
            budget_out: Budget::new(p.rendezvous_budget, p.max_message),
            rendezvous_deadline: p.rendezvous_deadline,
            rendezvous_timer: false,
            closing: None,
            established: false,
            liveness: Liveness::new(p.keepalive, p.retry_span),
            handshake_timeout: p.handshake_timeout,
            idle_timeout: p.idle_timeout,
            last_message: Instant::now(),
            created: Instant::now(),
            grants: Slab::new(),
            waker: None,
            metrics: None,
        }
    }

    /// Counts this connection in the metrics as a `side` connection of `service`.
    pub(crate) fn count_as(&mut self, side: crate::metrics::Side, service: &str) {
        self.metrics = Some(crate::metrics::ConnectionMetrics::new(side, service));
    }

    /// Posts every receive buffer; called before the QP reaches RTR so the peer's first
    /// SEND always finds one.
    pub(crate) fn post_all_receives(&mut self) -> Result<(), VerbsError> {
        for slot in 0..self.recv.len() {
            self.post_recv(slot)?;
        }
        Ok(())
    }

    fn post_recv(&mut self, slot: usize) -> Result<(), VerbsError> {
        let wr_id = self.inflight.insert(Wr::Recv(slot)) as u64;
        let sge = self.recv[slot].sge(0..self.recv_size)?;
        let res = self.qp.post_recv(&[RecvWr {
            wr_id,
            local: Some(sge),
        }]);
        if res.is_err() {
            self.inflight.remove(wr_id as usize);
        }
        res
    }

    pub(crate) fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    /// The keepalive check, once per period: probes the peer if the connection has been
    /// silent since the last check (see `liveness.rs`).
    pub(crate) fn keepalive_check(&mut self) -> Result<(), CloseReason> {
        if !self.established || self.closing.is_some() {
            return Ok(());
        }
        match self.liveness.check() {
            Verdict::Fine => return Ok(()),
            Verdict::Probe => {}
            Verdict::Unreachable => {
                return Err(CloseReason::PeerUnreachable(format!(
                    "a keepalive probe went unanswered for {:?} and nothing else was heard",
                    self.liveness.unanswered_for()
                )))
            }
        }
        if self.send_outstanding >= self.send_depth {
            // A full send queue with nothing completing: its own requests will fail if
            // the peer is gone.
            return Ok(());
        }
        let slot = self.inflight.vacant_entry();
        let nothing = RemoteRegion {
            addr: 0,
            len: 0,
            rkey: 0,
        };
        let wr = SendWr::new(slot.key() as u64, SendOp::Write(nothing), None);
        self.qp.post_send(&wr).map_err(CloseReason::from_verbs)?;
        slot.insert(Wr::Probe);
        self.send_outstanding += 1;
        self.liveness.probe_posted();
        tracing::debug!(
            qp = self.qp.qp_num(),
            "silent connection: keepalive probe posted"
        );
        Ok(())
    }

    /// Closes the connection when no message arrived for the idle timeout.
    pub(crate) fn idle_check(&mut self) -> Result<(), CloseReason> {
        match self.idle_timeout {
            Some(idle) if self.established && self.last_message.elapsed() >= idle => {
                Err(CloseReason::IdleTimeout(idle))
            }
            _ => Ok(()),
        }
    }

    /// The poller thread that polls this connection's CQ; its actor must run there.
    pub(crate) fn arbiter(&self) -> actix::dev::ArbiterHandle {
        self._cq.arbiter()
    }

    fn eager_limit(&self) -> usize {
        self.recv_size - HEADER_LEN
    }

    /// Posts as much queued work as credits and the send queue allow, then reposts the
    /// receives consumed this turn (and sends the credit frame that may call for). What
    /// stays queued must fit the connection's bound (see [`Core::check_backlog`]).
    fn pump(&mut self) -> Result<(), CloseReason> {
        self.pump_sends()?;
        if self.repost_receives()? {
            self.pump_sends()?;
        }
        self.check_backlog()
    }

    /// Queues work for [`Core::pump`], counting its bytes.
    fn queue(&mut self, item: Outgoing) {
        self.pending_bytes += item.bytes();
        self.pending.push_back(item);
    }

    /// Takes the next queued work item.
    fn dequeue(&mut self) -> Option<Outgoing> {
        let item = self.pending.pop_front()?;
        self.pending_bytes -= item.bytes();
        Some(item)
    }

    /// Drops everything queued (the connection is closing).
    fn clear_queue(&mut self) {
        self.pending.clear();
        self.pending_bytes = 0;
    }

    /// Checked after each pump, when everything that could be posted was: what is left
    /// waits for the peer (credits, receives, acknowledgements). A peer that asks for
    /// answers and never takes them would make that grow without end, so past the bound
    /// the connection closes. A single message is always allowed, however large.
    fn check_backlog(&self) -> Result<(), CloseReason> {
        let sends = self.pending.len();
        if sends > 1
            && (self.pending_bytes > self.max_queued_bytes || sends > self.max_queued_sends)
        {
            return Err(CloseReason::Backlog {
                bytes: self.pending_bytes,
                sends,
            });
        }
        Ok(())
    }

    fn pump_sends(&mut self) -> Result<(), CloseReason> {
        match self.pump_queued() {
            Ok(()) => self.flush_sends(),
            Err(reason) => {
                self.forget_batch();
                Err(reason)
            }
        }
    }

    /// Reposts the receives consumed this turn; true when there were any.
    fn repost_receives(&mut self) -> Result<bool, CloseReason> {
        if self.reposts.is_empty() || self.closing.is_some() {
            return Ok(false);
        }
        let n = self.reposts.len();
        for i in 0..n {
            self.post_recv(self.reposts[i])
                .map_err(CloseReason::from_verbs)?;
        }
        self.reposts.clear();
        if let Some(credits) = self.credits.as_mut() {
            credits.handle_reposted(n as u32);
        }
        Ok(true)
    }

    fn pump_queued(&mut self) -> Result<(), CloseReason> {
        while self.closing.is_none() && self.send_outstanding < self.send_depth {
            let Some(next) = self.pending.front() else {
                break;
            };
            let allowed = match (next, &self.credits) {
                // A rendezvous offer also binds a window: two send-queue slots.
                // ... and registers the message: within the budget (waits for Dones).
                (Outgoing::Data { bytes, .. }, Some(c)) if bytes.len() > self.eager_limit() => {
                    c.can_send_data()
                        && self.send_outstanding + 1 < self.send_depth
                        && self.budget_out.fits(bytes.len())
                }
                // A READ of an offer waits for earlier READs to free the budget.
                (Outgoing::Read { len, .. }, _) => self.budget_in.fits(*len),
                (Outgoing::Data { .. } | Outgoing::Done { .. } | Outgoing::Credit, Some(c)) => {
                    c.can_send_data()
                }
                // A WRITE_WITH_IMM uses a peer receive but cannot grant: never the last credit.
                (
                    Outgoing::Op {
                        op_spec: Op::Write { imm: Some(_), .. },
                        ..
                    },
                    Some(c),
                ) => c.send_credits() >= 2,
                _ => true,
            };
            if !allowed {
                crate::metrics::send_stalled();
                break;
            }
            let item = self.dequeue().expect("front exists");
            self.post_outgoing(item)?;
        }
        if self.closing.is_none() && self.send_outstanding < self.send_depth {
            if let Some(credits) = &self.credits {
                if self.established && credits.poll_credit_frame() {
                    self.post_outgoing(Outgoing::Credit)?;
                }
            }
        }
        Ok(())
    }

    fn post_frame(
        &mut self,
        kind: FrameKind,
        tag: u32,
        len: u32,
        body: &[u8],
    ) -> Result<(), CloseReason> {
        let credits = self.credits.as_mut().expect("framed");
        let grant = credits.take_for_send();
        let total = HEADER_LEN + body.len();
        let mut lease = self.send_buffer(total)?;
        let header = Header {
            kind,
            credits: grant,
            len,
            tag,
        };
        let bytes = lease.as_mut_slice();
        header.encode(&mut bytes[..HEADER_LEN]);
        bytes[HEADER_LEN..total].copy_from_slice(body);
        self.post_send_lease(lease, total, SendOp::Send)
    }

    /// Queues a SEND of `lease[..len]`; [`Core::flush_sends`] posts the queued ones with
    /// one doorbell (one system call on software providers) per actor turn.
    fn post_send_lease(&mut self, lease: Lease, len: usize, op: SendOp) -> Result<(), CloseReason> {
        // Signal every SIGNAL_EVERY-th SEND, and always when the send queue is filling
        // up, so a signalled completion is always on its way while slots are scarce.
        let signaled = self.unsignaled.len() + 1 >= SIGNAL_EVERY
            || self.send_outstanding as usize + SIGNAL_EVERY >= self.send_depth as usize;
        let seq = self.send_seq;
        self.send_seq += 1;
        let wr_id = self.inflight.insert(Wr::Send {
            lease: Some(lease),
            seq,
            signaled,
        });
        if !signaled {
            self.unsignaled.push_back((seq, wr_id));
        }
        self.batch.push(QueuedSend { wr_id, len, op });
        self.send_outstanding += 1;
        if self.batch.len() >= MAX_BATCH {
            self.flush_sends()?;
        }
        Ok(())
    }

    /// Posts the SENDs queued by [`Core::post_send_lease`] as one chain. Called at the end
    /// of every pump and before any other send-queue post, so the queue's order is the
    /// order in which work was decided.
    fn flush_sends(&mut self) -> Result<(), CloseReason> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let posted = match self.batch.as_slice() {
            // The common case (one answer per turn) needs no chain.
            [q] => queued_wr(&self.inflight, q)
                .and_then(|wr| self.qp.post_send(&wr).map_err(CloseReason::from_verbs)),
            batch => batch
                .iter()
                .map(|q| queued_wr(&self.inflight, q))
                .collect::<Result<Vec<_>, _>>()
                .and_then(|wrs| {
                    self.qp
                        .post_send_list(&wrs)
                        .map_err(CloseReason::from_verbs)
                }),
        };
        if let Err(reason) = posted {
            self.forget_batch();
            return Err(reason);
        }
        self.batch.clear();
        Ok(())
    }

    /// The connection is ending with SENDs queued but not posted (or with a chain the
    /// provider refused): they must not hold up the drain. A failed post means the QP is
    /// broken; any request of a refused chain that did reach the queue comes back
    /// flushed and is logged as unknown.
    fn forget_batch(&mut self) {
        for q in std::mem::take(&mut self.batch) {
            if let Some(Wr::Send { seq, .. }) = self.inflight.try_remove(q.wr_id) {
                self.unsignaled.retain(|&(s, _)| s != seq);
            }
            self.send_outstanding -= 1;
        }
    }

    /// A buffer for an outgoing SEND of `len` bytes: a spare one of this connection's when
    /// it fits, else a lease from the shared pool (whose lock and reference count are
    /// then paid once per message).
    fn send_buffer(&mut self, len: usize) -> Result<Lease, CloseReason> {
        match self.spare.pop() {
            Some(lease) if lease.len() >= len => Ok(lease),
            other => {
                self.spare.extend(other);
                self.pool.lease(len).map_err(CloseReason::from_pool)
            }
        }
    }

    /// Keeps a completed SEND's buffer for the next one (up to SPARE_BUFFERS of the
    /// smallest size class), or lets it return to the pool.
    fn recycle(&mut self, wr: Wr) {
        if let Wr::Send {
            lease: Some(lease), ..
        } = wr
        {
            if self.spare.len() < SPARE_BUFFERS && lease.len() <= self.pool.smallest() {
                self.spare.push(lease);
            }
        }
    }

    /// A signalled SEND numbered `seq` completed: every unsignalled SEND before it has
    /// completed too (a send queue completes in order), so their slots and buffers return.
    fn release_unsignaled(&mut self, seq: u64) {
        while let Some(&(s, wr_id)) = self.unsignaled.front() {
            if s >= seq {
                break;
            }
            self.unsignaled.pop_front();
            // An unsignalled SEND that failed or was flushed completed on its own and is
            // gone already; its slot may even hold a newer request, so check the seq.
            if matches!(self.inflight.get(wr_id), Some(Wr::Send { seq: q, .. }) if *q == s) {
                let wr = self.inflight.remove(wr_id);
                self.send_outstanding -= 1;
                self.recycle(wr);
            }
        }
    }

    /// Called once the QP is in the error state. Unsignalled SENDs that already
    /// succeeded will never produce a completion, so post one signalled, empty SEND: the
    /// QP flushes it, and its completion accounts for everything before it.
    fn flush_unsignaled(&mut self) {
        if self.unsignaled.is_empty() {
            return;
        }
        let entry = self.inflight.vacant_entry();
        let wr = SendWr::new(entry.key() as u64, SendOp::Send, None);
        match self.qp.post_send(&wr) {
            Ok(()) => {
                let seq = self.send_seq;
                self.send_seq += 1;
                entry.insert(Wr::Send {
                    lease: None,
                    seq,
                    signaled: true,
                });
                self.send_outstanding += 1;
            }
            Err(e) => tracing::warn!(error = %e, "posting the flush marker failed"),
        }
    }

    fn post_outgoing(&mut self, item: Outgoing) -> Result<(), CloseReason> {
        match item {
            Outgoing::Data { tag, bytes } => {
                if bytes.len() <= self.eager_limit() {
                    self.post_frame(FrameKind::Data, tag, bytes.len() as u32, &bytes)
                } else {
                    self.post_rendezvous_offer(tag, bytes)
                }
            }
            Outgoing::Credit => self.post_frame(FrameKind::Credit, 0, 0, &[]),
            Outgoing::Done { tag } => self.post_frame(FrameKind::RendezvousDone, tag, 0, &[]),
            Outgoing::Raw { bytes, imm } => {
                let mut lease = self.send_buffer(bytes.len().max(1))?;
                lease.as_mut_slice()[..bytes.len()].copy_from_slice(&bytes);
                let op = match imm {
                    Some(v) => SendOp::SendWithImm(v),
                    None => SendOp::Send,
                };
                self.post_send_lease(lease, bytes.len(), op)
            }
            Outgoing::Op { op, op_spec } => {
                self.flush_sends()?;
                self.post_op(op, op_spec)
            }
            Outgoing::Read {
                seq,
                tag,
                offer,
                len,
            } => self.post_rendezvous_read(seq, tag, offer, len),
        }
    }

    fn post_op(&mut self, op: OpId, spec: Op) -> Result<(), CloseReason> {
        let buf_id = spec.buf();
        let entry = self
            .bufs
            .get(buf_id.0)
            .ok_or_else(|| CloseReason::Session(format!("{buf_id:?} does not exist")))?;
        let region = entry.buf.region();
        let (send_op, sge) = match &spec {
            Op::Write {
                range, dst, imm, ..
            } => {
                let op = match imm {
                    Some(v) => SendOp::WriteWithImm(*dst, *v),
                    None => SendOp::Write(*dst),
                };
                (op, region.sge(range.clone()))
            }
            Op::Read { range, src, .. } => (SendOp::Read(*src), region.sge(range.clone())),
            Op::CompareSwap {
                offset,
                remote,
                compare,
                swap,
                ..
            } => (
                SendOp::CompareSwap {
                    remote: *remote,
                    compare: *compare,
                    swap: *swap,
                },
                region.sge(*offset..offset + 8),
            ),
            Op::FetchAdd {
                offset,
                remote,
                add,
                ..
            } => (
                SendOp::FetchAdd {
                    remote: *remote,
                    add: *add,
                },
                region.sge(*offset..offset + 8),
            ),
        };
        let sge = sge.map_err(|e| CloseReason::Session(e.to_string()))?;
        let slot = self.inflight.vacant_entry();
        let wr = SendWr::new(slot.key() as u64, send_op, Some(sge));
        self.qp.post_send(&wr).map_err(CloseReason::from_verbs)?;
        slot.insert(Wr::Op { op, buf: buf_id });
        if matches!(spec, Op::Write { imm: Some(_), .. }) {
            if let Some(c) = self.credits.as_mut() {
                c.take_for_imm();
            }
        }
        self.bufs[buf_id.0].inflight += 1;
        self.send_outstanding += 1;
        Ok(())
    }

    /// Handles one received frame; returns messages to deliver in order.
    fn handle_recv(&mut self, slot: usize, wc: &WorkCompletion) -> Result<(), CloseReason> {
        let len = wc.byte_len as usize;
        match self.framing {
            Framing::Raw { .. } => {
                let data = if wc.opcode == WcOpcode::RecvRdmaWithImm {
                    Vec::new()
                } else {
                    self.recv[slot].as_slice()[..len].to_vec()
                };
                // At once: a plain peer has no credits to tell it when a receive is
                // back, and may send its next message as soon as it has our answer.
                self.post_recv(slot).map_err(CloseReason::from_verbs)?;
                self.deliveries.push_back(Delivery::Ready(Message {
                    tag: 0,
                    imm: wc.imm_data,
                    data,
                }));
            }
            Framing::Framed => {
                let data = match wc.opcode {
                    WcOpcode::RecvRdmaWithImm => None,
                    _ => Some(&self.recv[slot].as_slice()[..len]),
                };
                let frame = Frame::parse(data)?;
                self.handle_frame(frame, wc)?;
                self.reposts.push(slot);
            }
        }
        Ok(())
    }

    /// Handles one frame of a framed connection (or a WRITE_WITH_IMM, which consumed a
    /// receive but carries no frame), wherever its receive came from.
    fn handle_frame(&mut self, frame: Frame, wc: &WorkCompletion) -> Result<(), CloseReason> {
        let Some((header, body)) = frame.0 else {
            self.credits
                .as_mut()
                .expect("framed")
                .handle_received(0)
                .map_err(CloseReason::from_credits)?;
            self.deliveries.push_back(Delivery::Ready(Message {
                tag: 0,
                imm: wc.imm_data,
                data: Vec::new(),
            }));
            return Ok(());
        };
        let credits = self.credits.as_mut().expect("framed");
        credits
            .handle_received(header.credits)
            .map_err(CloseReason::from_credits)?;
        match header.kind {
            FrameKind::Data => self.deliveries.push_back(Delivery::Ready(Message {
                tag: header.tag,
                imm: wc.imm_data,
                data: body,
            })),
            FrameKind::Credit => {}
            FrameKind::RendezvousOffer => {
                let len = header.len as usize;
                // Before anything is allocated for it.
                self.budget_in
                    .check(len)
                    .map_err(|e| CloseReason::Protocol(e.to_string()))?;
                let seq = self.next_seq;
                self.next_seq += 1;
                self.deliveries.push_back(Delivery::Waiting(seq));
                self.queue(Outgoing::Read {
                    seq,
                    tag: header.tag,
                    offer: RendezvousOffer::decode(&body),
                    len,
                });
            }
            FrameKind::RendezvousDone => self.handle_rendezvous_done(header.tag)?,
        }
        Ok(())
    }
}

/// A received frame: its header and body bytes, or `None` for a WRITE_WITH_IMM.
struct Frame(Option<(Header, Vec<u8>)>);

impl Frame {
    fn parse(bytes: Option<&[u8]>) -> Result<Frame, CloseReason> {
        let Some(bytes) = bytes else {
            return Ok(Frame(None));
        };
        let (header, body) =
            Header::decode(bytes).map_err(|e| CloseReason::Protocol(e.to_string()))?;
        Ok(Frame(Some((header, body.to_vec()))))
    }
}

/// The work request for a SEND queued by [`Core::post_send_lease`].
fn queued_wr<'a>(inflight: &'a Slab<Wr>, q: &QueuedSend) -> Result<SendWr<'a>, CloseReason> {
    let Some(Wr::Send {
        lease: Some(lease),
        signaled,
        ..
    }) = inflight.get(q.wr_id)
    else {
        unreachable!("a queued SEND owns its lease");
    };
    let sge = lease.sge(0..q.len).map_err(CloseReason::from_verbs)?;
    let mut wr = SendWr::new(q.wr_id as u64, q.op, Some(sge));
    wr.inline = q.len <= INLINE_MAX;
    wr.signaled = *signaled;
    Ok(wr)
}

impl Core {
    /// Handles one completion. Returns an op result for the session when the completion
    /// belongs to a one-sided operation it posted.
    fn handle_completion(
        &mut self,
        wc: &WorkCompletion,
    ) -> Result<Option<(OpId, crate::verbs::Result<()>)>, CloseReason> {
        if let Some(slot) = SharedRecv::slot_of(wc.wr_id) {
            self.handle_shared_recv(slot, wc)?;
            return Ok(None);
        }
        let Some(wr) = self.inflight.try_remove(wc.wr_id as usize) else {
            tracing::warn!(wr_id = wc.wr_id, "completion for an unknown work request");
            return Ok(None);
        };
        if !matches!(wr, Wr::Recv(_)) {
            self.send_outstanding -= 1;
        }
        if let Wr::Probe = wr {
            self.liveness.probe_completed();
            tracing::debug!(qp = self.qp.qp_num(), status = ?wc.status, "keepalive probe completed");
            if self.closing.is_some() {
                return Ok(None);
            }
            return match wc.ok() {
                Ok(_) => Ok(None),
                Err(e) => Err(CloseReason::from_completion(e)),
            };
        }
        if let Wr::Send { seq, signaled, .. } = wr {
            if signaled {
                self.release_unsignaled(seq);
            }
            if self.closing.is_some() {
                return Ok(None);
            }
            if let Err(e) = wc.ok() {
                return Err(CloseReason::from_completion(e));
            }
            self.recycle(wr);
            return Ok(None);
        }
        if let Wr::Op { op, buf } = &wr {
            // Reported even while closing: the operation's own status (a remote access
            // error, say) is more useful to the session than "disconnected".
            self.release_buf(*buf);
            return Ok(Some((*op, wc.ok().map(|_| ()))));
        }
        if self.closing.is_some() {
            return Ok(None);
        }
        if let Err(e) = wc.ok() {
            return Err(CloseReason::from_completion(e));
        }
        match wr {
            Wr::Recv(slot) => self.handle_recv(slot, wc)?,
            Wr::Send { .. } | Wr::Op { .. } | Wr::Bind | Wr::Probe => {}
            Wr::RendezvousRead {
                buf,
                seq,
                tag,
                key,
                len,
                ..
            } => {
                let data = buf.region().as_slice()[..len].to_vec();
                self.budget_in.release(len);
                if let Some(d) = self
                    .deliveries
                    .iter_mut()
                    .find(|d| matches!(d, Delivery::Waiting(s) if *s == seq))
                {
                    *d = Delivery::Ready(Message {
                        tag,
                        imm: None,
                        data,
                    });
                }
                self.queue(Outgoing::Done { tag: key });
            }
        }
        Ok(None)
    }

    /// A receive from the shared queue: the bytes are copied out and the buffer goes back
    /// to the queue at once (even while closing: the other connections need it). A
    /// framed connection then settles its credits with the queue's reserve: the buffer
    /// is posted again already, so the grant can ride the answer to this very frame.
    fn handle_shared_recv(&mut self, slot: usize, wc: &WorkCompletion) -> Result<(), CloseReason> {
        let Some(shared) = &self.shared_recv else {
            tracing::warn!(
                wr_id = wc.wr_id,
                "shared receive on a connection without one"
            );
            return Ok(());
        };
        let data = shared.take(slot, wc).map_err(CloseReason::from_verbs)?;
        if self.closing.is_some() {
            return Ok(());
        }
        let Some(data) = data else {
            return Err(CloseReason::Completion(format!(
                "shared receive on QP {} completed with {}",
                wc.qp_num, wc.status
            )));
        };
        let imm = wc.opcode == WcOpcode::RecvRdmaWithImm;
        if let Framing::Framed = self.framing {
            let frame = Frame::parse((!imm).then_some(&data[..]))?;
            self.handle_frame(frame, wc)?;
            if let (Some(credits), Some(m)) = (self.credits.as_mut(), &self.membership) {
                credits.settle(m.reserve());
            }
            return Ok(());
        }
        self.deliveries.push_back(Delivery::Ready(Message {
            tag: 0,
            imm: wc.imm_data,
            data: if imm { Vec::new() } else { data },
        }));
        Ok(())
    }

    fn next_delivery(&mut self) -> Option<Message> {
        match self.deliveries.front() {
            Some(Delivery::Ready(_)) => match self.deliveries.pop_front() {
                Some(Delivery::Ready(m)) => {
                    self.last_message = Instant::now();
                    self.metrics.iter().for_each(|c| c.message_in(m.data.len()));
                    Some(m)
                }
                _ => None,
            },
            _ => None,
        }
    }

    fn release_buf(&mut self, id: BufId) {
        if let Some(e) = self.bufs.get_mut(id.0) {
            e.inflight -= 1;
            if e.freed && e.inflight == 0 {
                self.bufs.remove(id.0);
            }
        }
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        self.drop_rendezvous_windows();
        // The peer's credits die with the QP; what it borrowed goes back to the reserve.
        if let (Some(credits), Some(m)) = (self.credits.as_mut(), &self.membership) {
            credits.release_borrowed(m.reserve());
        }
    }
}

/// What a session can do with its connection, handed to every [`Session`] callback.
pub struct SessionCx<'a> {
    core: &'a mut Core,
    close: Option<String>,
}

impl<'a> SessionCx<'a> {
    fn new(core: &'a mut Core) -> Self {
        SessionCx { core, close: None }
    }

    /// Sends a framed message with `tag` (any size up to the connection's
    /// `max_message` and rendezvous budget: small ones go inline, large ones through an
    /// RDMA READ rendezvous). Queued when out of credits or budget.
    pub fn send(&mut self, tag: u32, data: Vec<u8>) -> Result<(), SessionError> {
        self.core
            .metrics
            .iter()
            .for_each(|c| c.message_out(data.len()));
        if self.core.credits.is_none() {
            return Err(SessionError::new("send on a raw connection; use send_raw"));
        }
        if data.len() > self.core.eager_limit() {
            self.core.budget_out.check(data.len()).map_err(|e| {
                SessionError::new(format!("message of {} bytes refused: {e}", data.len()))
            })?;
        }
        self.core.queue(Outgoing::Data { tag, bytes: data });
        Ok(())
    }

    /// Answers `msg` (same tag).
    pub fn reply(&mut self, msg: &Message, data: Vec<u8>) -> Result<(), SessionError> {
        self.send(msg.tag, data)
    }

    /// Sends bytes as one plain SEND (raw connections), optionally with an immediate.
    pub fn send_raw(&mut self, data: &[u8], imm: Option<u32>) -> Result<(), SessionError> {
        self.core
            .metrics
            .iter()
            .for_each(|c| c.message_out(data.len()));
        if self.core.credits.is_some() {
            return Err(SessionError::new(
                "send_raw on a framed connection; use send",
            ));
        }
        if data.len() > self.core.pool.largest() {
            return Err(SessionError::new(format!(
                "raw message of {} bytes is too large",
                data.len()
            )));
        }
        self.core.queue(Outgoing::Raw {
            bytes: data.to_vec(),
            imm,
        });
        Ok(())
    }

    /// Leases a local buffer from the shared pool, for one-sided operations.
    pub fn alloc(&mut self, len: usize) -> Result<BufId, SessionError> {
        let lease = self
            .core
            .pool
            .lease(len)
            .map_err(|e| SessionError::new(e.to_string()))?;
        Ok(self.insert_buf(Buf::Pooled(lease), None))
    }

    /// Registers a buffer with `access` (for regions the peer may read or write). It is
    /// deregistered, revoking the rkey, when freed or when the connection ends.
    ///
    /// Remote access is granted through a type 2 memory window bound to this
    /// connection's QP: the rkey from [`SessionCx::remote`] works for this peer only (any
    /// other connection on the shared PD gets a remote access error), and freeing the
    /// buffer deallocates the window, revoking it. The bind is posted here, ahead of any
    /// message that carries the rkey.
    pub fn register(&mut self, len: usize, access: Access) -> Result<BufId, SessionError> {
        let remote = access.remote_part();
        if remote == Access::NONE {
            let mr = MemoryRegion::register(&self.core.pd, len, access)
                .map_err(|e| SessionError::new(e.to_string()))?;
            return Ok(self.insert_buf(Buf::Registered(mr), None));
        }
        let err = |e: VerbsError| SessionError::new(e.to_string());
        let mr = MemoryRegion::register(&self.core.pd, len, Access::LOCAL_WRITE | Access::MW_BIND)
            .map_err(err)?;
        let window = MemoryWindow::alloc(&self.core.pd).map_err(err)?;
        if self.core.send_outstanding >= self.core.send_depth {
            return Err(SessionError::new(
                "send queue full; cannot bind a window now",
            ));
        }
        let slot = self.core.inflight.vacant_entry();
        let grant = self
            .core
            .qp
            .bind_window(slot.key() as u64, &window, &mr, remote)
            .map_err(err)?;
        slot.insert(Wr::Bind);
        self.core.send_outstanding += 1;
        Ok(self.insert_buf(Buf::Registered(mr), Some((window, grant))))
    }

    /// Hands a region the application registered (on this connection's PD) to the
    /// connection, so operations can use it in place: no copy into a pool buffer. Get it
    /// back with [`take_back`](Self::take_back) once its operations completed.
    pub fn adopt(&mut self, region: MemoryRegion) -> Result<BufId, SessionError> {
        if !region.pd().same_as(&self.core.pd) {
            return Err(SessionError::new(
                "the region is registered on another protection domain",
            ));
        }
        Ok(self.insert_buf(Buf::Registered(region), None))
    }

    /// Returns a buffer from [`adopt`](Self::adopt) (or [`register`](Self::register), if
    /// it was registered without remote access) to the caller. `None`, and the buffer
    /// stays, while operations still use it, for a pool buffer or one with a window
    /// bound; `None` for an unknown id.
    pub fn take_back(&mut self, id: BufId) -> Option<MemoryRegion> {
        match self.core.bufs.get(id.0) {
            Some(BufEntry {
                grant: None,
                buf: Buf::Registered(_),
                inflight: 0,
                freed: false,
            }) => {}
            _ => return None,
        }
        match self.core.bufs.remove(id.0).buf {
            Buf::Registered(region) => Some(region),
            Buf::Pooled(_) => unreachable!("checked above"),
        }
    }

    fn insert_buf(&mut self, buf: Buf, grant: Option<(MemoryWindow, RemoteRegion)>) -> BufId {
        BufId(self.core.bufs.insert(BufEntry {
            grant,
            buf,
            inflight: 0,
            freed: false,
        }))
    }

    /// Frees a buffer: the peer's access (if granted) is revoked at once, the memory goes
    /// after the operations using it complete.
    pub fn free(&mut self, id: BufId) {
        if let Some(e) = self.core.bufs.get_mut(id.0) {
            // Revoke the peer's access now, even if our own operations still use the bytes.
            e.grant = None;
            e.freed = true;
            if e.inflight == 0 {
                self.core.bufs.remove(id.0);
            }
        }
    }

    fn entry(&self, id: BufId) -> Result<&BufEntry, SessionError> {
        self.core
            .bufs
            .get(id.0)
            .filter(|e| !e.freed)
            .ok_or_else(|| SessionError::new(format!("{id:?} does not exist")))
    }

    /// The bytes of a buffer.
    pub fn bytes(&self, id: BufId) -> Result<&[u8], SessionError> {
        Ok(self.entry(id)?.buf.region().as_slice())
    }

    /// The bytes of a buffer, mutably.
    pub fn bytes_mut(&mut self, id: BufId) -> Result<&mut [u8], SessionError> {
        self.entry(id)?;
        Ok(self.core.bufs[id.0].buf.region_mut().as_mut_slice())
    }

    /// What the peer needs to reach a buffer registered with remote access (addr, len,
    /// and the rkey of the window bound to this connection).
    pub fn remote(&self, id: BufId) -> Result<RemoteRegion, SessionError> {
        let e = self.entry(id)?;
        Ok(match &e.grant {
            Some((_, grant)) => *grant,
            None => e.buf.region().remote(),
        })
    }

    /// Posts a one-sided operation; its completion arrives in [`Session::on_op`].
    pub fn post(&mut self, op: Op) -> Result<OpId, SessionError> {
        self.entry(op.buf())?;
        let id = OpId(self.core.next_op);
        self.core.next_op += 1;
        self.core.queue(Outgoing::Op {
            op: id,
            op_spec: op,
        });
        Ok(id)
    }

    /// The local QP number.
    pub fn qp_num(&self) -> u32 {
        self.core.qp_num()
    }

    /// Closes the connection after this callback returns.
    pub fn close(&mut self, reason: impl Into<String>) {
        self.close = Some(reason.into());
    }
}

impl CloseReason {
    fn from_verbs(e: VerbsError) -> CloseReason {
        CloseReason::Verbs(e.to_string())
    }
    fn from_pool(e: PoolError) -> CloseReason {
        CloseReason::Memory(e.to_string())
    }
    pub(crate) fn from_credits(e: CreditError) -> CloseReason {
        CloseReason::Protocol(e.to_string())
    }
    /// A failed work request: `PeerUnreachable` when the transport gave up retrying (the
    /// peer stopped acknowledging), `Completion` for every other status.
    pub(crate) fn from_completion(e: VerbsError) -> CloseReason {
        Self::from_failed(&e, &e)
    }
    /// A session's operation `op` failed with `e`: the same split as `from_completion`,
    /// naming the operation.
    pub(crate) fn from_failed_op(op: OpId, e: &VerbsError) -> CloseReason {
        Self::from_failed(e, &format_args!("{op:?} failed: {e}"))
    }
    /// `PeerUnreachable` when `e` says the transport gave up retrying, else `Completion`;
    /// `what` describes the failure.
    fn from_failed(e: &VerbsError, what: &dyn std::fmt::Display) -> CloseReason {
        match e.completion_status() {
            Some(WcStatus::RetryExceeded) => CloseReason::PeerUnreachable(format!(
                "no ACK after the transport's retries ({what})"
            )),
            _ => CloseReason::Completion(what.to_string()),
        }
    }
}
