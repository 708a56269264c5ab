//! What a loopback call can refuse. Failures of work requests are not here: as on a
//! NIC, they are completions with a status.

/// A loopback call that failed before any work was queued.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoopbackError {
    /// An argument a NIC would refuse (a range outside a region, an empty
    /// registration, oversize private data, an inline send over the QP's cap, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The send or receive queue already holds as many requests as it was created for.
    #[error("{queue} full: {capacity} requests outstanding")]
    QueueFull {
        /// Which queue.
        queue: &'static str,
        /// Its capacity.
        capacity: usize,
    },
    /// A fault hook refuses registrations (what `ibv_reg_mr` failing looks like).
    #[error("registration of {len} bytes refused (fault hook)")]
    RegistrationRefused {
        /// Bytes asked for.
        len: usize,
    },
    /// The device was removed (fault hook); nothing new is created on it.
    #[error("the loopback device {0:?} was removed")]
    DeviceRemoved(String),
    /// A connection-manager call in a state that does not allow it (accept without a
    /// request, connect twice, disconnect while not connected, ...).
    #[error("connection manager: {0}")]
    BadState(&'static str),
    /// Another id already listens on this address.
    #[error("address {0} already has a listener")]
    AddressInUse(std::net::SocketAddr),
    /// A completion queue received more completions than it holds; as on a NIC, its
    /// contents can no longer be trusted.
    #[error("completion queue {0} overran")]
    CqOverrun(u32),
}

/// Result alias of the loopback transport.
pub type Result<T, E = LoopbackError> = std::result::Result<T, E>;
