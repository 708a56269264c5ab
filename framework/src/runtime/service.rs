//! The service plug-in API: a [`Service`] is registered by name on the server; each
//! connection that asks for it gets its own [`Session`], driven by that connection's
//! actor. Sessions see whole messages and completions of the one-sided operations they
//! started; buffers, credits, framing, rendezvous and teardown are the framework's.

use std::net::SocketAddr;

use super::connection::SessionCx;

/// How a service's messages travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// rdmactor frames: a header with credits, request tags, rendezvous for large
    /// messages. For rdmactor clients.
    Framed,
    /// Bytes exactly as the peer sent them, one SEND per message, no header and no
    /// credits: for plain verbs clients (rping, lab programs). Each receive buffer holds
    /// `recv_size` bytes; a larger SEND fails the connection (the NIC reports it).
    Raw {
        /// Size of each receive buffer.
        recv_size: u32,
    },
}

/// Who a session is talking to.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    /// The peer's address.
    pub addr: Option<SocketAddr>,
    /// The local QP number of this connection.
    pub qp_num: u32,
    /// The service name this connection was admitted to.
    pub service: String,
}

/// A message from the peer, as a [`Session`] receives it. (Named apart from
/// `actix::Message`, which a service with an owner actor imports too.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incoming {
    /// What the message is: 0 for a one-way message (the client's `send`, `send_all`;
    /// nobody waits, so answer nothing) and for every message of a raw connection; any
    /// other value is a request, which the client's `request` waits on until an answer
    /// comes under the same tag ([`SessionCx::reply`]).
    pub tag: u32,
    /// Immediate data, for SEND_WITH_IMM and WRITE_WITH_IMM.
    pub imm: Option<u32>,
    /// The payload (empty for a WRITE_WITH_IMM, whose bytes went to the written region).
    pub data: Vec<u8>,
}

impl Incoming {
    /// The payload as a `T`, decoded with postcard: the encoding of the client's
    /// `request_typed` and `call_typed`, so a session answers typed requests without
    /// naming the codec. Fails on bytes that are not a `T` (the peer's mistake, or
    /// another version of the protocol).
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, DecodeError> {
        postcard::from_bytes(&self.data).map_err(|e| DecodeError {
            tag: self.tag,
            len: self.data.len(),
            why: e.to_string(),
        })
    }
}

/// Why [`Incoming::decode`] failed: which message, and postcard's reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("message {tag} ({len} bytes) is not the expected type: {why}")]
pub struct DecodeError {
    /// The message's tag.
    pub tag: u32,
    /// Its length.
    pub len: usize,
    /// postcard's reason.
    pub why: String,
}

impl From<DecodeError> for SessionError {
    fn from(e: DecodeError) -> SessionError {
        SessionError::new(e.to_string())
    }
}

/// Why a session gave up on its connection; the connection closes with this reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SessionError(pub String);

impl SessionError {
    /// A session error with `msg`.
    pub fn new(msg: impl Into<String>) -> SessionError {
        SessionError(msg.into())
    }
}

/// A one-sided operation started by a session, named in its completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpId(pub(crate) u64);

/// A registered service. Shared by every connection; `session` is called once per
/// accepted connection.
pub trait Service: Send + Sync + 'static {
    /// How this service's messages travel.
    fn framing(&self) -> Framing {
        Framing::Framed
    }

    /// The largest message this service takes from a client, if smaller than the node's
    /// (`ConnectionConfig::max_message`). A larger one is refused when it is offered, before
    /// any of it moves: the client's request fails with the reason
    /// ([`RequestError::Refused`](super::RequestError::Refused)) and the connection goes
    /// on. Services whose messages are only small control messages (bulk data going by
    /// one-sided operations) should say so, so that no client can make the server hold
    /// megabytes on their behalf.
    fn max_message(&self) -> Option<usize> {
        None
    }

    /// A session for a newly accepted connection.
    fn session(&self, peer: &PeerInfo) -> Box<dyn Session>;

    /// The server's RDMA device serves: once at start, and again each time it came
    /// back after it went (see [`on_device_down`](Service::on_device_down)). `pd` is the
    /// protection domain every connection on it shares: register here what the service
    /// keeps registered across connections. Runs on the CM actor's thread.
    fn on_device_up(&self, _pd: &crate::verbs::ProtectionDomain) {}

    /// The server's RDMA device went (removed or failed). Drop everything the service
    /// registered on it (memory regions, windows, ...): the kernel finishes removing a
    /// device only once the process closed every object on it, and the server rebuilds
    /// its resources when the device is back. Every connection is closing meanwhile.
    /// Runs on the CM actor's thread.
    fn on_device_down(&self) {}
}

