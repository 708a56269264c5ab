//! Why an ask is refused: the pool's one error type, kept apart from the code that
//! refuses so that every refusal names its limit the same way.

use crate::verbs::VerbsError;

/// Whatever error a transport's registration reported.
pub type RegisterError = Box<dyn std::error::Error + Send + Sync>;

/// Why a lease could not be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// Larger than the largest class.
    #[error("{len} bytes requested, the largest pool class is {largest}")]
    TooLarge {
        /// Bytes asked for.
        len: usize,
        /// Largest chunk size.
        largest: usize,
    },
    /// Registering another arena would pass the configured cap.
    #[error("memory pool exhausted: no free {class} B chunk and the cap of {limit} B reached")]
    Exhausted {
        /// The class that ran dry.
        class: usize,
        /// The cap that applied (the configured cap, less the receive reservation for
        /// classes other than the smallest).
        limit: usize,
    },
    /// Memory registered outside the pool would pass the cap.
    #[error("registering {len} B would pass the pool's cap: {in_use} B of {limit} B in use")]
    ChargeRefused {
        /// Bytes asked for.
        len: usize,
        /// Bytes registered or charged now, other than the smallest class's.
        in_use: usize,
        /// The cap for them (the configured cap less the receive reservation).
        limit: usize,
    },
    /// Registering an arena failed (the transport's error: a [`VerbsError`] on verbs).
    #[error("registering a pool arena failed: {0}")]
    Register(#[source] RegisterError),
    /// Incoming messages already hold the server's heap budget ([`PoolConfig::heap_bytes`](super::PoolConfig::heap_bytes)).
    #[error("a message of {len} B would pass the server's budget for incoming messages: {in_use} B of {limit} B held")]
    HeapFull {
        /// Bytes asked for.
        len: usize,
        /// Bytes held by messages arriving now.
        in_use: usize,
        /// The budget.
        limit: usize,
    },
}

impl From<VerbsError> for PoolError {
    fn from(e: VerbsError) -> Self {
        PoolError::Register(Box::new(e))
    }
}
