//! How a connection's QP gets going: the accept or connect call its actor makes once
//! registered with its poller thread, apart from the lifecycle that follows, because the
//! CM actor builds these parameters on its own thread and only the call itself moves.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use actix::prelude::*;

use crate::transport::{CmId as _, Transport};
use crate::verbs::{CmIdKey, ConnParam};

/// What the connection's actor does right after registering with its poller thread for
/// its QP's completions: the step that lets the QP receive, or lets the peer learn of it.
///
/// Done by the actor, not by whoever prepared the connection: registered first, no
/// completion can arrive before the poller knows whose it is (a QP produces none before
/// RTR, and the peer cannot send to a QP it has not heard of), so nothing ever waits for
/// a late registration. For rdma_cm connections it also spares the CM actor, which
/// handles every connection's events in order on one thread, the accept or connect call
/// (a few system calls each, which under a connect storm delayed every later event).
pub(crate) enum Handshake<K: Send + 'static = CmIdKey> {
    /// Passive side: `rdma_accept`.
    Accept(CmCall<K>),
    /// Active side: `rdma_connect`.
    Connect(CmCall<K>),
    /// Out of band: the QP is at RTS already; this hears once it is registered, and
    /// only then are our QP records sent to the peer.
    OutOfBand(tokio::sync::oneshot::Sender<()>),
}

/// The parameters of an `rdma_accept` or `rdma_connect` call, and whom to tell if it
/// fails.
pub(crate) struct CmCall<K: Send + 'static = CmIdKey> {
    /// The hello (active) or welcome (passive) for the peer.
    pub private_data: Vec<u8>,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    /// The CM actor.
    pub failed: Recipient<HandshakeFailed<K>>,
}

/// Sent to the CM actor when the accept or connect call failed. The connection does not
/// close itself: the CM actor closes it (and answers a pending connect) as it handles
/// this, so the cm_id lives, and its key names only this connection, until then.
#[derive(Debug)]
pub(crate) struct HandshakeFailed<K = CmIdKey> {
    pub key: K,
    pub error: String,
}

impl<K: 'static> Message for HandshakeFailed<K> {
    type Result = ();
}

impl<K: Send + 'static> CmCall<K> {
    fn param(&self) -> ConnParam<'_> {
        ConnParam {
            private_data: &self.private_data,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
        }
    }
}

impl<K: Send + 'static> Handshake<K> {
    /// Makes the call on `id` (out of band: answers the waiter); a failed call is
    /// reported as [`HandshakeFailed`]. Whether an accept was made.
    pub(super) fn run<T: Transport<CmIdKey = K>>(self, id: Option<&T::CmId>, key: K) -> bool {
        let (call, result, accepted) = match (self, id) {
            (Handshake::Accept(call), Some(id)) => {
                let r = id.accept(&call.param());
                let ok = r.is_ok();
                (call, r, ok)
            }
            (Handshake::Connect(call), Some(id)) => {
                let r = id.connect(&call.param());
                (call, r, false)
            }
            (Handshake::OutOfBand(registered), _) => {
                let _ = registered.send(());
                return false;
            }
            (_, None) => return false,
        };
        if let Err(e) = result {
            call.failed.do_send(HandshakeFailed {
                key,
                error: e.to_string(),
            });
        }
        accepted
    }

    pub(super) fn name(&self) -> &'static str {
        match self {
            Handshake::Accept(_) => "accept",
            Handshake::Connect(_) => "connect",
            Handshake::OutOfBand(_) => "out of band",
        }
    }
}
