//! The actor runtime: a CM actor accepting and initiating connections, one connection
//! actor per cm_id, CQ-polling threads routing completions to them, and services plugged
//! in behind [`Service`].
//!
//! ```text
//! rdma_cm event channel ──► CM actor ──spawns──► connection actor (one per cm_id)
//!                                │                   ▲            │
//!                                │ shared PD, MR pool│completions │ Session callbacks
//!                                ▼                   │            ▼
//!                           device (context)    CQ-polling threads   service sessions
//! ```

mod admission;
mod auth;
mod budget;
mod chunk_line;
mod client;
mod client_session;
mod cm;
mod cm_auth;
mod cm_counters;
mod config;
mod conn_set;
mod connect;
mod connection;
mod device_watch;
mod handler;
mod handshakes;
mod heap;
mod inbox;
mod machine;
mod node;
mod oob;
mod poller;
mod recovery;
mod recv_groups;
mod registrar;
mod server;
mod service;
mod srq;
mod turns;
mod wake_route;

pub use auth::{
    valid_identity, AuthPolicy, AuthRefusal, Authenticated, AuthorizedKey, Credential,
    CredentialError, KeySet, Keys, KeysError, Proof, ProofKind, Secret, AUTH_TAG,
    DEFAULT_AUTH_TIMEOUT, FAILURE_BURST, FAILURE_REFILL_PER_SEC, KEY_FILE_HEADER, MAX_IDENTITY,
    MAX_PROOF, NONCE_LEN,
};
pub use chunk_line::{ChunkRoom, ChunkWaiter, ServiceChunks};
pub use client::{Client, ClientConnection, ClientError, ClientStats};
pub use client_session::{RawProof, RequestError};
pub use config::{
    ConfigError, ConnectionConfig, NodeConfig, ReceiveConfig, SharedRecvConfig, TransportConfig,
    MAX_MESSAGE,
};
pub use connect::ConnectError;
#[doc(hidden)]
pub use connection::{
    adversarial, fuzz_connection, fuzz_connection_outcome, replay_frames, Checked, Outcome,
    EXPOSED_LEN, EXPOSED_RKEY,
};
pub use connection::{
    AskError, Asked, Blocking, BlockingError, BufId, Grant, GrantId, Op, SessionCx, SessionWaker,
};
pub use handler::{
    Answer, CallError, HandlerService, OneSidedError, Refusal, RequestCx, RequestHandler,
};
pub use heap::{HeapBudget, HeapError, Held};
pub use machine::{Driver, Flow, MachineCx, MachineSession, StateMachine};
pub use oob::{OobOptions, OobPort, OobStats, OobTransport};
pub use poller::PollMode;
pub use recv_groups::ReserveStats;
pub use server::{
    Server, ServerBuilder, ServerError, ServerStats, DEFAULT_MAX_CONNECTIONS_PER_PEER,
};
pub use service::{
    DecodeError, Framing, Identity, Incoming, OpId, PeerInfo, Service, Session, SessionError,
};

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

/// A transport's error as a server's or client's error takes it: a verbs error keeps its
/// type (callers match on it), any other is boxed.
fn verbs_or_boxed<E: std::error::Error + Send + Sync + 'static>(
    e: E,
) -> Result<crate::verbs::VerbsError, Box<dyn std::error::Error + Send + Sync>> {
    let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(e);
    boxed.downcast::<crate::verbs::VerbsError>().map(|v| *v)
}
