//! The send side of a connection: work decided by the session is queued, then posted as
//! credits and send-queue room allow (frames, rendezvous offers and reads, one-sided
//! operations), SENDs batched under one doorbell per turn and signalled selectively.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use super::pool_wait::Waiting;
use super::{
    Chunk, Core, Goodbye, Op, Outgoing, Wr, SIGNAL_EVERY, SPARE_BODIES, SPARE_BODY_BYTES,
    SPARE_BUFFERS,
};
use crate::memory::Ask;
use crate::proto::frame::{close_reason_body, FrameKind, Header, HEADER_LEN};
use crate::runtime::close::CloseReason;
use crate::runtime::service::OpId;
use crate::transport::{Region as _, Transport};
use crate::verbs::SendOp;

impl<T: Transport> Core<T> {
    /// Largest message sent inline in a frame: it must fit the peer's receive buffers
    /// as well as ours (a frame larger than the receive it lands in fails the peer's QP).
    pub(super) fn eager_limit(&self) -> usize {
        // The peer's size is raised to more than a header when it is set.
        self.recv_size
            .min(self.peer_recv_size)
            .saturating_sub(HEADER_LEN)
    }

    /// Decides and posts as much queued work as credits and the send queue allow, then
    /// the receives consumed this turn, then the credit frame that may call for (see
    /// `post.rs`). What
    /// stays queued must fit the connection's bound (see [`Core::check_backlog`]).
    pub(super) fn pump(&mut self) -> Result<(), CloseReason> {
        self.pump_sends()?;
        // The turn's answers go out first (a raw connection's receives, queued as they
        // were consumed, go just before them: see `post.rs`); a framed connection's
        // receives follow, and the frame that grants their credits after them.
        self.cut();
        if self.repost_receives()? {
            self.cut();
            self.pump_sends()?;
            self.cut();
        }
        self.check_backlog()
    }

    /// Queues work for [`Core::pump`], counting its bytes.
    pub(super) fn queue(&mut self, item: Outgoing<T>) {
        // Bytes held in this process: they fit a usize.
        self.pending_bytes = self.pending_bytes.saturating_add(item.bytes());
        self.pending.push_back(item);
    }

    /// Takes the next queued work item.
    pub(super) fn dequeue(&mut self) -> Option<Outgoing<T>> {
        let item = self.pending.pop_front()?;
        self.pending_bytes = self.pending_bytes.saturating_sub(item.bytes());
        Some(item)
    }

    /// Drops everything queued (the connection is closing), and leaves the pool's lines:
    /// nothing here waits any more.
    pub(super) fn clear_queue(&mut self) {
        self.pending.clear();
        self.pending_bytes = 0;
        self.pool_waits.clear();
    }

