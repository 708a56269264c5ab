//! One connection per cm_id. Its [`Core`] (this file) owns the QP, the receive buffers
//! (its own, or a share of a shared queue), the work requests in flight (a slab whose
//! index is the wr_id) and the credit window. The rest, one idea per file, in layers
//! that import only downwards (`scripts/check-cycles` fails a cycle):
//! - at the bottom, what the core's state is made of, none of which names `Core`:
//!   `buf.rs` (a session's buffers and granted windows, [`BufId`]), `offers.rs` (the
//!   state of rendezvous messages), `wr.rs` (what a work request in flight was, what
//!   waits to be posted, [`Op`]), `liveness.rs` (the keepalive policy), `pool_wait.rs`,
//!   and `mailbox.rs` (what reaches the connection from outside its turn);
//! - the core, in this file, and its behaviour, each file an `impl Core`: `send.rs`
//!   (queued work posted as credits and the send queue allow), `post.rs` (the one place
//!   work reaches the QP), `recv.rs` (receives turned into deliveries), `rendezvous.rs`
//!   (large messages through RDMA READ), `timeout.rs` (deadlines, keepalive and idle);
//! - what a session can do with it, [`SessionCx`]: `cx.rs`, `grants.rs`, `wake.rs`;
//! - the driver: `lifecycle.rs` (completions in from the poller, session callbacks,
//!   one timer, teardown on every path), `handshake.rs` (the accept or connect call
//!   that lets the QP start) and `actor.rs` (the actor carrying the mailbox).
//!
//! Teardown order: `rdma_disconnect`, QP to the error state, wait until every posted
//! work request has come back (successful or flushed), then drop the QP, the cm_id and
//! the buffers, and tell the CM actor. The flushes are drained, never waited on blindly:
//! a timer forces the end if a provider loses some.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use slab::Slab;

// Clocks and counters of our own, no peer's value: not under the lint above.
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod actor;
mod blocking;
mod buf;
// Clocks and counters of our own, no peer's value: not under the lint above.
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod cx;
mod doorbell;
mod grants;
mod handshake;
mod lifecycle;
// Clocks and counters of our own, no peer's value: not under the lint above.
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod liveness;
mod mailbox;
mod offers;
// Clocks and counters of our own, no peer's value: not under the lint above.
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod pool_wait;
mod post;
mod recv;
mod rendezvous;
mod send;
// Clocks and counters of our own, no peer's value: not under the lint above.
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod timeout;
mod wake;
mod wr;

// The test driver's and the tests' own numbers, not a peer's.
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod harness;
// Test frames built by hand, not a peer's numbers.
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod hostile;
#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests;

pub(crate) use actor::{ConnectionActor, ConnectionParts};
pub(crate) use doorbell::ring;
pub(crate) use handshake::{CmCall, Handshake, HandshakeFailed};
pub(crate) use lifecycle::panic_message;
pub(crate) use mailbox::{CmNotice, ConnClosed};

pub use blocking::BlockingError;
pub use buf::BufId;
pub use cx::SessionCx;
pub use grants::{Grant, GrantId};
pub use harness::{fuzz_connection, fuzz_connection_outcome, Checked, Outcome};
pub use hostile::{adversarial, replay_frames, EXPOSED_LEN, EXPOSED_RKEY};
pub use wake::{AskError, Asked, Blocking, SessionWaker};
pub use wr::Op;

pub(crate) use self::blocking::{BlockingGate, BlockingHandle, ServiceGates};
use self::buf::{Buf, BufEntry, Chunk, GrantEntry};
use self::liveness::Liveness;
use self::mailbox::Mailbox;
pub(crate) use self::mailbox::Pump;
use self::offers::{IncomingOffer, RendezvousOut};
use self::pool_wait::PoolWaits;
pub(crate) use self::post::Work;
pub(super) use self::timeout::Timeout;
use self::wr::{Outbox, Outgoing, Wr};
use super::close::CloseReason;
use super::config::ConnectionConfig;
use super::poller::CqReservation;
use super::recv_groups::Membership;
use super::service::{Framing, Incoming, OpId};
use super::srq::SharedRecv;
use crate::memory::{MrPool, PoolError, RegisteredChunks};
use crate::proto::budget::{Budget, BudgetError};
use crate::proto::credits::{CreditError, CreditWindow};
use crate::proto::frame::HEADER_LEN;
use crate::transport::{QueuePair as _, Transport, Verbs};
use crate::verbs::{VerbsError, WcStatus, WorkCompletion};

