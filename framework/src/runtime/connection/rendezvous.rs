//! Large messages by rendezvous: the bytes exposed to this peer alone, for its RDMA
//! READ, until it says Done; and the peer's offers READ into memory of ours.
//!
//! Both directions are bounded by the connection's budget (`proto::budget`) and count
//! against the pool's cap: an offer's length comes from the peer, so it is checked
//! before anything is allocated, and a peer that never says Done loses its access (and
//! the connection) at the deadline instead of keeping our memory registered forever.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use std::time::Instant;

use std::sync::{mpsc, Arc};

use super::offers::{IncomingOffer, PendingOffer, Registration, RendezvousOut};
use super::pool_wait::Waiting;
use super::wr::BindOf;
use super::{Buf, Chunk, CloseReason, Core, Delivery, Outgoing, Pump, Wr};
use crate::memory::{Ask, MrPool, PlaceInLine, PoolError, RegisteredChunks};
use crate::proto::budget::BudgetError;
use crate::proto::frame::{FrameKind, RendezvousOffer, OFFER_LEN};
use crate::runtime::service::Incoming;
use crate::transport::{Domain as _, QueuePair as _, Region as _, Transport};
use crate::verbs::{Access, RemoteRegion, SendOp};

/// Drops `out` (its window, then its registration, then its count in the pool) on the
/// registration threads: deregistering unpins every page of the message.
fn release_away<T: Transport>(out: RendezvousOut<T>) {
    crate::runtime::registrar::run(move || drop(out));
}

impl<T: Transport> Core<T> {
    /// True when the front of the queue is a message too large to go inline.
    pub(super) fn front_is_large(&self) -> bool {
        matches!(self.pending.front(), Some(Outgoing::Data { bytes, .. })
            if self.credits.is_some() && bytes.len() > self.eager_limit())
    }

    /// Turns the large message at the front of the queue into a [`PendingOffer`] once
    /// the outgoing budget (which waits for the peer's Dones) and the pool (which waits
    /// for room, see [`Core::take_from_pool`]) allow it, and starts registering it where
    /// it lies (no copy, see [`MemoryRegion::register_vec`]) with `MW_BIND` and no
    /// remote access, away from this thread. False while it waits.
    pub(super) fn begin_offer(&mut self) -> Result<bool, CloseReason> {
        let Some(Outgoing::Data { bytes, .. }) = self.pending.front() else {
            return Ok(false);
        };
        let len = bytes.len();
        if !self.budget_out.fits(len) {
            return Ok(false);
        }
        let Some(charge) = self.take_from_pool(Waiting::Offer, Ask::Charge(len), |pool, me| {
            pool.charge_in_turn(len, me)
        })?
        else {
            return Ok(false);
        };
        let Some(Outgoing::Data { tag, bytes }) = self.pending.pop_front() else {
            unreachable!("the front was a message")
        };
        self.budget_out.take(len);
        let registration = self.register_away(bytes)?;
        // Same bytes held as before: `pending_bytes` needs no change.
        self.pending
            .push_front(Outgoing::Offer(Box::new(PendingOffer {
                tag,
                len,
                charge,
                registration,
            })));
        Ok(true)
    }

    /// Registers `bytes` on the registration threads, which pump this connection when
    /// done; here and now when there is no actor to pump (nothing has started it yet).
    fn register_away(&self, bytes: Vec<u8>) -> Result<Registration<T>, CloseReason> {
        let Some(mailbox) = self.mailbox.clone() else {
            return self
                .pd
                .register_vec(bytes, Access::MW_BIND)
                .map(Registration::Done)
                .map_err(CloseReason::from_verbs);
        };
        let (tx, rx) = mpsc::sync_channel(1);
        let pd = self.pd.clone();
        crate::runtime::registrar::run(move || {
            // A closed connection drops the receiver, and the registration with it.
            let _ = tx.send(pd.register_vec(bytes, Access::MW_BIND));
            mailbox.pump(Pump::Registered);
        });
        Ok(Registration::Running(rx))
    }

