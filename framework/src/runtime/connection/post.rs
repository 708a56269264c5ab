//! The one place a connection's work reaches its QP.
//!
//! Everything else in the core only decides: a send-queue request is recorded in the
//! slab of work in flight (which owns its memory) and queued here as a [`QueuedSend`];
//! a receive is recorded and queued by its wr_id. [`Core::transmit`] then posts what
//! the turn decided, receives first and then the sends as one chain under one doorbell,
//! and is the only function of the core that calls the QP's post verbs. This is the
//! "work comes out" half of a connection core without I/O (issue 28): what is posted is
//! data until here, in the order it was decided.
//!
//! Within one [`Core::transmit`], receives go first: a raw connection's peer has no
//! credits and may send its next message as soon as it has our answer, so the receive
//! it will use must be posted before that answer. A framed connection's pump calls it
//! twice: the turn's answers first (latency: nothing waits ahead of them), then the
//! receives consumed this turn, before any frame that grants their credits (credits
//! keep the peer from sending into the gap).
//!
//! Window binds are the exception: a bind names a window object rather than a buffer,
//! and its callers post it at once, after [`Core::transmit`] has posted what was decided
//! before it.

use std::ops::Range;

use super::wr::QueuedSend;
use super::{Core, Wr, INLINE_MAX, MAX_BATCH};
use crate::runtime::CloseReason;
use crate::transport::{QueuePair as _, RecvWr, Region as _, SendWr, Transport};
use crate::verbs::SendOp;

impl<T: Transport> Core<T> {
    /// Queues the send-queue request recorded at `wr_id`; the queue is posted at the end
    /// of the turn, or at once when it holds [`MAX_BATCH`] requests.
    pub(super) fn queue_send(
        &mut self,
        wr_id: usize,
        op: SendOp,
        bytes: Option<Range<usize>>,
    ) -> Result<(), CloseReason> {
        self.send_outstanding += 1;
        self.sends.push(QueuedSend { wr_id, op, bytes });
        if self.sends.len() >= MAX_BATCH {
            self.transmit()?;
        }
        Ok(())
    }

    /// Queues a receive into the buffer of `slot`.
    pub(super) fn queue_recv(&mut self, slot: usize) {
        let wr_id = self.inflight.insert(Wr::Recv(slot));
        self.recvs.push(wr_id);
    }

    /// Posts everything queued: receives first, then the send-queue requests in the
    /// order they were decided. A post the provider refuses means the QP is broken: what
    /// it held is forgotten (so the drain does not wait for it) and the connection must
    /// close with the reason.
    pub(crate) fn transmit(&mut self) -> Result<(), CloseReason> {
        self.transmit_recvs()?;
        self.transmit_sends()
    }

    fn transmit_recvs(&mut self) -> Result<(), CloseReason> {
        let posted = match self.recvs.as_slice() {
            [] => return Ok(()),
            // One repost per turn is the common case: no chain to collect.
            [wr_id] => self.recv_wr(*wr_id).and_then(|wr| self.qp.post_recv(&[wr])),
            ids => ids
                .iter()
                .map(|&wr_id| self.recv_wr(wr_id))
                .collect::<Result<Vec<_>, _>>()
                .and_then(|wrs| self.qp.post_recv(&wrs)),
        };
        let ids = std::mem::take(&mut self.recvs);
        if let Err(e) = posted {
            for wr_id in ids {
                self.inflight.try_remove(wr_id);
            }
            return Err(CloseReason::from_verbs(e));
        }
        // The buffer is reused for the next turn's receives.
        self.recvs = ids;
        self.recvs.clear();
        Ok(())
    }

