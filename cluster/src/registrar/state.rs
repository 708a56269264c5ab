//! Where a registration stands, as its task publishes it and the server reads it.

/// Where a node's registration stands.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RegistrationState {
    /// The first attempt is under way.
    Connecting,
    /// Every service is registered under this lease, kept alive.
    Registered {
        /// The lease.
        lease: i64,
    },
    /// Not registered (etcd unreachable, the lease lost, the node id taken): retrying.
    /// The server goes on serving meanwhile.
    Retrying {
        /// Failures in a row.
        attempt: u32,
        /// The last one.
        error: String,
    },
    /// Marked draining; the lease is being revoked.
    Draining,
    /// Withdrawn: no key of this node is left under its lease.
    Withdrawn,
}

impl RegistrationState {
    /// Whether the node is listed and kept alive now.
    pub fn is_registered(&self) -> bool {
        matches!(self, RegistrationState::Registered { .. })
    }
}