/// One connection's protocol logic. Methods run on the connection's actor, one at a time.
/// Returning an error closes the connection with that error as the reason.
pub trait Session: Send + Unpin + 'static {
    /// The connection is established and may send.
    fn on_established(&mut self, _cx: &mut SessionCx<'_>) -> Result<(), SessionError> {
        Ok(())
    }

    /// A message arrived.
    fn on_message(&mut self, cx: &mut SessionCx<'_>, msg: Incoming) -> Result<(), SessionError>;

    /// A one-sided operation this session posted completed (`Err` carries the failing
    /// status; the connection closes after this call, as the QP is in error).
    fn on_op(
        &mut self,
        _cx: &mut SessionCx<'_>,
        op: OpId,
        result: crate::verbs::Result<()>,
    ) -> Result<(), SessionError> {
        result.map_err(|e| SessionError::new(format!("unexpected completion of {op:?}: {e}")))
    }

    /// A message this session sent with `tag` was not delivered, and the connection goes
    /// on. Either the peer refused it (a rendezvous message larger than it takes, or than
    /// its budget: [`BudgetError::OverBudget`](crate::proto::budget::BudgetError::OverBudget),
    /// [`TooLarge`](crate::proto::budget::BudgetError::TooLarge)), or it waited for the
    /// memory pool longer than `ConnectionConfig::pool_wait`
    /// ([`NoRoom`](crate::proto::budget::BudgetError::NoRoom)): nothing of it was sent.
    ///
    /// By default a refusal by the peer closes the connection with the refusal as the
    /// reason (a service whose answers its clients cannot take has a bug to show), and a
    /// message the pool had no room for is logged and dropped: the server is busy, not
    /// wrong. A service whose answers can be large should override this to tell its
    /// client, for example with a small error answer under the same tag, since the
    /// client otherwise waits for an answer that never comes.
    fn on_refused(
        &mut self,
        _cx: &mut SessionCx<'_>,
        tag: u32,
        why: crate::proto::budget::BudgetError,
    ) -> Result<(), SessionError> {
        refused_by_default(tag, why)
    }

    /// A [`SessionWaker`](super::SessionWaker) of this connection was woken with `token`
    /// (or a [`SessionCx::spawn_blocking`] task finished): work done on another thread is
    /// ready for the session. Not called once the connection is closing.
    fn on_wake(&mut self, _cx: &mut SessionCx<'_>, _token: u64) -> Result<(), SessionError> {
        Ok(())
    }

    /// The connection is closing for `reason`; nothing can be sent any more.
    fn on_close(&mut self, _reason: &super::CloseReason) {}
}

/// [`Session::on_refused`]'s default, shared with the state-machine adapter's.
pub(crate) fn refused_by_default(
    tag: u32,
    why: crate::proto::budget::BudgetError,
) -> Result<(), SessionError> {
    if let crate::proto::budget::BudgetError::NoRoom { .. } = why {
        tracing::warn!(tag, %why, "a message was dropped");
        return Ok(());
    }
    Err(SessionError::new(format!(
        "the peer refused message {tag}: {why}"
    )))
}

impl Session for Box<dyn Session> {
    fn on_established(&mut self, cx: &mut SessionCx<'_>) -> Result<(), SessionError> {
        (**self).on_established(cx)
    }
    fn on_message(&mut self, cx: &mut SessionCx<'_>, msg: Incoming) -> Result<(), SessionError> {
        (**self).on_message(cx, msg)
    }
    fn on_op(
        &mut self,
        cx: &mut SessionCx<'_>,
        op: OpId,
        result: crate::verbs::Result<()>,
    ) -> Result<(), SessionError> {
        (**self).on_op(cx, op, result)
    }
    fn on_wake(&mut self, cx: &mut SessionCx<'_>, token: u64) -> Result<(), SessionError> {
        (**self).on_wake(cx, token)
    }
    fn on_refused(
        &mut self,
        cx: &mut SessionCx<'_>,
        tag: u32,
        why: crate::proto::budget::BudgetError,
    ) -> Result<(), SessionError> {
        (**self).on_refused(cx, tag, why)
    }
    fn on_close(&mut self, reason: &super::CloseReason) {
        (**self).on_close(reason)
    }
}
