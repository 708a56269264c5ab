//! Work done away from the connection's thread reaching its session: a waker any
//! thread can hold, closures run on the blocking pool, and requests to other actors
//! (a service's own actor), whose results come back through it.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use std::future::Future;
use std::pin::Pin;
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::task::{Poll, Waker};

use actix::prelude::*;
use actix::{MailboxError, Recipient, WeakRecipient};

use super::blocking::BlockingError;
use super::mailbox::Wake;
use super::{ConnectionActor, SessionCx};
use crate::runtime::wake_route::WakeRoute;
use crate::runtime::Session;
use crate::transport::Transport;

/// Wakes one connection's session from any thread: [`wake`](Self::wake) makes the
/// framework call [`Session::on_wake`] on the connection's thread. Cheap to clone; it
/// does not keep the connection alive (waking a closed connection does nothing).
#[derive(Clone)]
pub struct SessionWaker {
    target: Option<WeakRecipient<Wake>>,
    /// Through the poller thread, where the connection runs on one (see
    /// `wake_route.rs`); else the wake-up is a message to the actor.
    route: Option<WakeRoute>,
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
            Some(r) if r.connected() => match &self.route {
                Some(route) => route.wake(token),
                None => {
                    r.do_send(Wake(token));
                    true
                }
            },
            _ => false,
        }
    }

    /// A waker of no connection (its wake-ups go nowhere), for tests of what holds one.
    #[cfg(test)]
    pub(crate) fn detached() -> SessionWaker {
        SessionWaker {
            target: None,
            route: None,
        }
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
pub struct Asked<T> {
    answer: Mutex<Answer<T>>,
    /// The session's wake-up with the request's token, as a task waker: the request is
    /// polled on the connection's thread, and the answering thread wakes the session
    /// through its poller, with no task in between.
    waker: Waker,
}

enum Answer<T> {
    /// On its way (or waiting for room in a full mailbox).
    Waiting(Pin<Box<dyn Future<Output = Result<T, MailboxError>> + Send>>),
    /// In, not taken yet.
    In(Result<T, AskError>),
    Taken,
}

impl<T> std::fmt::Debug for Asked<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let answer = self.answer.lock().unwrap_or_else(PoisonError::into_inner);
        let state = match &*answer {
            Answer::Waiting(_) => "waiting",
            Answer::In(_) => "in",
            Answer::Taken => "taken",
        };
        f.debug_struct("Asked").field("answer", &state).finish()
    }
}

impl<T> Asked<T> {
    /// The actor's answer once it came; `None` while it is on its way. The answer is in
    /// before the wake-up of its token is sent, so on that wake-up this is `Some`; it is
    /// `None` there when several requests share one token and another's came first, or
    /// when the wake-up said only that the actor's full mailbox had room for the
    /// request. Taken once: later calls answer `Some(Err(Lost))`.
    pub fn try_take(&self) -> Option<Result<T, AskError>> {
        let mut answer = self.answer.lock().unwrap_or_else(PoisonError::into_inner);
        self.poll(&mut answer);
        match std::mem::replace(&mut *answer, Answer::Taken) {
            Answer::In(got) => Some(got),
            Answer::Taken => Some(Err(AskError::Lost)),
            waiting @ Answer::Waiting(_) => {
                *answer = waiting;
                None
            }
        }
    }

    /// Moves a waiting request on (sending it, once a full mailbox has room), and keeps
    /// its answer if it came.
    fn poll(&self, answer: &mut Answer<T>) {
        let Answer::Waiting(request) = answer else {
            return;
        };
        let mut cx = std::task::Context::from_waker(&self.waker);
        if let Poll::Ready(got) = request.as_mut().poll(&mut cx) {
            *answer = Answer::In(got.map_err(|_| AskError::ActorGone));
        }
    }
}

/// A task waker that is a session's wake-up with one token: the answering actor's
/// thread wakes the session through its poller, with no task in between.
struct TokenWaker {
    session: SessionWaker,
    token: u64,
}

