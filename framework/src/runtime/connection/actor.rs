//! The thin actix actor around a connection (its lifecycle is in `lifecycle.rs`): the
//! messages it carries (CM notices, client calls, wake-ups from other threads) and how it
//! starts on the poller thread that polls its CQ. Completions do not come through here.

use std::cell::RefCell;
use std::rc::{Rc, Weak};

use actix::prelude::*;

use super::handshake::Handshake;
use super::lifecycle::Connection;
use super::mailbox::{CmNotice, ConnClosed, Mailbox, Pump, Released};
use super::Core;
use crate::runtime::poller::{self, AbortOnUnwind, Inbox};
use crate::runtime::service::Session;
use crate::runtime::wake_route;
use crate::transport::{Transport, Verbs};

/// What a connection is started with (built on the CM actor's thread, moved to the
/// poller thread that polls the connection's CQ).
pub(crate) struct ConnectionParts<S, T: Transport = Verbs> {
    pub core: Core<T>,
    pub session: S,
    pub cm: Recipient<ConnClosed<T::CmIdKey>>,
    pub key: T::CmIdKey,
    pub label: String,
    /// The accept or connect that lets the QP reach RTR, made by the actor itself.
    pub handshake: Handshake<T::CmIdKey>,
    /// When the CM actor handed the connection over (for the setup profile).
    pub handed_over: std::time::Instant,
}

/// The actor driving one connection: its mailbox carries CM notices, client calls and
/// wake-ups; completions reach the same state directly from the poller.
pub(crate) struct ConnectionActor<S: Session<T>, T: Transport = Verbs> {
    conn: Rc<RefCell<Connection<S, T>>>,
}

impl<T: Transport, S: Session<T>> ConnectionActor<S, T> {
    /// Starts the connection's actor on the poller thread that polls its CQ, registers
    /// it there for completions, then makes the [`Handshake`] call (a failure closes the
    /// connection with the reason).
    pub(crate) fn start(parts: ConnectionParts<S, T>) -> Addr<Self> {
        let arbiter = parts.core.arbiter();
        ConnectionActor::start_in_arbiter(&arbiter, move |ctx| {
            let ConnectionParts {
                mut core,
                session,
                cm,
                key,
                label,
                handshake,
                handed_over,
            } = parts;
            let started = std::time::Instant::now();
            // Set here, not in `started`: the poller may hand this connection a message
            // before the actor's first turn, and a session that starts background work
            // then must already have a waker that reaches it. Weak: a waker held by a job
            // thread must not keep a closed connection alive.
            core.mailbox = Some(Mailbox::of(&ctx.address()));
            let qp_num = core.qp_num();
            let conn = Rc::new_cyclic(|this| {
                RefCell::new(Connection {
                    core: Some(core),
                    session,
                    cm,
                    key,
                    label,
                    reason: None,
                    torn_down: false,
                    hung_up: false,
                    released: Vec::new(),
                    this: this.clone(),
                    actor: ctx.address().recipient::<Released>().downgrade(),
                    timer: None,
                })
            });
            let inbox: Weak<dyn Inbox> = Rc::downgrade(&conn) as Weak<RefCell<Connection<S, T>>>;
            if let Some(route) = conn
                .borrow()
                .core
                .as_ref()
                .and_then(|c| c.mailbox.as_ref()?.route.as_ref())
            {
                wake_route::enroll(route.key(), inbox.clone());
            }
            poller::register(qp_num, inbox);
            let id = conn.borrow().core.as_ref().and_then(|c| c.id.clone());
            let what = handshake.name();
            if handshake.run::<T>(id.as_ref(), key) {
                tracing::info!(conn = %conn.borrow().label, "accepted");
            }
            tracing::debug!(
                target: "rdmactor::setup",
                step = "actor",
                handshake = what,
                lag_us = started.duration_since(handed_over).as_micros() as u64,
                call_us = started.elapsed().as_micros() as u64,
            );
            ConnectionActor { conn }
        })
    }

    /// The connection's state, borrowed for one handler.
    pub(crate) fn conn(&self) -> std::cell::RefMut<'_, Connection<S, T>> {
        self.conn.borrow_mut()
    }
}

impl<T: Transport, S: Session<T>> Actor for ConnectionActor<S, T> {
    type Context = Context<Self>;
}

impl<T: Transport, S: Session<T>> Handler<CmNotice> for ConnectionActor<S, T> {
    type Result = ();

    fn handle(&mut self, notice: CmNotice, _: &mut Context<Self>) {
        // Sessions' panics are caught inside; one that gets here is the framework's.
        let _guard = AbortOnUnwind::new("connection actor");
        self.conn().on_notice(notice);
    }
}

impl<T: Transport, S: Session<T>> Handler<Pump> for ConnectionActor<S, T> {
    type Result = ();

    fn handle(&mut self, _why: Pump, _: &mut Context<Self>) {
        let _guard = AbortOnUnwind::new("connection actor");
        self.conn().pump_now();
    }
}

impl<T: Transport, S: Session<T>> Handler<Released> for ConnectionActor<S, T> {
    type Result = ();

    fn handle(&mut self, _: Released, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
