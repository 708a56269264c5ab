//! `members`: a cluster's servers, asked of any one of them.
//!
//! A client that knows one server's address (or a few, in case one is down) asks it
//! which servers serve a service now, then connects to one of them: the bootstrap of
//! Kafka's and Cassandra's clients. The servers watch the registry (etcd) for their
//! clients, so a client needs no etcd credentials, no gRPC stack and no view of the
//! control plane at all: it can read only what a server chooses to answer, and write
//! nothing. This is how the C and Python clients reach a cluster.
//!
//! The answer is the service's live nodes (draining ones left out), in the order to try
//! them: least loaded first, as the server's registry reports load. It is a snapshot;
//! a node that died since its last lease renewal may still be in it, which is why
//! [`connect_via`] gives each node a dial bound and moves on.
//!
//! - server side: [`MembersService`], a [`RequestHandler`](rdmactor::runtime::RequestHandler)
//!   over a [`Directory`] (the cluster crate's watches the registry; [`StaticDirectory`]
//!   serves a fixed list);
//! - client side: [`members`] (one question) and [`connect_via`] (seeds in, a connection
//!   out).

mod client;
mod service;

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

pub use client::{
    connect_via, connect_via_with, members, Attempt, BootstrapError, Bootstrapped, DEFAULT_DIAL,
};
pub use service::{Directory, MembersService, StaticDirectory};

/// The longest service name asked about: names are short (`files`, `echo`), and a
/// request is answered from a table, never by making something of the name.
pub const MAX_SERVICE_NAME: usize = 64;

/// The most nodes one answer lists: enough for any cluster this crate serves, and a
/// bound on the answer a client must take.
pub const MAX_MEMBERS: usize = 256;

/// Which servers serve `service`?
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MembersRequest {
    /// The service, by the name clients connect to (`echo`, `files`, ...).
    pub service: String,
}

/// One server of the service, as the registry lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The node's id in the cluster.
    pub node: String,
    /// Where clients connect to it.
    pub addr: SocketAddr,
    /// The connections it last reported (the order's first key).
    pub connections: u64,
}

/// Why a server could not list a service's members.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum MembersError {
    /// The server does not know the service (it lists only the services of its cluster
    /// it watches).
    #[error("no service {0:?} in this cluster")]
    UnknownService(String),
    /// The name is longer than [`MAX_SERVICE_NAME`].
    #[error("service name of {0} bytes (at most {MAX_SERVICE_NAME})")]
    NameTooLong(usize),
    /// The server's view of the registry is not current (etcd unreachable from it, or
    /// not yet read): ask another server.
    #[error("this server's view of the registry is not current")]
    NotSynced,
}