impl std::task::Wake for TokenWaker {
    fn wake(self: Arc<Self>) {
        self.session.wake(self.token);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.session.wake(self.token);
    }
}

impl<T: Transport> SessionCx<'_, T> {
    /// Sends `msg` to another actor (a service's actor that owns what its sessions
    /// share: quotas, caches, job slots) and calls [`Session::on_wake`] with `token` when
    /// its answer is in; take it there with [`Asked::try_take`]. The connection's thread
    /// never waits: the answering actor's thread wakes the session through its poller
    /// (see `wake_route.rs`).
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
        let waker = Waker::from(Arc::new(TokenWaker {
            session: self.waker(),
            token,
        }));
        let asked = Asked {
            // A fresh sender each time (`Recipient::clone`): actix parks a sender that
            // found the mailbox at its capacity, and its next `send` keeps the message
            // back, with no waker, until it is polled again after the actor has taken
            // every message queued before it. Sessions whose requests all share one
            // sender (a flood's and a polite client's) then waited until some other event
            // polled theirs: 27 s in the lambda memory round. A fresh sender always
            // queues its message; the asking sessions bound the mailbox (each keeps a
            // few requests out).
            answer: Mutex::new(Answer::Waiting(Box::pin(to.clone().send(msg)))),
            waker,
        };
        // Polled once now, so that a request to a full mailbox waits for room with the
        // session's waker; one that fails at once (the actor is gone) is answered on a
        // wake-up like any other answer.
        let mut answer = asked.answer.lock().unwrap_or_else(PoisonError::into_inner);
        asked.poll(&mut answer);
        if matches!(*answer, Answer::In(_)) {
            asked.waker.wake_by_ref();
        }
        drop(answer);
        asked
    }

    /// A handle that wakes this session from any thread (see [`SessionWaker`]).
    pub fn waker(&self) -> SessionWaker {
        SessionWaker {
            target: self.core.mailbox.as_ref().map(|m| m.wake.clone()),
            route: self.core.mailbox.as_ref().and_then(|m| m.route.clone()),
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
        // On the relay thread, for the same reason as `ask`'s answers.
        crate::runtime::wake_route::relay(async move {
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

#[cfg(test)]
mod tests {
    use actix::prelude::*;

    /// Counts what it is asked.
    struct Counter(u32);

    impl Actor for Counter {
        type Context = Context<Self>;
    }

    #[derive(Message)]
    #[rtype(result = "u32")]
    struct Next;

    impl Handler<Next> for Counter {
        type Result = u32;
        fn handle(&mut self, _: Next, _: &mut Context<Self>) -> u32 {
            self.0 = self.0.wrapping_add(1);
            self.0
        }
    }

    /// What `ask` relies on (see the comment there): a sender that found the mailbox at
    /// its capacity is parked, and its next request keeps its message back until polled
    /// again, with no waker; a clone of the recipient is a fresh sender whose request
    /// is queued at once. If actix changes this, `ask` may take its requests back.
    #[test]
    fn a_parked_sender_holds_its_request_back_and_a_fresh_one_queues_it() {
        actix::System::new().block_on(async {
            let (tx, rx) = actix::dev::channel::channel::<Counter>(1);
            let to: Recipient<Next> = Addr::new(tx).recipient();
            // Fills the mailbox (capacity 1): queued, and the sender is parked.
            let first = to.send(Next);
            // The same sender again: held back, never queued by itself.
            let held = to.send(Next);
            // A fresh sender: queued.
            let fresh = to.clone().send(Next);
            let ctx = Context::with_receiver(rx);
            let _counter = ctx.run(Counter(0));
            assert_eq!(first.await.expect("first"), 1);
            assert_eq!(
                fresh.await.expect("fresh"),
                2,
                "the fresh sender's request was queued second"
            );
            // The held one is queued only now, polled after the others were taken.
            assert_eq!(held.await.expect("held"), 3);
        });
    }
}