/// SENDs up to this size are copied into the work request (the QP's max_inline_data).
pub(crate) const INLINE_MAX: usize = 48;

/// Send buffers a connection keeps for reuse (of the pool's smallest class).
const SPARE_BUFFERS: usize = 4;

/// Message bodies (`Incoming::data`, handed back by `SessionCx::send`) a connection
/// keeps for the next received frames, and the largest capacity kept: a small message
/// then costs no allocation in steady state (an echo's request body is its answer, and
/// comes back here once the answer is in a send buffer). Small and few, so that a
/// connection that was busy once holds at most 2 KiB of them.
const SPARE_BODIES: usize = 4;
const SPARE_BODY_BYTES: usize = 512;

/// Most SENDs posted with one doorbell.
const MAX_BATCH: usize = 32;

/// How long a closing connection waits for its `Close` frame to reach the peer before
/// disconnecting anyway.
const GOODBYE_TIMEOUT: Duration = Duration::from_secs(3);

/// How long teardown waits for flushed completions before giving up on them.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// At most this many SENDs in a row go unsignalled. Each completion costs the poller a
/// CQ entry and the actor a turn; a send's buffer only needs to come back eventually, and
/// a signalled completion on the send queue means every earlier request there is done.
/// About half the default send depth (15): a signalled SEND is always on its way before
/// the queue fills.
const SIGNAL_EVERY: usize = 8;

/// The `Close` frame of a closing connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Goodbye {
    NotSent,
    /// Posted; the QP stays up until it completes (or a short timer runs out).
    Posted,
    /// Delivered: the QP stays up until the peer, having read it, disconnects (or the
    /// timer runs out). Disconnecting at once could reach the peer's connection before
    /// its poller hands it the frame, and the reason would be lost.
    Delivered,
    /// Failed: nothing to wait for.
    Failed,
    /// A raw connection has no `Close` frame: its QP stays up until the SENDs posted
    /// before the close have completed (or the timer runs out). Moving it to the error
    /// state at once flushes those the provider has not transmitted yet (rxe on 6.12,
    /// unlike 6.1, transmits from a work queue after `ibv_post_send` has returned), and
    /// the peer never receives the last answers it is waiting for.
    Sends,
}

enum Delivery {
    Ready(Incoming),
    Waiting(u64),
}