    /// Offers a registered message by rendezvous: binds a window to this QP over
    /// exactly its bytes with REMOTE_READ, and sends the offer. Least access for the
    /// shortest time: only this peer can READ, only those bytes, and only until it says
    /// Done (the window is deallocated then, at the deadline, or when the connection
    /// closes). Needs two send-queue slots (the bind, then the offer), which `pump`
    /// checks.
    ///
    /// Not a window over a pool chunk: rxe checks a READ through a window against the
    /// range of the MR underneath, not the window's (observed in the Soft-RoCE VM, see
    /// `tests/verbs/shared_grants.rs`), so a window over one chunk of a pool arena would let
    /// the peer read every chunk of that arena. An MR of exactly the message bounds it on
    /// any provider.
    pub(super) fn post_rendezvous_offer(
        &mut self,
        offer: PendingOffer<T>,
    ) -> Result<(), CloseReason> {
        let PendingOffer {
            tag,
            len,
            charge,
            registration: Registration::Done(mr),
        } = offer
        else {
            unreachable!("offered once registered (see `pump_queued`)")
        };
        let buf = Buf::Registered(mr);
        let window = self.pd.alloc_window().map_err(CloseReason::from_verbs)?;
        let key = self.rendezvous_out.insert(RendezvousOut {
            _window: window,
            _buf: buf,
            _charge: charge,
            len,
            tag,
            offered: self.now,
        });
        // The bind is a batch of its own: what was decided before it goes first, the
        // offer that carries its rkey after it.
        let remote = self.queue_bind(BindOf::Offer(key), Access::REMOTE_READ);
        // A slab index of offers out, bounded by the budget: far below u32::MAX.
        let key = u32::try_from(key).unwrap_or(u32::MAX);
        let offer = RendezvousOffer {
            addr: remote.addr,
            rkey: remote.rkey,
            key,
        };
        let mut body = [0u8; OFFER_LEN];
        offer.encode(&mut body);
        // At most `max_message`, which the configuration bounds to a frame's u32.
        let len = u32::try_from(len).map_err(|_| {
            CloseReason::Session(format!("a message of {len} bytes: too large for a frame"))
        })?;
        self.post_frame(FrameKind::RendezvousOffer, tag, len, &body)
    }

    /// `take` from the pool; `None` when the pool is at a limit, and this connection is
    /// pumped again when its turn in the pool's line comes (see `pool_wait.rs`). The
    /// pool's cap is shared, but what the others hold goes back on its own (their peers
    /// READ it and say Done, or its deadline revokes it), while each connection's own use
    /// is bounded by its budgets: so a connection that meets a full pool waits its turn
    /// instead of being closed for what others took. Only an ask larger than the pool
    /// could ever give ends it.
    pub(super) fn take_from_pool<R>(
        &mut self,
        what: Waiting,
        ask: Ask,
        take: impl Fn(&MrPool<T>, Option<&PlaceInLine<RegisteredChunks<T>>>) -> Result<R, PoolError>,
    ) -> Result<Option<R>, CloseReason> {
        let can_wait = |e: &PoolError, pool: &MrPool<T>| match e {
            PoolError::Exhausted { .. } => true,
            PoolError::ChargeRefused { len, .. } => *len <= pool.bulk_limit(),
            PoolError::HeapFull { len, .. } => *len <= pool.heap_limit(),
            _ => false,
        };
        match take(&self.pool, self.pool_waits.place(what)) {
            Ok(t) => {
                self.pool_waits.served(what);
                return Ok(Some(t));
            }
            Err(e) if !can_wait(&e, &self.pool) || self.mailbox.is_none() => {
                return Err(CloseReason::from_pool(e))
            }
            Err(_) if self.pool_waits.place(what).is_some() => return Ok(None),
            Err(_) => {}
        }
        let room = self.mailbox.clone().expect("checked above");
        crate::metrics::pool_wait();
        let place = self.pool.join_line(
            ask,
            Arc::new(move || {
                room.pump(Pump::PoolRoom);
            }),
        );
        // Memory that came back before the place was taken woke nobody.
        match take(&self.pool, Some(&place)) {
            Ok(t) => Ok(Some(t)),
            Err(e) if can_wait(&e, &self.pool) => {
                self.pool_waits.wait(what, place, self.now);
                Ok(None)
            }
            Err(e) => Err(CloseReason::from_pool(e)),
        }
    }

    /// The deadline of this connection's waits for the pool (see `pool_wait.rs`).
    pub(super) fn pool_deadline(&self) -> Option<Instant> {
        self.pool_waits.deadline()
    }

