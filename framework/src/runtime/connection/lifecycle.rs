//! The connection's lifecycle: completions in, session callbacks, timers and teardown on
//! every path. Kept apart from the actor (`actor.rs`) because most of a connection's turns
//! never pass through the actor's mailbox.
//!
//! Measured change from the first design: completions no longer travel through the
//! actor's mailbox. The connection's state sits in an `Rc<RefCell<..>>` shared by its
//! actor and by the poller thread that runs that actor, and the poller hands each batch
//! of completions straight to [`Connection::on_completions`] on its own stack (see
//! `poller::Inbox`). A mailbox hop cost an allocation, a queue push, a task wake-up and a
//! scheduler turn per batch, on both sides of every round trip. Everything else (CM
//! notices, client calls, wake-ups from other threads) still arrives as actor messages.
//!
//! The `RefCell` is never borrowed twice: the poller's pass and the actor's message
//! handlers are separate turns of the same single-threaded arbiter, and nothing under a
//! borrow calls back into the poller or the actor synchronously (messages to the actor
//! are queued, the connection's one timer is a spawned task).
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use std::cell::RefCell;
use std::rc::Weak;
use std::time::Instant;

use actix::prelude::*;
use actix::WeakRecipient;

use super::mailbox::{CmNotice, ConnClosed, Released};
use super::{ring, Core, SessionCx, Timeout};
use crate::runtime::close::CloseReason;
use crate::runtime::poller::{self, Inbox};
use crate::runtime::service::{Session, SessionError};
use crate::runtime::wake_route;
use crate::transport::{CmId as _, QueuePair as _, Transport, Verbs};
use crate::verbs::WorkCompletion;

/// One connection: its resources, its session and how it ends.
pub(crate) struct Connection<S: Session<T>, T: Transport = Verbs> {
    pub(super) core: Option<Core<T>>,
    pub(super) session: S,
    pub(super) cm: Recipient<ConnClosed<T::CmIdKey>>,
    pub(super) key: T::CmIdKey,
    pub(super) label: String,
    pub(super) reason: Option<CloseReason>,
    /// Disconnected and draining (after the goodbye, if one was sent).
    pub(super) torn_down: bool,
    /// The peer hung up while we were open. Its last frames (a Close naming its reason)
    /// may still be in the CQ behind the CM's event, which travels another way: the QP
    /// is flushed and they are read before the close is named (see [`Self::hang_up`]).
    pub(super) hung_up: bool,
    pub(super) released: Vec<tokio::sync::oneshot::Sender<()>>,
    /// Itself, for its timer.
    pub(super) this: Weak<RefCell<Connection<S, T>>>,
    /// Its actor, stopped once everything is released.
    pub(super) actor: WeakRecipient<Released>,
    /// The instant the one timer is armed for (see [`Connection::arm_timer`]).
    pub(super) timer: Option<Instant>,
}

impl<T: Transport, S: Session<T>> Connection<S, T> {
    /// Why the connection is closing or closed (`None` while open).
    pub(crate) fn close_reason(&self) -> Option<&CloseReason> {
        self.reason.as_ref()
    }

    /// Answers `done` once the connection has released its resources.
    pub(crate) fn when_released(&mut self, done: tokio::sync::oneshot::Sender<()>) {
        if self.core.is_none() {
            let _ = done.send(());
        } else {
            self.released.push(done);
        }
    }