/// Everything a connection owns besides its session. Field order is drop order: windows
/// first, then the QP before the cm_id it was created on and before the memory it could
/// touch.
pub(crate) struct Core<T: Transport = Verbs> {
    // Memory windows hold a reference on the QP they are bound to (rxe waits for it when
    // the QP is destroyed), so the session's buffers and their windows go first.
    bufs: Slab<BufEntry<T>>,
    // Windows over shared regions, for the same reason (see `SessionCx::grant`).
    grants: Slab<GrantEntry<T>>,
    qp: T::Qp,
    /// None for a QP brought up out of band (no rdma_cm).
    id: Option<T::CmId>,
    /// This connection's place in a shared queue of framed connections, with the
    /// reserve its credits borrow from (after `qp`; see `recv_groups.rs`).
    membership: Option<Membership<T>>,
    /// Receives from a queue shared with other connections (after `qp`: the QP goes first).
    shared_recv: Option<SharedRecv<T>>,
    /// The poller's CQ this connection's completions arrive on (`None`: driven by a
    /// test, which polls itself).
    _cq: Option<CqReservation<T>>,
    /// This connection's place under the server's connection limit, given back once
    /// the QP above is destroyed (`None` on a client).
    _slot: Option<crate::runtime::budget::QpSlots>,
    framing: Framing,
    recv: Vec<Chunk<T>>,
    recv_size: usize,
    /// The peer's receive buffer size (framed connections; ours until it is known).
    peer_recv_size: usize,
    /// Receive slots of a framed connection consumed this turn, reposted after the turn's
    /// SENDs are posted: the answer to a message goes out first, and the repost's credit
    /// rides a later frame (credits keep the peer from sending into the gap). Raw
    /// connections repost at once.
    reposts: Vec<usize>,
    credits: Option<CreditWindow>,
    inflight: Slab<Wr<T>>,
    /// Unsignalled SENDs still holding a send-queue slot and their buffer, oldest first,
    /// as (seq, wr_id): released when a later signalled SEND completes.
    unsignaled: VecDeque<(u64, usize)>,
    send_seq: u64,
    /// Buffers of completed small SENDs, reused by the next ones.
    spare: Vec<Chunk<T>>,
    /// Small message bodies to receive the next frames into (see [`SPARE_BODIES`]).
    spare_bodies: Vec<Vec<u8>>,
    /// Work decided and not posted yet, in batches, for the driver (see `post.rs`).
    outbox: Outbox,
    send_outstanding: u32,
    send_depth: u32,
    /// Work decided but not posted yet (no credit, or the send queue is full).
    pending: VecDeque<Outgoing<T>>,
    /// Bytes of the messages in `pending`, bounded by `max_queued_bytes`.
    pending_bytes: usize,
    max_queued_bytes: usize,
    max_queued_sends: usize,
    deliveries: VecDeque<Delivery>,
    rendezvous_out: Slab<RendezvousOut<T>>,
    /// The peer's offers being READ, oldest first.
    rendezvous_in: VecDeque<IncomingOffer<T>>,
    /// Bytes READ per work request, and most such READs in flight at once.
    rendezvous_chunk: usize,
    rendezvous_chunks: u32,
    read_chunks_in_flight: u32,
    /// Our messages the peer refused, as (tag, why), for the session.
    refusals: VecDeque<(u32, BudgetError)>,
    /// Where the `Close` frame to the peer stands while the connection closes.
    goodbye: Goodbye,
    next_op: u64,
    next_seq: u64,
    pool: MrPool<T>,
    pd: T::Domain,
    /// Bytes registered for rendezvous messages being READ from the peer.
    budget_in: Budget,
    /// While shut (see [`Core::gate_messages`]): the largest message read from the peer.
    gated: Option<usize>,
    /// The heap charge taken for the READ about to be posted (see `pump`), moved into
    /// its incoming message.
    heap_charge: Option<crate::memory::HeapCharge<RegisteredChunks<T>>>,
    /// Bytes registered for rendezvous messages offered to the peer, until its Done.
    budget_out: Budget,
    /// How long an offer may wait for the peer's Done (see `rendezvous.rs`).
    rendezvous_deadline: Duration,
    closing: Option<CloseReason>,
    /// While closing: when to stop waiting for the goodbye, or for the flushes of the
    /// drain (see `timeout.rs`).
    close_deadline: Option<Instant>,
    established: bool,
    /// The time of the turn being handled, set by the driver (see `timeout.rs`): the core
    /// reads no clock of its own.
    now: Instant,
    /// When to probe a silent peer (see `liveness.rs`).
    liveness: Liveness,
    /// The next keepalive and idle checks, once established.
    keepalive_at: Option<Instant>,
    idle_at: Option<Instant>,
    /// Close when no message arrived for this long.
    idle_timeout: Option<Duration>,
    /// When the last message was delivered (or the connection was established).
    last_message: Instant,
    /// The way back to this connection from other threads, for `SessionCx::waker` and
    /// for what its queue waits for away from this thread (set when the actor is
    /// created, before the poller can deliver anything; `None` before).
    mailbox: Option<Mailbox>,
    /// Our places in the pool's lines, while something waits for memory (see
    /// `pool_wait.rs`).
    pool_waits: PoolWaits<T>,
    /// Metric handles, set by `count_as` once the service is known.
    metrics: Option<crate::metrics::ConnectionMetrics>,
    /// Where the session's blocking closures wait their turn (see `blocking.rs`).
    pub(crate) blocking: BlockingGate,
}

/// What [`Core::new`] needs: the connection's resources, and its configuration whole.
pub(crate) struct CoreParts<T: Transport = Verbs> {
    pub qp: T::Qp,
    pub id: Option<T::CmId>,
    pub shared_recv: Option<SharedRecv<T>>,
    pub membership: Option<Membership<T>>,
    pub cq: Option<CqReservation<T>>,
    pub framing: Framing,
    pub recv: Vec<Chunk<T>>,
    pub recv_size: usize,
    pub credits: Option<CreditWindow>,
    pub pool: MrPool<T>,
    pub pd: T::Domain,
    /// Checked by [`NodeConfig::validate`](crate::runtime::NodeConfig::validate).
    pub config: ConnectionConfig,
}

