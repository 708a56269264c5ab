//! Work done away from the connection's thread reaching its session: a waker any
//! thread can hold, closures run on the blocking pool, and requests to other actors
//! (a service's own actor), whose results come back through it.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use std::sync::mpsc;

use actix::prelude::*;
use actix::{Recipient, WeakRecipient};

use super::blocking::BlockingError;
use super::mailbox::Wake;
use super::{ConnectionActor, SessionCx};
use crate::runtime::Session;
use crate::transport::Transport;

/// Wakes one connection's session from any thread: [`wake`](Self::wake) makes the
/// framework call [`Session::on_wake`] on the connection's actor. Cheap to clone; it does
/// not keep the connection alive (waking a closed connection does nothing).
#[derive(Clone)]
pub struct SessionWaker {
    target: Option<WeakRecipient<Wake>>,
}

impl std::fmt::Debug for SessionWaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionWaker")
            .field("connected", &self.is_connected())
            .finish()
    }
}

impl SessionWaker {
    /// Queues a call of [`Session::on_wake`] with `token`. Returns false when the
    /// connection is gone (the token is dropped). Wake-ups are not merged: each one is a
    /// call.
    pub fn wake(&self, token: u64) -> bool {
        match self.target.as_ref().and_then(WeakRecipient::upgrade) {
            Some(r) if r.connected() => {
                r.do_send(Wake(token));
                true
            }
            _ => false,
        }
    }

    /// A waker of no connection (its wake-ups go nowhere), for tests of what holds one.
    #[cfg(test)]
    pub(crate) fn detached() -> SessionWaker {
        SessionWaker { target: None }
    }

    /// False once the connection's actor is gone.
    pub fn is_connected(&self) -> bool {
        self.target
            .as_ref()
            .and_then(WeakRecipient::upgrade)
            .is_some_and(|r| r.connected())
    }
}

/// The result of a closure started with [`SessionCx::spawn_blocking`]; take it in
/// [`Session::on_wake`] when the token it was started with comes back.
#[derive(Debug)]
pub struct Blocking<T> {
    rx: mpsc::Receiver<Result<T, BlockingError>>,
}

impl<T> Blocking<T> {
    /// The closure's result once it returned (or panicked); `None` while it runs. Taken
    /// once: later calls answer `Some(Err(Lost))`.
    pub fn try_take(&self) -> Option<Result<T, BlockingError>> {
        match self.rx.try_recv() {
            Ok(result) => Some(result),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => Some(Err(BlockingError::Lost)),
        }
    }
}

/// Why an [`Asked`] request has no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AskError {
    /// The actor asked stopped before it answered (or was already gone).
    #[error("the actor asked is gone")]
    ActorGone,
    /// The answer was taken already, or its task was dropped (the runtime is shutting
    /// down).
    #[error("the answer was lost")]
    Lost,
}

/// The answer to a request sent with [`SessionCx::ask`]; take it in
/// [`Session::on_wake`] when the token it was sent with comes back.
#[derive(Debug)]
pub struct Asked<T> {
    rx: mpsc::Receiver<Result<T, AskError>>,
}

impl<T> Asked<T> {
    /// The actor's answer once it came; `None` while it is on its way. The answer is in
    /// before the wake-up of its token is sent, so on that wake-up this is `Some`; it is
    /// `None` there only when several requests share one token and another's came
    /// first. Taken once: later calls answer `Some(Err(Lost))`.
    pub fn try_take(&self) -> Option<Result<T, AskError>> {
        match self.rx.try_recv() {
            Ok(answer) => Some(answer),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => Some(Err(AskError::Lost)),
        }
    }
}

