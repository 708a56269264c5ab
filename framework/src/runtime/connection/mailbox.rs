//! What reaches a connection from outside its turn: the messages of its actor's mailbox
//! (CM notices, wake-ups, pumps, its release) and the opaque handle the core keeps on
//! that mailbox. Apart from the actor so that the core and the lifecycle can name these
//! without knowing the actor.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use actix::prelude::*;
use actix::WeakRecipient;

use crate::proto::credits::Advert;
use crate::runtime::close::CloseReason;
use crate::runtime::wake_route::WakeRoute;
use crate::verbs::CmIdKey;

/// Connection-level notices from the CM actor.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub(crate) enum CmNotice {
    /// ESTABLISHED; for active connections, the receive depth the server advertised.
    /// With the peer's credits and receive buffer size (the active side learns them
    /// from the welcome).
    Established { peer: Option<(Advert, u32)> },
    /// DISCONNECTED (peer or local).
    Disconnected,
    /// The device saw the QP carry data before ESTABLISHED: tell the CM (see
    /// `CmId::notify_established`).
    CommEst,
    /// Close for this reason (shutdown, failed accept, rejected connect).
    Close(CloseReason),
}

/// Sent to the CM actor once a connection has released everything; `K` is the
/// transport's key of a cm_id.
#[derive(Debug)]
pub(crate) struct ConnClosed<K = CmIdKey> {
    pub key: K,
    pub reason: CloseReason,
}

impl<K: 'static> Message for ConnClosed<K> {
    type Result = ();
}

/// Stops the actor once its connection has released everything.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub(super) struct Released;

/// What this connection's queue waited for, away from its thread, is ready: the pool
/// has memory again after refusing it (`Core::take_from_pool`), or a large message's
/// registration finished (`Core::begin_offer`). Pump again.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub(crate) enum Pump {
    PoolRoom,
    Registered,
}

/// Asks a connection's actor to call [`Session::on_wake`].
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub(crate) struct Wake(pub(super) u64);

/// The way back into a connection from other threads: its actor's mailbox, held weakly
/// (a job thread's handle must not keep a closed connection alive). The core keeps it
/// as an opaque handle; only this file knows it is an actor.
#[derive(Clone)]
pub(crate) struct Mailbox {
    pub(super) wake: WeakRecipient<Wake>,
    pump: WeakRecipient<Pump>,
    /// The way in through the poller thread, where the actor runs on one (see
    /// `wake_route.rs`): wake-ups take it instead of the mailbox.
    pub(super) route: Option<WakeRoute>,
}

impl Mailbox {
    /// The mailbox of the actor `addr` (the connection's actor).
    pub(super) fn of<A>(addr: &Addr<A>) -> Mailbox
    where
        A: Actor + Handler<Wake> + Handler<Pump>,
        A::Context: actix::dev::ToEnvelope<A, Wake> + actix::dev::ToEnvelope<A, Pump>,
    {
        Mailbox {
            wake: addr.clone().recipient::<Wake>().downgrade(),
            pump: addr.clone().recipient::<Pump>().downgrade(),
            route: WakeRoute::reserve(),
        }
    }

    /// Asks the connection to pump again, because of `why`; false when it is gone.
    pub(super) fn pump(&self, why: Pump) -> bool {
        match self.pump.upgrade() {
            Some(r) => {
                r.do_send(why);
                true
            }
            None => false,
        }
    }
}