impl<T: Transport> Core<T> {
    pub(crate) fn new(p: CoreParts<T>) -> Core<T> {
        let c = p.config;
        let now = Instant::now();
        Core {
            qp: p.qp,
            id: p.id,
            shared_recv: p.shared_recv,
            membership: p.membership,
            _cq: p.cq,
            _slot: None,
            framing: p.framing,
            recv: p.recv,
            recv_size: p.recv_size,
            peer_recv_size: p.recv_size,
            reposts: Vec::new(),
            credits: p.credits,
            inflight: Slab::new(),
            unsignaled: VecDeque::new(),
            send_seq: 0,
            spare: Vec::new(),
            spare_bodies: Vec::new(),
            outbox: Outbox::default(),
            send_outstanding: 0,
            send_depth: c.send_depth,
            pending: VecDeque::new(),
            pending_bytes: 0,
            max_queued_bytes: c.max_queued_bytes,
            max_queued_sends: c.max_queued_sends,
            deliveries: VecDeque::new(),
            bufs: Slab::new(),
            rendezvous_out: Slab::new(),
            rendezvous_in: VecDeque::new(),
            rendezvous_chunk: c.rendezvous_chunk,
            rendezvous_chunks: c.rendezvous_chunks,
            read_chunks_in_flight: 0,
            refusals: VecDeque::new(),
            goodbye: Goodbye::NotSent,
            next_op: 0,
            next_seq: 0,
            pool: p.pool,
            pd: p.pd,
            budget_in: Budget::new(c.rendezvous_budget, c.max_message),
            gated: None,
            heap_charge: None,
            budget_out: Budget::new(c.rendezvous_budget, c.max_message),
            rendezvous_deadline: c.rendezvous_deadline,
            closing: None,
            close_deadline: None,
            established: false,
            now,
            liveness: Liveness::new(c.keepalive_patience()),
            keepalive_at: None,
            idle_at: None,
            idle_timeout: c.idle_timeout,
            last_message: now,
            grants: Slab::new(),
            mailbox: None,
            pool_waits: PoolWaits::new(c.pool_wait),
            metrics: None,
            blocking: BlockingGate::new(
                c.blocking_per_connection,
                c.blocking_queued_per_connection,
            ),
        }
    }

    /// Takes messages of at most `max` bytes from the peer (a service's own limit, below
    /// the node's): larger offers are refused with the reason.
    pub(crate) fn limit_message(&mut self, max: usize) {
        self.budget_in.limit_message(max);
    }

    /// Until the session opens the gate ([`SessionCx::open_gate`]), reads no message of
    /// more than `max` bytes from the peer: a larger offer is refused unread (`TooLarge`,
    /// to the peer as any refusal) and handed to the session too, as a refusal of its tag
    /// ([`Session::on_refused`](crate::runtime::Session::on_refused)). For the
    /// authentication gate, which sends nothing while it waits for the proof, so that no
    /// such refusal can be taken for one of its own messages. The limit of
    /// [`limit_message`](Self::limit_message) applies as well, and alone once open.
    pub(crate) fn gate_messages(&mut self, max: usize) {
        self.gated = Some(max);
    }

    /// Counts this connection in the metrics as a `side` connection of `service`.
    pub(crate) fn count_as(&mut self, side: crate::metrics::Side, service: &str) {
        self.metrics = Some(crate::metrics::ConnectionMetrics::new(side, service));
    }

    pub(crate) fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    /// The QP, for the driver: to post what [`Core::poll_transmit`] gives, and to move
    /// it to the error state at teardown. The core itself never calls it but for its
    /// number.
    pub(crate) fn qp(&self) -> &T::Qp {
        &self.qp
    }

    /// The peer's receive buffers are `size` bytes (from its hello or welcome): frames
    /// to it stay within them.
    /// Holds `slot` of the server's connection budget for as long as this core (and
    /// its QP) lives.
    pub(crate) fn hold_slot(&mut self, slot: crate::runtime::budget::QpSlots) {
        self._slot = Some(slot);
    }

    pub(crate) fn set_peer_recv_size(&mut self, size: u32) {
        self.peer_recv_size = (size as usize).max(HEADER_LEN + 1);
    }

    /// The poller thread that polls this connection's CQ; its actor must run there.
    pub(crate) fn arbiter(&self) -> actix::dev::ArbiterHandle {
        self._cq
            .as_ref()
            .expect("a connection with an actor polls a CQ")
            .arbiter()
    }
}

