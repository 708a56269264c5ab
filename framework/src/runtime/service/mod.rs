//! The service plug-in API: a [`Service`] is registered by name on the server; each
//! connection that asks for it gets its own [`Session`], driven by that connection's
//! actor. Sessions see whole messages and completions of the one-sided operations they
//! started; buffers, credits, framing, rendezvous and teardown are the framework's.

mod types;

pub use types::{DecodeError, Framing, Identity, Incoming, OpId, PeerInfo, SessionError};

use super::connection::SessionCx;
use crate::transport::{Transport, Verbs};

/// A registered service. Shared by every connection; `session` is called once per
/// accepted connection.
pub trait Service<T: Transport = Verbs>: Send + Sync + 'static {
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
    fn session(&self, peer: &PeerInfo) -> Box<dyn Session<T>>;

    /// The server's RDMA device serves: once at start, and again each time it came
    /// back after it went (see [`on_device_down`](Service::on_device_down)). `pd` is the
    /// protection domain every connection on it shares: register here what the service
    /// keeps registered across connections. Runs on the CM actor's thread.
    fn on_device_up(&self, _pd: &T::Domain) {}

    /// The server's RDMA device went (removed or failed). Drop everything the service
    /// registered on it (memory regions, windows, ...): the kernel finishes removing a
    /// device only once the process closed every object on it, and the server rebuilds
    /// its resources when the device is back. Every connection is closing meanwhile.
    /// Runs on the CM actor's thread.
    fn on_device_down(&self) {}
}

/// One connection's protocol logic. Methods run on the connection's actor, one at a time.
/// Returning an error closes the connection with that error as the reason.
pub trait Session<T: Transport = Verbs>: Send + Unpin + 'static {
    /// The connection is established and may send.
    fn on_established(&mut self, _cx: &mut SessionCx<'_, T>) -> Result<(), SessionError> {
        Ok(())
    }

    /// A message arrived.
    fn on_message(&mut self, cx: &mut SessionCx<'_, T>, msg: Incoming) -> Result<(), SessionError>;

    /// A one-sided operation this session posted completed (`Err` carries the failing
    /// status; the connection closes after this call, as the QP is in error).
    fn on_op(
        &mut self,
        _cx: &mut SessionCx<'_, T>,
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
        _cx: &mut SessionCx<'_, T>,
        tag: u32,
        why: crate::proto::budget::BudgetError,
    ) -> Result<(), SessionError> {
        refused_by_default(tag, why)
    }

    /// A [`SessionWaker`](super::SessionWaker) of this connection was woken with `token`
    /// (or a [`SessionCx::spawn_blocking`] task finished): work done on another thread is
    /// ready for the session. Not called once the connection is closing.
    fn on_wake(&mut self, _cx: &mut SessionCx<'_, T>, _token: u64) -> Result<(), SessionError> {
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

impl<T: Transport> Session<T> for Box<dyn Session<T>> {
    fn on_established(&mut self, cx: &mut SessionCx<'_, T>) -> Result<(), SessionError> {
        (**self).on_established(cx)
    }
    fn on_message(&mut self, cx: &mut SessionCx<'_, T>, msg: Incoming) -> Result<(), SessionError> {
        (**self).on_message(cx, msg)
    }
    fn on_op(
        &mut self,
        cx: &mut SessionCx<'_, T>,
        op: OpId,
        result: crate::verbs::Result<()>,
    ) -> Result<(), SessionError> {
        (**self).on_op(cx, op, result)
    }
    fn on_wake(&mut self, cx: &mut SessionCx<'_, T>, token: u64) -> Result<(), SessionError> {
        (**self).on_wake(cx, token)
    }
    fn on_refused(
        &mut self,
        cx: &mut SessionCx<'_, T>,
        tag: u32,
        why: crate::proto::budget::BudgetError,
    ) -> Result<(), SessionError> {
        (**self).on_refused(cx, tag, why)
    }
    fn on_close(&mut self, reason: &super::CloseReason) {
        (**self).on_close(reason)
    }
}
