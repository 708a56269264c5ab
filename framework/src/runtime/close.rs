//! Why a connection ended: the one enum every layer reports a close with, at the
//! bottom of the runtime so that none of them imports the facade for it.

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CloseReason {
    /// The peer disconnected (or vanished and the CM noticed).
    #[error("peer disconnected")]
    PeerDisconnected,
    /// The peer closed the connection and said why (its `Close` frame): the text is its
    /// own close reason, for example a budget it says this side broke.
    #[error("the peer closed the connection: {0}")]
    PeerClosed(String),
    /// This side closed it (a session or the application asked).
    #[error("closed locally: {0}")]
    Local(String),
    /// The peer broke the wire protocol (malformed frame, bad rendezvous, ...).
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The service session returned an error.
    #[error("session error: {0}")]
    Session(String),
    /// The peer stopped acknowledging: a request (or a keepalive probe of a silent
    /// connection) was retransmitted `ConnectionConfig::retry_count` times without an ACK. The
    /// peer's host died, or the network between has been down for longer than the retry
    /// span; either way it may never say goodbye, so this side closes.
    #[error("peer unreachable: {0}")]
    PeerUnreachable(String),
    /// A work request failed (the QP is in the error state).
    #[error("work request failed: {0}")]
    Completion(String),
    /// A verb failed while serving the connection.
    #[error("verbs error: {0}")]
    Verbs(String),
    /// The memory pool could not serve the connection.
    #[error("memory: {0}")]
    Memory(String),
    /// The session panicked in one of its callbacks; the message is the panic's. The
    /// framework caught it at the session boundary, so only this connection ends.
    #[error("session panicked: {0}")]
    SessionPanicked(String),
    /// More was queued for sending than the connection may hold
    /// (`ConnectionConfig::max_queued_bytes`, `max_queued_sends`): the peer is not taking
    /// what it asked for (no receives posted, no credits returned).
    #[error("peer not receiving: {bytes} bytes queued in {sends} sends")]
    Backlog {
        /// Bytes of queued messages.
        bytes: usize,
        /// Queued work items.
        sends: usize,
    },
    /// The connection was accepted but never established within
    /// `ConnectionConfig::handshake_timeout`: the peer never finished the rdma_cm handshake.
    #[error("handshake not finished within {0:?}")]
    HandshakeTimeout(std::time::Duration),
    /// No message arrived for `ConnectionConfig::idle_timeout`.
    #[error("idle: no message for {0:?}")]
    IdleTimeout(std::time::Duration),
    /// The RDMA device went (removed, `rdma link delete`, or failed): every connection
    /// on it ends. A server serves again once the device is back.
    #[error("the RDMA device is gone: {0}")]
    DeviceLost(String),
    /// The server or client is shutting down.
    #[error("shutting down")]
    Shutdown,
}