impl<T: Transport> Core<T> {
    /// Gives back what the connection's last burst of work left allocated for reuse,
    /// once it has nothing in flight: a probe only goes out after a whole keepalive
    /// period of silence, so a connection that probes is idle, and an idle one is what
    /// a server holds by the ten thousand. (Its last unsignalled SENDs were released by
    /// the probe's completion just before.) What is given back: the spare send buffers
    /// (to the pool) and bodies, and the emptied queues' capacity (the first probe alone
    /// grows the work-in-flight slab and the outbox's batches, about 1.8 KiB a
    /// connection). A busy connection never probes, so its hot path keeps its warm
    /// buffers; an idle one pays a few small allocations per keepalive period.
    fn shed_idle(&mut self) {
        let quiet = self.send_outstanding == 0
            && self.unsignaled.is_empty()
            && self.pending.is_empty()
            && self.outbox.is_empty()
            && self.deliveries.is_empty()
            && self.reposts.is_empty();
        if !quiet {
            return;
        }
        // A connection with receives of its own keeps them in flight, and so its slab.
        if self.inflight.is_empty() {
            self.inflight = Slab::new();
        }
        self.outbox = Outbox::default();
        self.spare = Vec::new();
        self.spare_bodies = Vec::new();
        self.unsignaled = VecDeque::new();
        self.pending = VecDeque::new();
        self.deliveries = VecDeque::new();
        self.reposts = Vec::new();
    }

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
        // A wr_id past usize (on a 32-bit host) is no slot of ours: unknown, not cut.
        let slot = usize::try_from(wc.wr_id).ok();
        let Some(wr) = slot.and_then(|s| self.inflight.try_remove(s)) else {
            tracing::warn!(wr_id = wc.wr_id, "completion for an unknown work request");
            return Ok(None);
        };
        if !matches!(wr, Wr::Recv(_)) {
            // Counted up when posted: at least this one is outstanding.
            self.send_outstanding = self.send_outstanding.saturating_sub(1);
        }
        if let Wr::Goodbye { .. } = wr {
            self.goodbye = match wc.ok() {
                Ok(_) => Goodbye::Delivered,
                Err(_) => Goodbye::Failed,
            };
            return Ok(None);
        }
        if let Wr::Probe { after } = wr {
            self.liveness.probe_completed();
            tracing::debug!(qp = self.qp.qp_num(), status = ?wc.status, "keepalive probe completed");
            if self.closing.is_some() {
                return Ok(None);
            }
            return match wc.ok() {
                Ok(_) => {
                    self.release_unsignaled(after);
                    self.shed_idle();
                    Ok(None)
                }
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
            Wr::Send { .. } | Wr::Op { .. } | Wr::Bind | Wr::Probe { .. } | Wr::Goodbye { .. } => {}
            Wr::RendezvousChunk { lease, seq, len } => self.handle_read_chunk(seq, &lease, len)?,
        }
        Ok(None)
    }

    fn release_buf(&mut self, id: BufId) {
        if let Some(e) = self.bufs.get_mut(id.0) {
            // Counted up when posted: at least this one is in flight.
            e.inflight = e.inflight.saturating_sub(1);
            if e.freed && e.inflight == 0 {
                self.bufs.remove(id.0);
            }
        }
    }
}

impl<T: Transport> Drop for Core<T> {
    fn drop(&mut self) {
        self.drop_rendezvous_windows();
        // The peer's credits die with the QP; what it borrowed goes back to the reserve.
        if let (Some(credits), Some(m)) = (self.credits.as_mut(), &self.membership) {
            let (reserve, loan) = m.reserve();
            credits.release_borrowed(reserve, loan);
        }
    }
}

impl CloseReason {
    /// A call into the transport failed (on verbs, a [`VerbsError`]).
    fn from_verbs(e: impl std::fmt::Display) -> CloseReason {
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
    ///
    /// A flush that is the first failure this side sees (it neither closed nor heard the
    /// peer hang up, which `Connection::hung_up_reason` names instead) means the QP left
    /// RTS with no failed request of its own: a responder error, for example the peer's
    /// READ or WRITE refused by this side's rkey or bounds check, ends the QP without a
    /// completion here. Said so, the reason points at the peer's side of the story.
    fn from_failed(e: &VerbsError, what: &dyn std::fmt::Display) -> CloseReason {
        match e.completion_status() {
            Some(WcStatus::RetryExceeded) => CloseReason::PeerUnreachable(format!(
                "no ACK after the transport's retries ({what})"
            )),
            Some(WcStatus::WrFlushError) => CloseReason::Completion(format!(
                "{what}: the QP entered the error state with no failed request of this \
                 side's (the peer's one-sided access to this side's memory failed, or the \
                 device reset the QP)"
            )),
            _ => CloseReason::Completion(what.to_string()),
        }
    }
}