    /// Runs `f` with the session and a context, then posts what it queued; an error or a
    /// close request ends the connection, and so does a panic.
    ///
    /// Every call into a session goes through here (or [`catch_session_panic`] directly):
    /// the session runs on the poller thread's stack, and a panic unwinding out of it
    /// would end the poller's task, and with it every connection on that thread, while
    /// the process kept accepting connections nobody polls. Caught here, it ends only
    /// this connection, with the panic's message as the reason.
    pub(crate) fn with_session(
        &mut self,
        f: impl FnOnce(&mut S, &mut SessionCx<'_, T>) -> Result<(), SessionError>,
    ) {
        let Some(core) = self.core.as_mut() else {
            return;
        };
        if core.closing.is_some() {
            return;
        }
        core.set_now(Instant::now());
        if self.call_session(f) {
            self.pump();
        }
    }

    /// [`with_session`](Self::with_session) within a turn whose time is set already
    /// (the deliveries of a batch of completions): no clock read per message, and
    /// nothing posted: the caller pumps once at the end of its turn, so the answers to
    /// every message of a batch go out as one chain under one doorbell (and a shared
    /// queue's turn posts once), not one post per message. Returns true when the
    /// session was called and the connection stays open.
    fn call_session(
        &mut self,
        f: impl FnOnce(&mut S, &mut SessionCx<'_, T>) -> Result<(), SessionError>,
    ) -> bool {
        let Some(core) = self.core.as_mut() else {
            return false;
        };
        if core.closing.is_some() {
            return false;
        }
        let mut cx = SessionCx::new(core);
        let res = catch_session_panic(|| f(&mut self.session, &mut cx));
        let close = cx.close.take();
        match res {
            Err(reason) => self.begin_close(reason),
            Ok(()) => match close {
                Some(why) => self.begin_close(CloseReason::Local(why)),
                None => return true,
            },
        }
        false
    }

    /// Pumps at a time of its own (a wake-up from another thread).
    pub(super) fn pump_now(&mut self) {
        if let Some(core) = self.core.as_mut() {
            core.set_now(Instant::now());
        }
        self.pump();
    }

    /// Decides what the queue allows and posts it, within a turn whose time is set.
    pub(super) fn pump(&mut self) {
        if let Some(core) = self.core.as_mut() {
            if let Err(reason) = core.pump().and_then(|()| ring(core)) {
                self.begin_close(reason);
                return;
            }
        }
        self.arm_timer();
    }

    /// Keeps one timer armed for the core's earliest deadline (see `timeout.rs`): a new
    /// one only when the deadline is earlier than the one armed. A timer that finds a
    /// different instant armed when it fires was replaced and does nothing.
    fn arm_timer(&mut self) {
        let Some(at) = self.core.as_ref().and_then(Core::poll_timeout) else {
            return;
        };
        if self.timer.is_some_and(|armed| armed <= at) {
            return;
        }
        self.timer = Some(at);
        let this = self.this.clone();
        actix::spawn(poller::abort_if_it_panics("connection timer", async move {
            actix::clock::sleep_until(actix::clock::Instant::from_std(at)).await;
            if let Some(conn) = this.upgrade() {
                conn.borrow_mut().on_timer(at);
            }
        }));
    }

    fn on_timer(&mut self, at: Instant) {
        if self.timer != Some(at) {
            return;
        }
        self.timer = None;
        let Some(core) = self.core.as_mut() else {
            return;
        };
        match core.handle_timeout(Instant::now()) {
            Ok(Timeout::Checked) => {
                // A check may have changed the queue (a refusal, a probe).
                self.deliver();
                self.pump();
            }
            Ok(Timeout::CloseOverdue) if self.torn_down => {
                tracing::warn!(
                    conn = %self.label,
                    outstanding = core.inflight.len(),
                    "flushed completions did not all arrive; releasing anyway"
                );
                self.finish();
            }
            Ok(Timeout::CloseOverdue) => self.tear_down(),
            Err(reason) => self.begin_close(reason),
        }
        self.arm_timer();
    }

    pub(crate) fn begin_close(&mut self, reason: CloseReason) {
        let Some(core) = self.core.as_mut() else {
            return;
        };
        if core.closing.is_some() {
            return;
        }
        match &reason {
            // A peer's goodbye (whatever its own reason) is routine: a storm of
            // clients closing must not flood the log at warning level.
            CloseReason::PeerDisconnected
            | CloseReason::PeerClosed(_)
            | CloseReason::Local(_)
            | CloseReason::Shutdown => {
                tracing::info!(conn = %self.label, %reason, "closing")
            }
            _ => tracing::warn!(conn = %self.label, %reason, "closing"),
        }
        core.closing = Some(reason.clone());
        core.clear_queue();
        let session = &mut self.session;
        if let Err(panicked) = catch_session_panic(|| {
            session.on_close(&reason);
            Ok(())
        }) {
            tracing::warn!(conn = %self.label, reason = %panicked, "on_close panicked");
        }
        self.reason = Some(reason.clone());
        let waits = core.post_goodbye(&reason) || core.await_sends(&reason);
        // What was decided before the close goes out, then the goodbye; a QP that refuses
        // them has nothing to wait for.
        if ring(core).is_ok() && waits {
            // The QP stays up until the peer has read the frame (it disconnects then),
            // or a raw connection's last SENDs have left, for a moment at most.
            core.wait_for_goodbye();
            self.arm_timer();
            return;
        }
        let drained_before = self.torn_down;
        self.tear_down();
        // Named while already torn down (the peer hung up, see `hang_up`): the flush
        // may have come back whole.
        if drained_before && self.core.as_ref().is_some_and(|c| c.inflight.is_empty()) {
            self.finish();
        }
    }

    /// The peer disconnected while we were open. Flushes the QP rather than closing at
    /// once: completions come back in CQ order, so a Close frame it sent before hanging
    /// up is read (and names the close) before the flushed receives behind it. Without
    /// one, the close is [`CloseReason::PeerDisconnected`].
    fn hang_up(&mut self) {
        self.hung_up = true;
        self.tear_down();
    }

    /// While hung up and not yet closing, the failure of a flushed work request says
    /// only that the peer is gone; a Close frame from it keeps its reason.
    fn hung_up_reason(&self, reason: CloseReason) -> CloseReason {
        let open = self.core.as_ref().is_some_and(|c| c.closing.is_none());
        match reason {
            CloseReason::PeerClosed(_) => reason,
            _ if self.hung_up && open => CloseReason::PeerDisconnected,
            _ => reason,
        }
    }

    /// Disconnects, moves the QP to the error state and waits (bounded) for every posted
    /// work request to come back before releasing everything. Once per connection.
    fn tear_down(&mut self) {
        let Some(core) = self.core.as_mut() else {
            return;
        };
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        // Both sides may disconnect at once; a second call fails harmlessly.
        if let Some(id) = &core.id {
            let _ = id.disconnect();
        }
        core.forget_queued();
        match core.qp().to_error() {
            Ok(()) => {
                if self.hung_up {
                    // Whatever the peer sent before hanging up is in the CQ ahead of
                    // this marker's flush (see `hang_up`).
                    core.post_flush_marker();
                } else {
                    core.flush_unsignaled();
                }
                if let Err(e) = ring(core) {
                    tracing::warn!(conn = %self.label, error = %e, "posting the flush marker failed");
                }
            }
            Err(e) => {
                tracing::warn!(conn = %self.label, error = %e, "moving the QP to error failed")
            }
        }
        if core.inflight.is_empty() {
            self.finish();
            return;
        }
        core.wait_for_drain();
        self.arm_timer();
    }

    fn finish(&mut self) {
        if self.hung_up && self.core.as_ref().is_some_and(|c| c.closing.is_none()) {
            // Flushed whole (or given up on) without a Close frame: the session hears
            // the plain hang-up. Torn down already, so this does not come back here.
            self.begin_close(CloseReason::PeerDisconnected);
        }
        let Some(core) = self.core.take() else {
            return;
        };
        poller::unregister(core.qp_num());
        if let Some(route) = core.mailbox.as_ref().and_then(|m| m.route.as_ref()) {
            wake_route::withdraw(route.key());
        }
        if let Some(shared) = &core.shared_recv {
            // Receives this QP consumed may still complete after it is gone.
            poller::adopt_orphan(core.qp_num(), shared.orphan());
        }
        // Release the QP, cm_id, CQ reservation and buffers before telling the CM actor,
        // so a freed connection slot never exists alongside the resources it held.
        drop(core);
        let reason = self.reason.clone().unwrap_or(CloseReason::Shutdown);
        tracing::debug!(conn = %self.label, "released");
        for done in self.released.drain(..) {
            let _ = done.send(());
        }
        self.cm.do_send(ConnClosed {
            key: self.key,
            reason,
        });
        if let Some(actor) = self.actor.upgrade() {
            actor.do_send(Released);
        }
    }

    /// Hands the session the messages ready in order, then our messages that were
    /// refused (by the peer, or by the pool's deadline), while the connection is open.
    /// Posts nothing: the caller pumps after it (see [`call_session`](Self::call_session)).
    fn deliver(&mut self) {
        while let Some(msg) = self.core.as_mut().and_then(|c| {
            if c.closing.is_none() {
                c.next_delivery()
            } else {
                None
            }
        }) {
            self.call_session(|s, cx| s.on_message(cx, msg));
        }
        while let Some((tag, why)) = self.core.as_mut().and_then(|c| {
            if c.closing.is_none() {
                c.refusals.pop_front()
            } else {
                None
            }
        }) {
            self.call_session(|s, cx| s.on_refused(cx, tag, why));
        }
    }

    /// Handles a batch of this connection's completions, in CQ order: operation results
    /// and received messages go to the session, then whatever it queued is posted, once
    /// for the whole batch.
    fn on_completions(&mut self, wcs: &[WorkCompletion], now: Instant, hold_posts: bool) {
        if let Some(core) = self.core.as_mut() {
            core.set_now(now);
            core.liveness.heard();
        }
        for (i, wc) in wcs.iter().enumerate() {
            let Some(core) = self.core.as_mut() else {
                // Released in the middle of the batch: the rest still holds shared
                // receives the other members of its queue need back.
                poller::return_orphans(&wcs[i..]);
                return;
            };
            match core.handle_completion(wc) {
                Ok(Some((op, result))) if core.closing.is_some() => {
                    // Draining: tell the session how the operation ended; nothing it
                    // queues now is sent.
                    let mut cx = SessionCx::new(core);
                    let session = &mut self.session;
                    if let Err(reason) = catch_session_panic(|| session.on_op(&mut cx, op, result))
                    {
                        tracing::debug!(conn = %self.label, %reason, "on_op while draining");
                    }
                }
                Ok(Some((op, result))) => {
                    let failed = result
                        .as_ref()
                        .err()
                        .map(|e| self.hung_up_reason(CloseReason::from_failed_op(op, e)));
                    self.call_session(|s, cx| s.on_op(cx, op, result));
                    if let Some(reason) = failed {
                        self.begin_close(reason);
                    }
                }
                Ok(None) => {}
                Err(reason) => {
                    let reason = self.hung_up_reason(reason);
                    self.begin_close(reason)
                }
            }
            self.deliver();
        }
        // Held: the poller hands this connection more of its completions in this drain,
        // and the last of them pumps (one doorbell for all their posts, see `Inbox`).
        if hold_posts && self.core.as_ref().is_some_and(|c| c.closing.is_none()) {
            return;
        }
        self.pump();
        if let Some(core) = &self.core {
            if core.closing.is_some() {
                if !self.torn_down {
                    if !core.saying_goodbye() {
                        self.tear_down();
                    }
                } else if core.inflight.is_empty() {
                    self.finish();
                }
            } else if self.hung_up && core.inflight.is_empty() {
                // The flush came back with no Close frame in it.
                self.finish();
            }
        }
    }

    pub(super) fn on_notice(&mut self, notice: CmNotice) {
        if let Some(core) = self.core.as_mut() {
            core.set_now(Instant::now());
        }
        match notice {
            CmNotice::Established { peer } => {
                let Some(core) = self.core.as_mut() else {
                    return;
                };
                core.establish(core.now);
                if let Some((_, recv_size)) = peer {
                    core.set_peer_recv_size(recv_size);
                }
                if let (Some((peer, _)), Some(credits)) = (peer, core.credits.as_mut()) {
                    if let Err(e) = credits.handle_peer_depth(peer) {
                        self.begin_close(CloseReason::from_credits(e));
                        return;
                    }
                }
                tracing::info!(conn = %self.label, "established");
                self.with_session(|s, cx| s.on_established(cx));
            }
            CmNotice::CommEst => {
                let id = self.core.as_ref().and_then(|c| c.id.as_ref());
                if let Some(Err(e)) = id.map(|id| id.notify_established()) {
                    tracing::warn!(conn = %self.label, error = %e, "telling the CM of IBV_EVENT_COMM_EST failed");
                }
            }
            CmNotice::Disconnected => {
                // After our goodbye, the peer's disconnect is the sign it has read it.
                let closing = self.core.as_ref().is_some_and(|c| c.closing.is_some());
                if closing {
                    self.tear_down();
                } else {
                    self.hang_up();
                }
            }
            CmNotice::Close(reason) => self.begin_close(reason),
        }
    }
}

/// Calls into a session, turning an error into [`CloseReason::Session`] and a panic
/// into [`CloseReason::SessionPanicked`] (the session is not touched again but for
/// `on_close`, itself guarded).
///
/// `AssertUnwindSafe`: after a panic the connection only tears down. The session may be
/// left half-updated, which is why nothing but `on_close` sees it again; the `Core` the
/// context borrows is changed by `SessionCx` methods in steps that each leave it usable
/// for teardown (queues, slabs of buffers and work requests).
pub(crate) fn catch_session_panic(
    f: impl FnOnce() -> Result<(), SessionError>,
) -> Result<(), CloseReason> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(res) => res.map_err(|e| CloseReason::Session(e.0)),
        Err(payload) => Err(CloseReason::SessionPanicked(panic_message(&*payload))),
    }
}

/// The message of a panic payload (`panic!` with a literal or with format arguments).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with a non-string payload".to_owned())
}

impl<T: Transport, S: Session<T>> Inbox for RefCell<Connection<S, T>> {
    fn completions(&self, wcs: &[WorkCompletion], now: Instant, hold_posts: bool) {
        self.borrow_mut().on_completions(wcs, now, hold_posts);
    }

    fn wake(&self, token: u64) {
        self.borrow_mut().with_session(|s, cx| s.on_wake(cx, token));
    }
}
