//! Work comes out: the core decides, the driver posts.
//!
//! Everything in the core only decides. A send-queue request is recorded in the slab of
//! work in flight (which owns its memory) and queued here as a [`QueuedSend`]; a receive
//! is recorded and queued by its wr_id; a window bind is queued with the rkey it will
//! give. The core never calls the QP's post verbs. The driver asks
//! [`Core::poll_transmit`] for the next batch, posts it on the QP it is lent with it (one
//! doorbell per batch: `doorbell.rs`), and reports how that went to
//! [`Core::transmitted`]. This is the "work comes out" half of a connection core without
//! I/O (issue 28), as in quinn-proto: what is posted is data until the driver rings.
//!
//! A batch is what the turn decided between two cuts ([`Core::cut`]), in order:
//! receives first, then the send-queue requests as one chain. Receives go first because
//! a raw connection's peer has no credits and may send its next message as soon as it
//! has our answer, so the receive it will use must be posted before that answer. A
//! framed connection's pump cuts twice: the turn's answers first (latency: nothing waits
//! ahead of them), then the receives consumed this turn, before any frame that grants
//! their credits (credits keep the peer from sending into the gap).
//!
//! A bind is a batch of its own, after what was decided before it and before what
//! follows (the frame that carries its rkey). Its rkey is known when it is decided
//! ([`Window::next_rkey`]), so the frame can be written at once; the driver checks that
//! the bind gave that rkey.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use std::ops::Range;

use super::wr::{Batch, BindOf, QueuedBind, QueuedSend};
use super::{Core, Goodbye, Wr, INLINE_MAX, MAX_BATCH};
use crate::runtime::close::CloseReason;
use crate::transport::{RecvWr, Region as _, SendWr, Transport};
use crate::verbs::{Access, RemoteRegion, SendOp};

/// The next batch to post, and the QP to post it on (the core owns the QP so that its
/// destruction stays ordered between the windows and the memory; it never posts on it).
pub(crate) struct Transmit<'a, T: Transport> {
    pub qp: &'a T::Qp,
    pub work: Work<'a, T>,
}

/// What one batch asks of the QP.
pub(crate) enum Work<'a, T: Transport> {
    /// `ibv_post_recv` with these receives.
    Recvs(Recvs<'a, T>),
    /// `ibv_post_send` with these requests, one chain.
    Sends(Sends<'a, T>),
    /// A type 2 window bind, which must give `expect`.
    Bind {
        wr_id: u64,
        window: &'a T::Window,
        region: &'a T::Region,
        access: Access,
        expect: RemoteRegion,
    },
}

/// Receives to post, their work requests built on demand (no allocation for one).
pub(crate) struct Recvs<'a, T: Transport> {
    core: &'a Core<T>,
    ids: &'a [usize],
}