    /// The pool waits' deadlines at `now`: an outgoing message whose offer
    /// waited past the limit is handed back to the session as refused; an incoming offer
    /// whose READ did not start is refused to the peer. Both leave the queue; the
    /// connection goes on.
    pub(super) fn expire_pool_waits(&mut self, now: Instant) {
        // Offers and READs wait only at the front of the queue, so at most one of them
        // waits at a time, for the front item.
        let front_len = match self.pending.front() {
            Some(Outgoing::Data { bytes, .. }) => bytes.len(),
            Some(Outgoing::Read { len, .. }) => *len,
            _ => 0,
        };
        for (what, why) in self.pool_waits.expire(now, front_len) {
            tracing::warn!(qp = self.qp.qp_num(), %why, "a message gave up waiting for the pool");
            let expected = matches!(
                (what, self.pending.front()),
                (Waiting::Offer, Some(Outgoing::Data { .. }))
                    | (Waiting::Read, Some(Outgoing::Read { .. }))
            );
            // A place is held only for the front item, and given up when it leaves.
            debug_assert!(expected, "{what:?} waited for another front");
            if !expected {
                continue;
            }
            match self.dequeue() {
                Some(Outgoing::Data { tag, .. }) => self.refusals.push_back((tag, why)),
                Some(Outgoing::Read { seq, offer, .. }) => {
                    self.deliveries
                        .retain(|d| !matches!(d, Delivery::Waiting(s) if *s == seq));
                    self.pending.push_front(Outgoing::Refuse {
                        key: offer.key,
                        why,
                    });
                }
                _ => unreachable!("checked above"),
            }
        }
    }

    /// The peer will not take the offer `key` (too large for it): revoke the window,
    /// free the memory, and tell the session which message it was.
    pub(super) fn handle_rendezvous_refused(
        &mut self,
        key: u32,
        why: BudgetError,
    ) -> Result<(), CloseReason> {
        let tag = self.finish_offer(key, || {
            format!("refusal of unknown rendezvous region {key}")
        })?;
        self.refusals.push_back((tag, why));
        Ok(())
    }

    /// The peer READ the offer `key`: revoke its window, free the memory, release the
    /// budget.
    pub(super) fn handle_rendezvous_done(&mut self, key: u32) -> Result<(), CloseReason> {
        self.finish_offer(key, || format!("rendezvous done for unknown region {key}"))?;
        Ok(())
    }

    /// The offer `key` is over (READ or refused): its budget released, its window
    /// revoked and its memory freed away from this thread. Its message's tag; an
    /// unknown key is the peer's protocol error, described by `unknown`.
    fn finish_offer(
        &mut self,
        key: u32,
        unknown: impl FnOnce() -> String,
    ) -> Result<u32, CloseReason> {
        let out = self
            .rendezvous_out
            .try_remove(key as usize)
            .ok_or_else(|| CloseReason::Protocol(unknown()))?;
        self.budget_out.release(out.len);
        let tag = out.tag;
        release_away(out);
        Ok(tag)
    }

    /// Takes the peer's offer of `len` bytes (checked against the budget when it arrived;
    /// `pump` waited until it fits the bytes in use): its bytes are READ in chunks by
    /// [`Core::post_read_chunks`].
    pub(super) fn start_rendezvous_read(
        &mut self,
        seq: u64,
        tag: u32,
        offer: RendezvousOffer,
        len: usize,
    ) {
        self.budget_in.take(len);
        let heap = self.heap_charge.take();
        self.rendezvous_in.push_back(IncomingOffer {
            seq,
            tag,
            offer,
            len,
            data: Vec::new(),
            posted: 0,
            _heap: heap,
        });
    }

    /// Posts READs of the offers being taken, oldest first, one chunk
    /// (`ConnectionConfig::rendezvous_chunk`) at a time into a pool buffer, at most
    /// `rendezvous_chunks` chunks in flight. A large message then never holds the
    /// poller thread for long (each completion copies one chunk into the message), pins
    /// no memory beyond those chunks, and reaches the provider in pieces: Soft-RoCE
    /// answers one READ request in a single burst, so a 16 MiB READ would make every
    /// other connection's packets wait behind 16 MiB of responses.
    pub(super) fn post_read_chunks(&mut self) -> Result<(), CloseReason> {
        for i in 0..self.rendezvous_in.len() {
            loop {
                let m = &self.rendezvous_in[i];
                if m.posted == m.len {
                    break;
                }
                if self.read_chunks_in_flight >= self.rendezvous_chunks
                    || self.send_outstanding >= self.send_depth
                    || self.closing.is_some()
                {
                    return Ok(());
                }
                let m = &self.rendezvous_in[i];
                // `posted < len` (checked above), and the offer's `addr + len` was checked
                // not to wrap when it arrived; checked again here, whatever the profile.
                let (offset, len) = (
                    m.posted,
                    self.rendezvous_chunk.min(m.len.saturating_sub(m.posted)),
                );
                let Some(addr) = m.offer.addr.checked_add(offset as u64) else {
                    return Err(CloseReason::Protocol(format!(
                        "a rendezvous offer at {:#x}: offset {offset} wraps around the address space",
                        m.offer.addr
                    )));
                };
                let remote = RemoteRegion {
                    addr,
                    len: len as u64,
                    rkey: m.offer.rkey,
                };
                let seq = m.seq;
                let Some(lease) =
                    self.take_from_pool(Waiting::Chunk, Ask::Lease(len), |pool, me| {
                        pool.lease_in_turn(len, me)
                    })?
                else {
                    return Ok(());
                };
                let wr_id = self
                    .inflight
                    .insert(Wr::RendezvousChunk { lease, seq, len });
                // At most `rendezvous_chunks`; `posted + len <= len` of the message.
                self.read_chunks_in_flight = self.read_chunks_in_flight.saturating_add(1);
                let m = &mut self.rendezvous_in[i];
                m.posted = m.posted.saturating_add(len);
                self.queue_send(wr_id, SendOp::Read(remote), Some(0..len));
            }
        }
        Ok(())
    }