impl<T: Transport> SessionCx<'_, T> {
    /// Sends `msg` to another actor (a service's actor that owns what its sessions
    /// share: quotas, caches, job slots) and calls [`Session::on_wake`] with `token` when
    /// its answer is in; take it there with [`Asked::try_take`]. The connection's thread
    /// never waits: the answer comes back as one more message to its actor.
    ///
    /// One request is a few channel hops (to the actor, back, the wake-up): meant for
    /// control paths (an offer, an upload, one per request), not for every chunk or
    /// message of a transfer. If the connection closed in the meantime, the answer is
    /// dropped (an answer that holds a share gives it back when dropped, if its type
    /// says so). To tell an actor something without an answer, `do_send` to it directly.
    pub fn ask<M>(&mut self, token: u64, to: &Recipient<M>, msg: M) -> Asked<M::Result>
    where
        M: actix::Message + Send + 'static,
        M::Result: Send,
    {
        let (tx, rx) = mpsc::sync_channel(1);
        let waker = self.waker();
        let request = to.send(msg);
        actix::spawn(async move {
            let answer = request.await.map_err(|_| AskError::ActorGone);
            // The session may be gone: nobody to tell, and the answer drops here.
            if tx.send(answer).is_ok() {
                waker.wake(token);
            }
        });
        Asked { rx }
    }

    /// A handle that wakes this session from any thread (see [`SessionWaker`]).
    pub fn waker(&self) -> SessionWaker {
        SessionWaker {
            target: self.core.mailbox.as_ref().map(|m| m.wake.clone()),
        }
    }

    /// Calls [`Session::on_wake`] with `token` once `delay` has passed: a deadline for
    /// something the peer owes (a chunk, an answer). The timer cannot be cancelled and
    /// does not keep the connection alive, so check on the wake-up whether the deadline
    /// still applies, and arm a new one for what is left of it.
    pub fn wake_after(&mut self, token: u64, delay: std::time::Duration) {
        let waker = self.waker();
        actix::spawn(async move {
            actix::clock::sleep(delay).await;
            waker.wake(token);
        });
    }

    /// Runs `f` on the runtime's blocking pool (never on the poller thread that hosts
    /// this connection and many others), then calls [`Session::on_wake`] with `token`;
    /// take the result there with [`Blocking::try_take`].
    ///
    /// Bounded (`ConnectionConfig::blocking_per_connection` of this connection and
    /// `blocking_per_service` of its service run at once; the others wait in order): past
    /// `blocking_queued_per_connection` started and not finished, the result is
    /// [`BlockingError::Busy`] at once, on the token's wake-up. A closure whose
    /// connection closed while it waited is not run; one already running runs to the end
    /// and its result is dropped.
    pub fn spawn_blocking<R, F>(&mut self, token: u64, f: F) -> Blocking<R>
    where
        R: Send + 'static,
        F: FnOnce() -> R + Send + 'static,
    {
        let (tx, rx) = mpsc::sync_channel(1);
        let waker = self.waker();
        let gate = self.core.blocking.handle();
        let place = gate.start();
        actix::spawn(async move {
            let result = match place {
                Ok(place) => gate.run(place, || waker.is_connected(), f).await,
                Err(busy) => Err(busy),
            };
            if !matches!(result, Err(BlockingError::Skipped)) {
                let _ = tx.send(result);
                waker.wake(token);
            }
        });
        Blocking { rx }
    }

    /// Where this connection's blocking closures wait their turn (for the handler
    /// adapter's calls, which run them from futures).
    pub(crate) fn blocking_gate(&self) -> super::BlockingHandle {
        self.core.blocking.handle()
    }

    /// The server's heap budget (`PoolConfig::heap_bytes`), for what this connection's
    /// peer makes the session hold: count bytes a client chose before allocating them.
    pub fn heap_budget(&self) -> crate::runtime::HeapBudget {
        crate::runtime::HeapBudget::new(self.core.pool.clone())
    }
}

impl<T: Transport, S: Session<T>> Handler<Wake> for ConnectionActor<S, T> {
    type Result = ();

    fn handle(&mut self, msg: Wake, _: &mut Context<Self>) {
        let _guard = crate::runtime::poller::AbortOnUnwind::new("connection actor");
        self.conn().with_session(|s, cx| s.on_wake(cx, msg.0));
    }
}
