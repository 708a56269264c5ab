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
mod close;
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

/// The pool's part of [`NodeConfig`] (`NodeConfig::pool`), beside the rest of it.
pub use crate::memory::PoolConfig;
pub use auth::{
    valid_identity, AuthPolicy, AuthRefusal, Authenticated, AuthorizedKey, Credential,
    CredentialError, KeySet, Keys, KeysError, Proof, ProofKind, Secret, AUTH_TAG,
    DEFAULT_AUTH_TIMEOUT, FAILURE_BURST, FAILURE_REFILL_PER_SEC, KEY_FILE_HEADER, MAX_IDENTITY,
    MAX_PROOF, NONCE_LEN,
};
pub use chunk_line::{ChunkRoom, ChunkWaiter, ServiceChunks};
pub use client::{Client, ClientConnection, ClientError, ClientStats};
pub use client_session::{RawProof, RequestError};
pub use close::CloseReason;
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

/// A transport's error as a server's or client's error takes it: a verbs error keeps its
/// type (callers match on it), any other is boxed.
fn verbs_or_boxed<E: std::error::Error + Send + Sync + 'static>(
    e: E,
) -> Result<crate::verbs::VerbsError, Box<dyn std::error::Error + Send + Sync>> {
    let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(e);
    boxed.downcast::<crate::verbs::VerbsError>().map(|v| *v)
}