    /// A chunk of the offer `seq` was READ into `lease[..len]`. Chunks of a message are
    /// posted in order on one send queue, so they complete in order: each is appended.
    /// The last one makes the message ready and answers Done (the peer revokes its
    /// window).
    pub(super) fn handle_read_chunk(
        &mut self,
        seq: u64,
        chunk: &Chunk<T>,
        len: usize,
    ) -> Result<(), CloseReason> {
        self.read_chunks_in_flight = self.read_chunks_in_flight.saturating_sub(1);
        let Some(at) = self.rendezvous_in.iter().position(|m| m.seq == seq) else {
            return Ok(());
        };
        let m = &mut self.rendezvous_in[at];
        if m.data.is_empty() {
            // The length came from the peer (within the budget): a refused allocation
            // ends this connection with the reason, never the process.
            m.data
                .try_reserve_exact(m.len)
                .map_err(|e| CloseReason::Memory(format!("a message of {} bytes: {e}", m.len)))?;
        }
        // In place where the transport lends the bytes (verbs), else copied out.
        match chunk.bytes() {
            Some(bytes) => m.data.extend_from_slice(&bytes[..len]),
            None => {
                let start = m.data.len();
                // Reserved for the whole message above: `start + len <= m.len`.
                m.data.resize(start.saturating_add(len), 0);
                chunk
                    .read(0, &mut m.data[start..])
                    .map_err(CloseReason::from_verbs)?;
            }
        }
        if m.data.len() < m.len {
            return Ok(());
        }
        let m = self.rendezvous_in.remove(at).expect("found above");
        self.budget_in.release(m.len);
        if let Some(d) = self
            .deliveries
            .iter_mut()
            .find(|d| matches!(d, Delivery::Waiting(s) if *s == seq))
        {
            *d = Delivery::Ready(Incoming {
                tag: m.tag,
                imm: None,
                data: m.data,
            });
        }
        self.queue(Outgoing::Done { tag: m.offer.key });
        Ok(())
    }

    /// When the oldest offer runs out of time (see [`Core::poll_timeout`]).
    pub(super) fn offers_deadline(&self) -> Option<Instant> {
        let oldest = self.rendezvous_out.iter().map(|(_, o)| o.offered).min()?;
        // A configured deadline; far past any clock, an offer never expires.
        oldest.checked_add(self.rendezvous_deadline)
    }

    /// Offers older than the deadline at `now` are revoked (window deallocated) and
    /// freed at once, and the connection must close: its peer did not say Done in time.
    pub(super) fn expire_offers(&mut self, now: Instant) -> Result<(), CloseReason> {
        let deadline = self.rendezvous_deadline;
        let expired: Vec<usize> = self
            .rendezvous_out
            .iter()
            .filter(|(_, o)| o.offered.checked_add(deadline).is_some_and(|at| at <= now))
            .map(|(key, _)| key)
            .collect();
        if expired.is_empty() {
            return Ok(());
        }
        let mut bytes = 0;
        for key in &expired {
            let out = self.rendezvous_out.remove(*key);
            bytes = out.len.saturating_add(bytes);
            self.budget_out.release(out.len);
        }
        Err(CloseReason::Protocol(format!(
            "{} rendezvous offer(s) of {bytes} bytes in all not released by the peer \
             (no Done) within {deadline:?}; revoked",
            expired.len()
        )))
    }
}

impl<T: Transport> Core<T> {
    /// Windows hold a reference on the QP they are bound to (rxe waits for it when the
    /// QP is destroyed): the rendezvous windows go before the fields drop, QP included.
    pub(super) fn drop_rendezvous_windows(&mut self) {
        self.rendezvous_out.clear();
    }
}
