//! The crate's one error type.

use std::time::Duration;

/// What went wrong talking to etcd or reading the registry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An etcd call failed (connection refused, no leader, ...).
    #[error("etcd {op}: {source}")]
    Etcd {
        /// The call.
        op: &'static str,
        /// etcd-client's error.
        #[source]
        source: Box<etcd_client::Error>,
    },
    /// An etcd call had no answer in time.
    #[error("etcd {op}: no answer within {timeout:?}")]
    Timeout {
        /// The call.
        op: &'static str,
        /// How long it was given.
        timeout: Duration,
    },
    /// No etcd endpoint was given.
    #[error("no etcd endpoint given")]
    NoEndpoints,
    /// A cluster, service or node name that would break the key layout.
    #[error("{what} name {name:?} {why}")]
    InvalidName {
        /// Which name.
        what: &'static str,
        /// The name.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A registry value that is not a node record.
    #[error("registry entry {key}: {reason}")]
    BadRecord {
        /// Its key.
        key: String,
        /// The JSON error.
        reason: String,
    },
    /// Another lease holds one of this node's keys: another server runs with the same
    /// node id, or this server's previous run, whose lease has not expired yet.
    #[error("node id {node:?} is taken: {key} is held by lease {lease:x} (another server with this node id, or a previous run whose lease has not expired)")]
    NodeIdTaken {
        /// The node id.
        node: String,
        /// The key found taken.
        key: String,
        /// The lease holding it.
        lease: i64,
    },
    /// The node's lease is gone (expired while etcd did not hear from it, or revoked):
    /// its keys are gone with it.
    #[error("lease {lease:x} lost: {why}")]
    LeaseLost {
        /// The lease.
        lease: i64,
        /// How that was noticed.
        why: String,
    },
    /// A credential file for etcd (a certificate, a key, a password) cannot be read.
    #[error("etcd credentials {}: {why}", path.display())]
    Credentials {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        why: String,
    },
    /// etcd refused the call for want of permission: this process's etcd user (its
    /// client certificate's common name, or its user name) may not do it. A client
    /// set up as docs/operations.md says meets this when it tries to write.
    #[error("etcd {op}: permission denied ({why})")]
    PermissionDenied {
        /// The call.
        op: &'static str,
        /// etcd's words.
        why: String,
    },
    /// A server's catalog recorder could not start.
    #[error("the catalog recorder: {0}")]
    Recorder(String),
    /// The registrar's task has ended.
    #[error("the registrar has stopped")]
    Stopped,
}

/// The crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