impl<'a, T: Transport> Recvs<'a, T> {
    /// Calls `post` with the work requests.
    pub(crate) fn with_wrs<R>(
        &self,
        post: impl FnOnce(&[RecvWr<T::Sge<'a>>]) -> Result<R, T::Error>,
    ) -> Result<R, T::Error> {
        let core = self.core;
        built(self.ids, |&wr_id| core.recv_wr(wr_id), post)
    }
}

/// Send-queue requests to post as one chain, built on demand (no allocation for one).
pub(crate) struct Sends<'a, T: Transport> {
    core: &'a Core<T>,
    queued: &'a [QueuedSend],
}

impl<'a, T: Transport> Sends<'a, T> {
    /// Calls `post` with the work requests, in the order they were decided.
    pub(crate) fn with_wrs<R>(
        &self,
        post: impl FnOnce(&[SendWr<T::Sge<'a>>]) -> Result<R, T::Error>,
    ) -> Result<R, T::Error> {
        let core = self.core;
        built(self.queued, |q| core.send_wr(q), post)
    }
}

/// Calls `post` with the work request `build` makes of each item. One item, the common
/// case (one answer or one repost per turn), needs no chain and so no allocation.
fn built<I, W, R, E>(
    items: &[I],
    build: impl Fn(&I) -> Result<W, E>,
    post: impl FnOnce(&[W]) -> Result<R, E>,
) -> Result<R, E> {
    match items {
        [one] => post(&[build(one)?]),
        many => post(&many.iter().map(build).collect::<Result<Vec<_>, _>>()?),
    }
}

impl<T: Transport> Core<T> {
    /// Queues the send-queue request recorded at `wr_id`, in the open batch (cut at
    /// [`MAX_BATCH`] requests).
    pub(super) fn queue_send(&mut self, wr_id: usize, op: SendOp, bytes: Option<Range<usize>>) {
        // At most the send queue's depth (a u32).
        self.send_outstanding = self.send_outstanding.saturating_add(1);
        self.outbox.open.sends.push(QueuedSend { wr_id, op, bytes });
        if self.outbox.open.sends.len() >= MAX_BATCH {
            self.cut();
        }
    }

    /// Queues a receive into the buffer of `slot`.
    pub(super) fn queue_recv(&mut self, slot: usize) {
        let wr_id = self.inflight.insert(Wr::Recv(slot));
        self.outbox.open.recvs.push(wr_id);
    }

    /// Queues a bind of `of`'s window over its whole region with `access`, in a batch of
    /// its own, and returns what it will give the peer. The caller checked that the send
    /// queue has room.
    pub(super) fn queue_bind(&mut self, of: BindOf, access: Access) -> RemoteRegion {
        let (window, region) = self.bind_target(of);
        let expect = RemoteRegion {
            rkey: crate::transport::Window::next_rkey(window),
            ..region.remote()
        };
        let wr_id = self.inflight.insert(Wr::Bind);
        // At most the send queue's depth (a u32).
        self.send_outstanding = self.send_outstanding.saturating_add(1);
        self.cut();
        self.outbox.open.bind = Some(QueuedBind {
            wr_id,
            of,
            access,
            expect,
        });
        self.cut();
        expect
    }

    fn bind_target(&self, of: BindOf) -> (&T::Window, &T::Region) {
        match of {
            BindOf::Buf(id) => {
                let e = &self.bufs[id.0];
                let (window, _) = e.grant.as_ref().expect("a bound buffer has a window");
                (window, e.buf.region())
            }
            BindOf::Offer(key) => {
                let out = &self.rendezvous_out[key];
                (&out._window, out._buf.region())
            }
        }
    }

    /// Ends the open batch: what was decided so far goes ahead of what is decided next.
    pub(super) fn cut(&mut self) {
        if self.outbox.open.is_empty() {
            return;
        }
        if self.credits.is_none() {
            self.signal_last_of_batch();
        }
        let next = self.outbox.spare.pop().unwrap_or_default();
        let batch = std::mem::replace(&mut self.outbox.open, next);
        self.outbox.ready.push_back(batch);
    }

    /// The next batch of decided work for the driver to post, or `None` when nothing
    /// is left. Report the post's outcome with [`transmitted`](Self::transmitted) before
    /// asking again.
    pub(crate) fn poll_transmit(&mut self) -> Option<Transmit<'_, T>> {
        self.cut();
        while self.outbox.ready.front().is_some_and(Batch::is_empty) {
            let done = self.outbox.ready.pop_front().expect("checked");
            self.outbox.spare.push(done);
        }
        let front = self.outbox.ready.front()?;
        let work = if !front.recvs.is_empty() {
            Work::Recvs(Recvs {
                core: self,
                ids: &front.recvs,
            })
        } else if !front.sends.is_empty() {
            Work::Sends(Sends {
                core: self,
                queued: &front.sends,
            })
        } else {
            let b = front.bind.as_ref().expect("a batch that is not empty");
            let (window, region) = self.bind_target(b.of);
            Work::Bind {
                wr_id: b.wr_id as u64,
                window,
                region,
                access: b.access,
                expect: b.expect,
            }
        };
        Some(Transmit { qp: &self.qp, work })
    }

    /// How the post of the batch [`poll_transmit`](Self::poll_transmit) gave went. A
    /// post the provider refuses means the QP is broken: everything queued is forgotten
    /// (so the drain does not wait for it) and the connection must close with the reason.
    pub(crate) fn transmitted(
        &mut self,
        posted: Result<(), CloseReason>,
    ) -> Result<(), CloseReason> {
        if let Err(reason) = posted {
            self.forget_queued();
            return Err(reason);
        }
        let front = self.outbox.ready.front_mut().expect("a batch was given");
        if !front.recvs.is_empty() {
            front.recvs.clear();
        } else if !front.sends.is_empty() {
            front.sends.clear();
        } else {
            front.bind = None;
        }
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

    /// The connection is ending, or its QP refused a post, with work decided and not
    /// posted: it never reaches the QP, so nothing will complete for it, and it must not
    /// hold up the drain. Any request of a refused chain that did reach the queue comes
    /// back flushed and is logged as unknown.
    pub(super) fn forget_queued(&mut self) {
        self.forget_open();
        while let Some(batch) = self.outbox.ready.pop_front() {
            self.forget_batch(batch);
        }
    }

    /// Forgets what was decided since the last cut (a turn that failed half way).
    pub(super) fn forget_open(&mut self) {
        let open = std::mem::take(&mut self.outbox.open);
        self.forget_batch(open);
    }

    fn forget_batch(&mut self, mut batch: Batch) {
        for q in batch.sends.drain(..) {
            self.forget_send(q.wr_id);
        }
        for wr_id in batch.recvs.drain(..) {
            self.inflight.try_remove(wr_id);
        }
        if let Some(b) = batch.bind.take() {
            self.forget_send(b.wr_id);
        }
        self.outbox.spare.push(batch);
    }

    fn forget_send(&mut self, wr_id: usize) {
        self.send_outstanding = self.send_outstanding.saturating_sub(1);
        match self.inflight.try_remove(wr_id) {
            Some(Wr::Send { seq, .. }) => self.unsignaled.retain(|&(s, _)| s != seq),
            Some(Wr::Op { buf, .. }) => self.release_buf(buf),
            Some(Wr::RendezvousChunk { .. }) => {
                self.read_chunks_in_flight = self.read_chunks_in_flight.saturating_sub(1);
            }
            Some(Wr::Probe { .. }) => self.liveness.probe_completed(),
            Some(Wr::Goodbye { .. }) => self.goodbye = Goodbye::Failed,
            _ => {}
        }
    }

    /// A raw connection signals the last SEND of every chain it posts, so the newest
    /// SEND on its queue is always signalled: a closing connection learns from its
    /// completion that everything it posted has left (see [`Core::await_sends`]). A
    /// framed connection learns that from its `Close` frame instead.
    fn signal_last_of_batch(&mut self) {
        let Some(last) = self.outbox.open.sends.iter().rev().find(|q| {
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
