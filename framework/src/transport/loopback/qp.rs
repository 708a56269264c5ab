//! Queue pairs of the loopback transport: the requester half, which executes a QP's
//! send queue in order.
//!
//! There is no NIC thread. The thread that posts executes: it takes the oldest request,
//! lets go of the queue's lock, moves the bytes into the peer's memory (`responder.rs`),
//! pushes the completions, and goes on with the next, until the queue is empty or the
//! head must wait. Only one thread executes a QP at a time (the `running` flag), so a
//! QP's requests complete in the order they were posted, as RC promises; a request
//! posted while another thread executes is picked up by that thread. A head that must
//! wait (receiver not ready, no answer) stays at the head, and the fabric's clock runs
//! the queue again when the RNR timer or the ACK timeout has passed.
//!
//! The ring is allocated at the QP's send-queue size; small inline payloads are copied
//! into the ring's slot at post time, so nothing is allocated per request.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use super::clock::Tick;
use super::core::{rnr_timer, DeviceCore, Member};
use super::cq::Cq;
use super::error::{LoopbackError, Result};
use super::keys::Binding;
use super::memory::Slice;
use super::mr::{Mr, Mw, Sge};
use super::responder::{Nak, RecvSource, Responder, ERROR, RESET, RTS};
use super::srq::{RecvQueue, Srq};
use super::work::{Op, Pending, Work, MAX_INLINE};
use crate::transport::{RecvWr, SendWr};
use crate::verbs::{
    Access, ConnParam, QpCaps, QpState, RemoteRegion, WcOpcode, WcStatus, WorkCompletion,
};

/// RNR retry count that means "retry for ever", as in the verbs API.
const RNR_FOREVER: u8 = 7;

/// Why a request failed.
enum Failed {
    /// At the responder (which may have gone to the error state as well).
    Remote(Nak),
    /// Locally (a buffer deregistered or without local write, a window gone).
    Local(WcStatus),
}

struct SendQueue {
    pending: VecDeque<Pending>,
    capacity: usize,
    /// A thread is executing the queue.
    running: bool,
    /// The head waits for the clock (RNR timer or ACK timeout).
    waiting: bool,
    /// RNR retries spent on the head.
    rnr_spent: u8,
    /// Unanswered transmissions of the head.
    unanswered: u8,
}

#[derive(Clone, Copy)]
struct Retries {
    retry_count: u8,
    rnr_retry: u8,
}

pub(super) struct QpInner {
    pub(super) resp: Responder,
    send_cq: Cq,
    sq: Mutex<SendQueue>,
    peer: OnceLock<Weak<QpInner>>,
    retries: OnceLock<Retries>,
    ack_timeout_ns: AtomicU64,
    max_inline: usize,
    me: Weak<QpInner>,
}

/// A loopback RC queue pair. Cheap to clone.
#[derive(Clone)]
pub struct Qp {
    pub(super) inner: Arc<QpInner>,
}

impl Qp {
    pub(super) fn create(
        device: &Arc<DeviceCore>,
        send_cq: &Cq,
        recv_cq: &Cq,
        caps: QpCaps,
        srq: Option<&Srq>,
    ) -> Result<Qp> {
        if device.removed.load(Relaxed) {
            return Err(LoopbackError::DeviceRemoved(device.name.clone()));
        }
        let recv = match srq {
            Some(s) => RecvSource::Shared(s.clone()),
            None => RecvSource::Own(RecvQueue::new(caps.max_recv_wr, "receive queue")),
        };
        let config = device.fabric.config;
        let capacity = caps.max_send_wr.max(1) as usize;
        let inner = Arc::new_cyclic(|me| QpInner {
            resp: Responder {
                num: device.fabric.qp_num(),
                device: device.clone(),
                recv,
                recv_cq: recv_cq.clone(),
                state: RESET.into(),
                stalled: false.into(),
                rnr_timer_ns: (config.rnr_timer.as_nanos() as u64).into(),
            },
            send_cq: send_cq.clone(),
            sq: Mutex::new(SendQueue {
                // One more than the queue holds: the head, while a thread executes it, is
                // out of the ring and may come back to its front after more were posted.
                pending: VecDeque::with_capacity(capacity + 1),
                capacity,
                running: false,
                waiting: false,
                rnr_spent: 0,
                unanswered: 0,
            }),
            peer: OnceLock::new(),
            retries: OnceLock::new(),
            ack_timeout_ns: (config.ack_timeout.as_nanos() as u64).into(),
            max_inline: (caps.max_inline_data as usize).min(MAX_INLINE),
            me: me.clone(),
        });
        let member: Weak<dyn Member> = Arc::downgrade(&inner) as Weak<QpInner>;
        device.join(member);
        Ok(Qp { inner })
    }

