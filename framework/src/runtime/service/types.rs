//! The words the plug-in API and the connection machinery share: how a service's
//! messages travel, who the peer is, a message as a session receives it, and the
//! errors and ids of a session. A leaf: the connection core names these without
//! knowing the traits of `service/mod.rs`.

use std::net::SocketAddr;

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
    /// Who the peer proved to be: a key's identity on an authenticated-only service,
    /// anonymous on any other (see `runtime::auth`). A session or handler authorizes by
    /// this, never by the address, which anyone on the fabric can take.
    pub identity: Identity,
}

/// Who a connection's peer is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Identity {
    /// The peer proved nothing: a service that takes anonymous clients.
    Anonymous,
    /// The peer proved it holds a key of this identity of the server's authorized keys.
    Key(String),
}

impl Identity {
    /// The identity's name, when it proved one.
    pub fn name(&self) -> Option<&str> {
        match self {
            Identity::Anonymous => None,
            Identity::Key(name) => Some(name),
        }
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Identity::Anonymous => f.write_str("anonymous"),
            Identity::Key(name) => f.write_str(name),
        }
    }
}

/// A message from the peer, as a [`Session`](super::Session) receives it. (Named apart from
/// `actix::Message`, which a service with an owner actor imports too.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incoming {
    /// What the message is: 0 for a one-way message (the client's `send`, `send_all`;
    /// nobody waits, so answer nothing) and for every message of a raw connection; any
    /// other value is a request, which the client's `request` waits on until an answer
    /// comes under the same tag ([`SessionCx::reply`](crate::runtime::SessionCx::reply)).
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