    /// Checked after each pump, when everything that could be posted was: what is left
    /// waits for the peer (credits, receives, acknowledgements). A peer that asks for
    /// answers and never takes them would make that grow without end, so past the bound
    /// the connection closes. A single message is always allowed, however large.
    pub(super) fn check_backlog(&self) -> Result<(), CloseReason> {
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

    pub(super) fn pump_sends(&mut self) -> Result<(), CloseReason> {
        match self.pump_queued().and_then(|()| self.post_read_chunks()) {
            Ok(()) => Ok(()),
            Err(reason) => {
                // What this turn decided after the last cut is dropped; what was cut
                // before still goes out ahead of the goodbye.
                self.forget_open();
                Err(reason)
            }
        }
    }

    pub(super) fn pump_queued(&mut self) -> Result<(), CloseReason> {
        while self.closing.is_none() && self.send_outstanding < self.send_depth {
            // A large message is registered away from this thread first (see
            // `begin_offer`), and offered once that is done.
            if self.front_is_large() && !self.begin_offer()? {
                crate::metrics::send_stalled();
                break;
            }
            if let Some(Outgoing::Offer(offer)) = self.pending.front_mut() {
                if !offer.poll_registered()? {
                    break;
                }
            }
            let Some(next) = self.pending.front() else {
                break;
            };
            let allowed = match (next, &self.credits) {
                // A rendezvous offer also binds a window: two send-queue slots.
                (Outgoing::Offer(_), Some(c)) => {
                    c.can_send_data() && self.send_outstanding.saturating_add(1) < self.send_depth
                }
                // A READ of an offer waits for earlier READs to free the budget.
                (Outgoing::Read { len, .. }, _) => self.budget_in.fits(*len),
                (
                    Outgoing::Data { .. }
                    | Outgoing::Done { .. }
                    | Outgoing::Refuse { .. }
                    | Outgoing::Credit,
                    Some(c),
                ) => c.can_send_data(),
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
            // A READ also needs its message's room in the server-wide heap budget:
            // waited for like pool memory (this connection is pumped once some comes
            // back), so a burst of large messages on many connections queues instead
            // of growing the heap without bound.
            if let Some(&Outgoing::Read { len, .. }) = self.pending.front() {
                match self.take_from_pool(Waiting::Read, Ask::Heap(len), |pool, me| {
                    pool.charge_heap_in_turn(len, me)
                })? {
                    Some(charge) => self.heap_charge = Some(charge),
                    None => {
                        crate::metrics::send_stalled();
                        break;
                    }
                }
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

    pub(super) fn post_frame(
        &mut self,
        kind: FrameKind,
        tag: u32,
        len: u32,
        body: &[u8],
    ) -> Result<(), CloseReason> {
        let (lease, total) = self.frame_in_buffer(kind, tag, len, body)?;
        self.post_send_lease(lease, total, SendOp::Send)
    }

    /// A send buffer holding one frame (header with a credit taken and everything owed
    /// granted, then `body`), and the frame's length.
    fn frame_in_buffer(
        &mut self,
        kind: FrameKind,
        tag: u32,
        len: u32,
        body: &[u8],
    ) -> Result<(Chunk<T>, usize), CloseReason> {
        let total = HEADER_LEN.saturating_add(body.len());
        let mut lease = self.send_buffer(total)?;
        let grant = self.credits.as_mut().expect("framed").take_for_send();
        let header = Header {
            kind,
            credits: grant,
            len,
            tag,
        };
        let mut encoded = [0u8; HEADER_LEN];
        header.encode(&mut encoded);
        lease
            .write(0, &encoded)
            .and_then(|()| lease.write(HEADER_LEN, body))
            .map_err(CloseReason::from_verbs)?;
        Ok((lease, total))
    }

    /// Queues a SEND of `lease[..len]`, posted with the turn's other requests under one
    /// doorbell (see `post.rs`).
    pub(super) fn post_send_lease(
        &mut self,
        lease: Chunk<T>,
        len: usize,
        op: SendOp,
    ) -> Result<(), CloseReason> {
        // Signal every SIGNAL_EVERY-th SEND, and always when the send queue is filling
        // up, so a signalled completion is always on its way while slots are scarce.
        let signaled = self.unsignaled.len().saturating_add(1) >= SIGNAL_EVERY
            || (self.send_outstanding as usize).saturating_add(SIGNAL_EVERY)
                >= self.send_depth as usize;
        let seq = self.send_seq;
        // A u64 count of SENDs: it never wraps in practice.
        self.send_seq = self.send_seq.wrapping_add(1);
        let wr_id = self.inflight.insert(Wr::Send {
            lease: Some(lease),
            seq,
            signaled,
        });
        if !signaled {
            self.unsignaled.push_back((seq, wr_id));
        }
        self.queue_send(wr_id, op, Some(0..len));
        Ok(())
    }

    /// A buffer for an outgoing SEND of `len` bytes: a spare one of this connection's when
    /// it fits, else a lease from the shared pool (whose lock and reference count are
    /// then paid once per message).
    pub(super) fn send_buffer(&mut self, len: usize) -> Result<Chunk<T>, CloseReason> {
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
    pub(super) fn recycle(&mut self, wr: Wr<T>) {
        if let Wr::Send {
            lease: Some(lease), ..
        } = wr
        {
            if self.spare.len() < SPARE_BUFFERS && lease.len() <= self.pool.smallest() {
                self.spare.push(lease);
            }
        }
    }

    /// Keeps a small message body, copied into its send buffer already, for the next
    /// frame received (see [`SPARE_BODIES`]).
    fn recycle_body(&mut self, body: Vec<u8>) {
        if self.spare_bodies.len() < SPARE_BODIES && body.capacity() <= SPARE_BODY_BYTES {
            self.spare_bodies.push(body);
        }
    }

    /// A signalled SEND numbered `seq` completed: every unsignalled SEND before it has
    /// completed too (a send queue completes in order), so their slots and buffers return.
    pub(super) fn release_unsignaled(&mut self, seq: u64) {
        while let Some(&(s, wr_id)) = self.unsignaled.front() {
            if s >= seq {
                break;
            }
            self.unsignaled.pop_front();
            // An unsignalled SEND that failed or was flushed completed on its own and is
            // gone already; its slot may even hold a newer request, so check the seq.
            if matches!(self.inflight.get(wr_id), Some(Wr::Send { seq: q, .. }) if *q == s) {
                let wr = self.inflight.remove(wr_id);
                self.send_outstanding = self.send_outstanding.saturating_sub(1);
                self.recycle(wr);
            }
        }
    }

    /// Called once the QP is in the error state. Unsignalled SENDs that already
    /// succeeded will never produce a completion, so post one signalled, empty SEND: the
    /// QP flushes it, and its completion accounts for everything before it.
    pub(super) fn flush_unsignaled(&mut self) {
        if self.unsignaled.is_empty() {
            return;
        }
        self.post_flush_marker();
    }

    /// Posts the signalled, empty SEND that the QP (in the error state) flushes: its
    /// completion comes after every completion already in the CQ, receives included
    /// (one CQ serves both queues), which is what a shared receive queue, whose
    /// receives are not flushed with the QP, gives no other way to know.
    pub(super) fn post_flush_marker(&mut self) {
        let seq = self.send_seq;
        // A u64 count of SENDs: it never wraps in practice.
        self.send_seq = self.send_seq.wrapping_add(1);
        let wr_id = self.inflight.insert(Wr::Send {
            lease: None,
            seq,
            signaled: true,
        });
        self.queue_send(wr_id, SendOp::Send, None);
        self.cut();
    }

    pub(super) fn post_outgoing(&mut self, item: Outgoing<T>) -> Result<(), CloseReason> {
        match item {
            Outgoing::Data { tag, bytes } => {
                // Inline data is within the eager limit, below a receive buffer's size.
                let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
                let posted = self.post_frame(FrameKind::Data, tag, len, &bytes);
                self.recycle_body(bytes);
                posted
            }
            Outgoing::Offer(offer) => self.post_rendezvous_offer(*offer),
            Outgoing::Credit => self.post_frame(FrameKind::Credit, 0, 0, &[]),
            Outgoing::Done { tag } => self.post_frame(FrameKind::RendezvousDone, tag, 0, &[]),
            Outgoing::Raw { bytes, imm } => {
                let mut lease = self.send_buffer(bytes.len().max(1))?;
                lease.write(0, &bytes).map_err(CloseReason::from_verbs)?;
                let op = match imm {
                    Some(v) => SendOp::SendWithImm(v),
                    None => SendOp::Send,
                };
                self.post_send_lease(lease, bytes.len(), op)
            }
            Outgoing::Op { op, op_spec } => self.post_op(op, op_spec),
            Outgoing::Read {
                seq,
                tag,
                offer,
                len,
            } => {
                self.start_rendezvous_read(seq, tag, offer, len);
                self.post_read_chunks()
            }
            Outgoing::Refuse { key, why } => {
                self.post_frame(FrameKind::Refuse, key, 0, &why.encode())
            }
        }
    }

    pub(super) fn post_op(&mut self, op: OpId, spec: Op) -> Result<(), CloseReason> {
        let buf_id = spec.buf();
        let entry = self
            .bufs
            .get(buf_id.0)
            .ok_or_else(|| CloseReason::Session(format!("{buf_id:?} does not exist")))?;
        let region = entry.buf.region();
        let (send_op, bytes) = match &spec {
            Op::Write {
                range, dst, imm, ..
            } => {
                let op = match imm {
                    Some(v) => SendOp::WriteWithImm(*dst, *v),
                    None => SendOp::Write(*dst),
                };
                (op, range.clone())
            }
            Op::Read { range, src, .. } => (SendOp::Read(*src), range.clone()),
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
                atomic_range(*offset)?,
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
                atomic_range(*offset)?,
            ),
        };
        // The range is checked now, as the session's mistake, rather than when posted.
        region
            .sge(bytes.clone())
            .map_err(|e| CloseReason::Session(e.to_string()))?;
        let wr_id = self.inflight.insert(Wr::Op { op, buf: buf_id });
        if matches!(spec, Op::Write { imm: Some(_), .. }) {
            if let Some(c) = self.credits.as_mut() {
                c.take_for_imm();
            }
        }
        // Operations in flight on one buffer: at most the send queue's depth.
        self.bufs[buf_id.0].inflight = self.bufs[buf_id.0].inflight.saturating_add(1);
        self.queue_send(wr_id, send_op, Some(bytes));
        Ok(())
    }
}

impl<T: Transport> Core<T> {
    /// Tells the peer why the connection ends, with a `Close` frame, when that is
    /// possible and worth it: a framed connection whose QP still works
    /// (the reason is not the peer's doing or a failed transport), with a credit and a
    /// send-queue slot. True when the frame was posted: the caller keeps the QP up until
    /// it completes (the peer has it then) or a short timer runs out. Best effort by
    /// design: a peer that is out of credits or gone learns only of the disconnect.
    pub(super) fn post_goodbye(&mut self, reason: &CloseReason) -> bool {
        let tells = qp_still_works(reason);
        // Not `established`: the passive side's QP is ready to send once accepted, and
        // the client's first message (a bad one, say) can arrive before ESTABLISHED
        // does. A QP that cannot send yet refuses the post, and nothing is waited for.
        let room = self.send_outstanding < self.send_depth
            && self.credits.as_ref().is_some_and(|c| c.send_credits() >= 1);
        if !tells || !room {
            return false;
        }
        let text = reason.to_string();
        let body = close_reason_body(&text);
        let Ok((lease, total)) = self.frame_in_buffer(
            FrameKind::Close,
            0,
            // Cut to CLOSE_REASON_MAX bytes.
            u32::try_from(body.len()).unwrap_or(u32::MAX),
            body,
        ) else {
            return false;
        };
        let wr_id = self.inflight.insert(Wr::Goodbye { lease });
        self.queue_send(wr_id, SendOp::Send, Some(0..total));
        self.cut();
        // Until the driver's post says otherwise (a refused post forgets it as failed).
        self.goodbye = Goodbye::Posted;
        true
    }

    /// A raw connection closing for a reason that leaves its QP working, with SENDs
    /// posted and not yet completed: true, and the caller keeps the QP up until they
    /// complete (the newest is signalled, see [`Core::signal_last_of_batch`]) or a
    /// short timer runs out. What was queued and not posted is dropped, as on any close.
    pub(super) fn await_sends(&mut self, reason: &CloseReason) -> bool {
        if self.credits.is_some() || !qp_still_works(reason) || self.send_outstanding == 0 {
            return false;
        }
        self.goodbye = Goodbye::Sends;
        true
    }

    /// True while a `Close` frame is on its way or the peer has yet to answer it with
    /// its disconnect, or a raw connection's last SENDs have yet to complete.
    pub(super) fn saying_goodbye(&self) -> bool {
        match self.goodbye {
            Goodbye::Posted | Goodbye::Delivered => true,
            Goodbye::Sends => self.send_outstanding > 0,
            Goodbye::NotSent | Goodbye::Failed => false,
        }
    }
}

/// Whether a connection closing for `reason` still has a working QP to the peer (the
/// reason is not the peer's doing or a failed transport): worth telling it why, and
/// letting what was posted reach it first.
fn qp_still_works(reason: &CloseReason) -> bool {
    !matches!(
        reason,
        CloseReason::PeerDisconnected
            | CloseReason::PeerClosed(_)
            | CloseReason::PeerUnreachable(_)
            | CloseReason::Completion(_)
            | CloseReason::HandshakeTimeout(_)
            | CloseReason::DeviceLost(_)
    )
}

/// The 8 bytes of an atomic at `offset` of a session's buffer; an offset whose end is
/// past the address space is the session's mistake, as a range past its buffer is.
fn atomic_range(offset: usize) -> Result<std::ops::Range<usize>, CloseReason> {
    offset
        .checked_add(8)
        .map(|end| offset..end)
        .ok_or_else(|| CloseReason::Session(format!("an atomic at offset {offset}: out of range")))
}