    /// The QP number: completions carry it.
    pub fn qp_num(&self) -> u32 {
        self.inner.resp.num
    }

    /// The state, in the verbs wrapper's terms (RESET until connected, RTS, ERROR).
    pub fn state(&self) -> QpState {
        match self.inner.resp.state.load(Relaxed) {
            RESET => QpState::Reset,
            RTS => QpState::ReadyToSend,
            _ => QpState::Error,
        }
    }

    /// The CQ its send completions go to.
    pub fn send_cq(&self) -> &Cq {
        &self.inner.send_cq
    }

    /// The CQ its receive completions go to.
    pub fn recv_cq(&self) -> &Cq {
        &self.inner.resp.recv_cq
    }

    /// The shared receive queue it receives from, if any.
    pub fn srq(&self) -> Option<&Srq> {
        match &self.inner.resp.recv {
            RecvSource::Shared(s) => Some(s),
            RecvSource::Own(_) => None,
        }
    }

    /// Posts one send-queue request.
    pub fn post_send(&self, wr: &SendWr<Sge<'_>>) -> Result<()> {
        self.post_send_list(std::slice::from_ref(wr))
    }

    /// Posts requests that execute in order; none of them if one is refused.
    pub fn post_send_list(&self, wrs: &[SendWr<Sge<'_>>]) -> Result<()> {
        if self.inner.resp.state.load(Relaxed) == RESET {
            return Err(LoopbackError::BadState(
                "post_send on a QP not connected yet",
            ));
        }
        let mut sq = self.inner.sq.lock().expect("send queue lock");
        if sq.pending.len() + wrs.len() > sq.capacity {
            return Err(LoopbackError::QueueFull {
                queue: "send queue",
                capacity: sq.capacity,
            });
        }
        let first = sq.pending.len();
        for wr in wrs {
            match Pending::new(wr, self.inner.max_inline) {
                Ok(p) => sq.pending.push_back(p),
                Err(e) => {
                    sq.pending.truncate(first);
                    return Err(e);
                }
            }
        }
        self.inner.kick(sq);
        Ok(())
    }

    /// Posts receives (an error for a QP on a shared receive queue). Receives posted
    /// on a QP in the error state complete at once, flushed.
    pub fn post_recv(&self, wrs: &[RecvWr<Sge<'_>>]) -> Result<()> {
        let RecvSource::Own(queue) = &self.inner.resp.recv else {
            return Err(LoopbackError::InvalidArgument(
                "this QP receives from a shared receive queue; post there".into(),
            ));
        };
        queue.post(wrs)?;
        if self.inner.resp.state.load(Relaxed) == ERROR {
            self.inner.flush_recvs();
        }
        Ok(())
    }

    /// Moves the QP to the error state: every outstanding request and own receive
    /// completes with `WrFlushError`; its peer's requests go unanswered.
    pub fn to_error(&self) -> Result<()> {
        self.inner.fail();
        Ok(())
    }

    /// Sets the RNR timer this QP advertises as a responder (IB code 0..=31).
    pub fn set_min_rnr_timer(&self, code: u8) -> Result<()> {
        let ns = rnr_timer(code).as_nanos() as u64;
        self.inner.resp.rnr_timer_ns.store(ns, Relaxed);
        Ok(())
    }

    /// Sets the ACK timeout (before the QP is connected, as with rdma_cm).
    pub(super) fn set_ack_timeout(&self, timeout: Duration) {
        self.inner
            .ack_timeout_ns
            .store(timeout.as_nanos() as u64, Relaxed);
    }

    /// Binds `window` to this QP over all of `region` with the remote part of
    /// `access`, ordered with the send queue; returns what the peer needs. Only the peer
    /// of this QP can use the rkey, and only until the window is bound again or dropped.
    pub fn bind_window(
        &self,
        wr_id: u64,
        window: &Mw,
        region: &Mr,
        access: Access,
    ) -> Result<RemoteRegion> {
        if !region.access().contains(Access::MW_BIND) {
            return Err(LoopbackError::InvalidArgument(
                "the region was registered without MW_BIND".into(),
            ));
        }
        self.bind_slice(wr_id, window, region.sge_all().slice(), access)
    }

    /// Queues the bind of `window` over `region`'s bytes (a whole region, or a range of
    /// a shared one: the key table checks accesses against exactly these bytes).
    pub(super) fn bind_slice(
        &self,
        wr_id: u64,
        window: &Mw,
        region: Slice,
        access: Access,
    ) -> Result<RemoteRegion> {
        if !Arc::ptr_eq(&window.device, &self.inner.resp.device) {
            return Err(LoopbackError::InvalidArgument(
                "the window belongs to another device".into(),
            ));
        }
        if self.inner.resp.state.load(Relaxed) == RESET {
            return Err(LoopbackError::BadState("bind on a QP not connected yet"));
        }
        let key = window.rkey();
        let new_key = window.next_rkey();
        let mut sq = self.inner.sq.lock().expect("send queue lock");
        if sq.pending.len() >= sq.capacity {
            return Err(LoopbackError::QueueFull {
                queue: "send queue",
                capacity: sq.capacity,
            });
        }
        let remote = RemoteRegion {
            addr: region.storage.base + region.offset as u64,
            len: region.len as u64,
            rkey: new_key,
        };
        window.key.store(new_key, Relaxed);
        sq.pending.push_back(Pending {
            wr_id,
            work: Work::Bind {
                key,
                new_key,
                region,
                access: access.remote_part(),
            },
            local: None,
            inline: None,
            signaled: true,
            solicited: false,
        });
        self.inner.kick(sq);
        Ok(remote)
    }
}

/// Connects two QPs directly, as an out-of-band exchange of QP numbers does (no CM
/// events): each side's requests retry as `param` says. Both must be new.
pub fn connect_pair(a: &Qp, b: &Qp, param: &ConnParam<'_>) -> Result<()> {
    QpInner::connect(&a.inner, &b.inner, param)?;
    QpInner::connect(&b.inner, &a.inner, param)
}

impl QpInner {
    /// Makes `peer` this QP's remote end and moves it to RTS.
    pub(super) fn connect(
        this: &Arc<QpInner>,
        peer: &Arc<QpInner>,
        param: &ConnParam<'_>,
    ) -> Result<()> {
        let retries = Retries {
            retry_count: param.retry_count.min(7),
            rnr_retry: param.rnr_retry_count.min(RNR_FOREVER),
        };
        if this.peer.set(Arc::downgrade(peer)).is_err() || this.retries.set(retries).is_err() {
            return Err(LoopbackError::BadState("the QP is connected already"));
        }
        let _ = this
            .resp
            .state
            .compare_exchange(RESET, RTS, Relaxed, Relaxed);
        Ok(())
    }

    /// Becomes the queue's executor unless another thread is, or the head waits.
    fn kick(self: &Arc<Self>, mut sq: MutexGuard<'_, SendQueue>) {
        if sq.running || (sq.waiting && self.resp.state.load(Relaxed) != ERROR) {
            return;
        }
        sq.running = true;
        drop(sq);
        self.drive();
    }

    fn complete(&self, p: &Pending, status: WcStatus, len: usize) {
        let wc = WorkCompletion {
            wr_id: p.wr_id,
            status,
            opcode: p.opcode(),
            byte_len: len as u32,
            imm_data: None,
            qp_num: self.resp.num,
            vendor_err: 0,
        };
        self.send_cq.inner.push(wc, false);
    }

    /// Executes the queue until it is empty or its head waits. The caller set `running`.
    fn drive(self: &Arc<Self>) {
        loop {
            let mut sq = self.sq.lock().expect("send queue lock");
            if self.resp.state.load(Relaxed) == ERROR {
                for p in std::mem::take(&mut sq.pending) {
                    self.complete(&p, WcStatus::WrFlushError, 0);
                }
                let capacity = sq.capacity + 1;
                sq.pending.reserve(capacity);
                (sq.running, sq.waiting) = (false, false);
                return;
            }
            let halted = self.resp.stalled.load(Relaxed) || !self.resp.device.answers();
            let head = if halted { None } else { sq.pending.pop_front() };
            let Some(p) = head else {
                sq.running = false;
                return;
            };
            drop(sq);
            match self.execute(&p) {
                Ok(len) => {
                    let mut sq = self.sq.lock().expect("send queue lock");
                    (sq.rnr_spent, sq.unanswered) = (0, 0);
                    drop(sq);
                    if p.signaled {
                        self.complete(&p, WcStatus::Success, len);
                    }
                }
                Err(Failed::Local(status)) => self.fail_with(&p, status),
                Err(Failed::Remote(Nak::Fatal(status))) => {
                    if let Some(peer) = self.peer.get().and_then(Weak::upgrade) {
                        peer.fail();
                    }
                    self.fail_with(&p, status);
                }
                Err(Failed::Remote(nak)) => {
                    if let Some(at) = self.retry_later(p, nak) {
                        let me: Weak<dyn Tick> = self.me.clone();
                        self.resp.device.fabric.clock.schedule(at, me);
                        return;
                    }
                }
            }
        }
    }

    /// Puts the head back to wait for `nak`'s retry and returns when to retry, or
    /// fails it when its retries are spent.
    fn retry_later(self: &Arc<Self>, p: Pending, nak: Nak) -> Option<Instant> {
        let retries = self.retries.get().copied().unwrap_or(Retries {
            retry_count: 0,
            rnr_retry: 0,
        });
        let mut sq = self.sq.lock().expect("send queue lock");
        let wait = match nak {
            Nak::Rnr(wait) => {
                sq.rnr_spent = sq.rnr_spent.saturating_add(1);
                if retries.rnr_retry != RNR_FOREVER && sq.rnr_spent > retries.rnr_retry {
                    drop(sq);
                    self.fail_with(&p, WcStatus::RnrRetryExceeded);
                    return None;
                }
                wait
            }
            _ => {
                // Transmissions at 0, t, 2t, ... (retry_count retransmissions); the one
                // after the last wait finds the deadline passed.
                sq.unanswered = sq.unanswered.saturating_add(1);
                if sq.unanswered > retries.retry_count + 1 {
                    drop(sq);
                    self.fail_with(&p, WcStatus::RetryExceeded);
                    return None;
                }
                Duration::from_nanos(self.ack_timeout_ns.load(Relaxed))
            }
        };
        sq.pending.push_front(p);
        (sq.running, sq.waiting) = (false, true);
        Some(Instant::now() + wait)
    }

    /// Completes `p` with `status` and moves the QP to the error state (the executor
    /// then flushes the rest).
    fn fail_with(&self, p: &Pending, status: WcStatus) {
        self.complete(p, status, 0);
        self.resp.state.store(ERROR, Relaxed);
        self.flush_recvs();
    }

    fn execute(&self, p: &Pending) -> Result<usize, Failed> {
        if let Some(local) = &p.local {
            if !local.storage.is_live() {
                return Err(Failed::Local(WcStatus::LocalProtectionError));
            }
        }
        let op = match &p.work {
            Work::Bind {
                key,
                new_key,
                region,
                access,
            } => {
                let binding = Binding {
                    storage: region.storage.clone(),
                    addr: region.storage.base + region.offset as u64,
                    len: region.len as u64,
                    access: *access,
                    qp_num: self.resp.num,
                };
                if !region.storage.is_live() || !self.resp.device.keys.bind(*key, *new_key, binding)
                {
                    return Err(Failed::Local(WcStatus::MemoryWindowBindError));
                }
                return Ok(0);
            }
            Work::Op(op) => *op,
        };
        let Some(peer) = self.peer.get().and_then(Weak::upgrade) else {
            return Err(Failed::Remote(Nak::NoAnswer));
        };
        let peer = &peer.resp;
        let payload = p.payload();
        let len = payload.len();
        let writable = |l: &Slice| l.storage.access.contains(Access::LOCAL_WRITE);
        match op {
            Op::Send(imm) => peer.send(payload, imm, p.solicited),
            Op::Write(remote, imm) => peer.write(payload, remote, imm, p.solicited),
            Op::Read(remote) => match &p.local {
                Some(l) if !writable(l) => {
                    return Err(Failed::Local(WcStatus::LocalProtectionError))
                }
                local => peer.read(remote, local.as_ref()),
            },
            Op::Atomic(remote, atomic) => {
                let Some(l) = p.local.as_ref().filter(|l| writable(l)) else {
                    return Err(Failed::Local(WcStatus::LocalProtectionError));
                };
                let old = peer.atomic(remote, atomic).map_err(Failed::Remote)?;
                l.storage.write(l.offset, &old.to_le_bytes());
                return Ok(8);
            }
        }
        .map_err(Failed::Remote)?;
        Ok(len)
    }

    fn flush_recvs(&self) {
        let RecvSource::Own(queue) = &self.resp.recv else {
            return;
        };
        for r in queue.take_all() {
            let wc = WorkCompletion {
                wr_id: r.wr_id,
                status: WcStatus::WrFlushError,
                opcode: WcOpcode::Recv,
                byte_len: 0,
                imm_data: None,
                qp_num: self.resp.num,
                vendor_err: 0,
            };
            self.resp.recv_cq.inner.push(wc, false);
        }
    }

    /// Moves the QP to the error state and flushes what it holds.
    pub(super) fn fail(self: &Arc<Self>) {
        self.resp.state.store(ERROR, Relaxed);
        self.flush_recvs();
        let sq = self.sq.lock().expect("send queue lock");
        self.kick(sq);
    }
}

impl QpInner {
    /// Runs the queue again from its head (after a wait or a stall).
    pub(super) fn restart(&self) {
        let Some(me) = self.me.upgrade() else { return };
        let mut sq = self.sq.lock().expect("send queue lock");
        sq.waiting = false;
        me.kick(sq);
    }
}

impl Tick for QpInner {
    /// The head's RNR timer or ACK timeout passed: try it again.
    fn tick(&self) {
        self.restart();
    }
}

impl Member for QpInner {
    fn device_lost(&self) {
        if let Some(me) = self.me.upgrade() {
            me.fail();
        }
    }
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("qp_num", &self.qp_num())
            .field("state", &self.state())
            .finish()
    }
}