    fn recv_wr(&self, wr_id: usize) -> Result<RecvWr<T::Sge<'_>>, T::Error> {
        let Some(&Wr::Recv(slot)) = self.inflight.get(wr_id) else {
            unreachable!("a queued receive is recorded as one");
        };
        Ok(RecvWr {
            wr_id: wr_id as u64,
            local: Some(self.recv[slot].sge(0..self.recv_size)?),
        })
    }

    /// Posts the queued send-queue requests as one chain (one doorbell; one system call
    /// on software providers).
    pub(super) fn transmit_sends(&mut self) -> Result<(), CloseReason> {
        if self.sends.is_empty() {
            return Ok(());
        }
        if self.credits.is_none() {
            self.signal_last_of_batch();
        }
        let posted = match self.sends.as_slice() {
            // The common case (one answer per turn) needs no chain.
            [q] => self.send_wr(q).and_then(|wr| self.qp.post_send(&wr)),
            queued => queued
                .iter()
                .map(|q| self.send_wr(q))
                .collect::<Result<Vec<_>, _>>()
                .and_then(|wrs| self.qp.post_send_list(&wrs)),
        };
        if let Err(e) = posted {
            self.forget_sends();
            return Err(CloseReason::from_verbs(e));
        }
        self.sends.clear();
        Ok(())
    }

    /// The work request for `q`, with its memory from its entry in the work in flight.
    fn send_wr(&self, q: &QueuedSend) -> Result<SendWr<T::Sge<'_>>, T::Error> {
        let entry = self
            .inflight
            .get(q.wr_id)
            .expect("a queued request is recorded");
        let (local, signaled, inline) = match (entry, &q.bytes) {
            // A probe, or the flush marker (a SEND recorded as signalled).
            (_, None) => (None, true, false),
            (
                Wr::Send {
                    lease: Some(lease),
                    signaled,
                    ..
                },
                Some(r),
            ) => (
                Some(lease.sge(r.clone())?),
                *signaled,
                r.len() <= INLINE_MAX,
            ),
            (Wr::Goodbye { lease }, Some(r)) => {
                (Some(lease.sge(r.clone())?), true, r.len() <= INLINE_MAX)
            }
            (Wr::RendezvousChunk { lease, .. }, Some(r)) => {
                (Some(lease.sge(r.clone())?), true, false)
            }
            (Wr::Op { buf, .. }, Some(r)) => {
                let region = self.bufs[buf.0].buf.region();
                (Some(region.sge(r.clone())?), true, false)
            }
            _ => unreachable!("only these requests carry bytes"),
        };
        let mut wr = SendWr::new(q.wr_id as u64, q.op, local);
        wr.signaled = signaled;
        wr.inline = inline;
        Ok(wr)
    }

    /// The connection is ending with requests queued but not posted (or with a chain
    /// the provider refused): they must not hold up the drain. Any request of a refused
    /// chain that did reach the queue comes back flushed and is logged as unknown.
    pub(super) fn forget_sends(&mut self) {
        for q in std::mem::take(&mut self.sends) {
            self.send_outstanding -= 1;
            match self.inflight.try_remove(q.wr_id) {
                Some(Wr::Send { seq, .. }) => self.unsignaled.retain(|&(s, _)| s != seq),
                Some(Wr::Op { buf, .. }) => self.release_buf(buf),
                Some(Wr::RendezvousChunk { .. }) => self.read_chunks_in_flight -= 1,
                Some(Wr::Probe) => self.liveness.probe_completed(),
                _ => {}
            }
        }
    }

    /// The connection is torn down: what was queued and not posted never reaches the
    /// QP, so nothing will complete for it.
    pub(super) fn forget_queued(&mut self) {
        self.forget_sends();
        for wr_id in std::mem::take(&mut self.recvs) {
            self.inflight.try_remove(wr_id);
        }
    }

    /// A raw connection signals the last SEND of every chain it posts, so the newest
    /// SEND on its queue is always signalled: a closing connection learns from its
    /// completion that everything it posted has left (see [`Core::await_sends`]). A
    /// framed connection learns that from its `Close` frame instead.
    fn signal_last_of_batch(&mut self) {
        let Some(last) = self.sends.iter().rev().find(|q| {
            matches!(
                self.inflight.get(q.wr_id),
                Some(Wr::Send { lease: Some(_), .. })
            )
        }) else {
            return;
        };
        if let Some(Wr::Send { seq, signaled, .. }) = self.inflight.get_mut(last.wr_id) {
            if !*signaled {
                *signaled = true;
                let seq = *seq;
                // The newest SEND is the newest unsignalled one.
                if self.unsignaled.back().is_some_and(|&(s, _)| s == seq) {
                    self.unsignaled.pop_back();
                }
            }
        }
    }
}
