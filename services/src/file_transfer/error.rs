//! The one error type of the file-transfer state machines. Every error is terminal for
//! the state machine that returned it: the driver ends the connection with its text.

use std::io;

use super::name::NameError;
use super::store::StoreError;

/// What went wrong in a transfer. Peer misbehaviour (out-of-order messages, chunks,
/// acks, grants) and local failures (reading the source, writing the temporary file)
/// alike; refusals that the protocol expresses (bad names, oversize offers, existing
/// files, digest mismatches) are messages, not errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransferError {
    /// A control message did not decode.
    #[error("malformed file-transfer message: {0}")]
    Malformed(String),
    /// A message that the protocol does not allow in the current state.
    #[error("unexpected {what} while {state}")]
    Unexpected {
        /// The message or event (`"Offer"`, `"chunk 3"`, ...).
        what: String,
        /// The state, in words (`"receiving chunks"`, ...).
        state: &'static str,
    },
    /// A chunk arrived out of order.
    #[error("chunk {got} arrived, expected chunk {expected}")]
    ChunkOrder {
        /// The index that arrived.
        got: u32,
        /// The index expected next.
        expected: u64,
    },
    /// A chunk's bytes have the wrong length.
    #[error("chunk {index} has {got} bytes, expected {expected}")]
    ChunkLength {
        /// The chunk.
        index: u32,
        /// Bytes given.
        got: usize,
        /// Bytes the chunk holds.
        expected: u32,
    },
    /// DONE arrived before every chunk.
    #[error("Done after {received} of {expected} chunks")]
    EarlyDone {
        /// Chunks consumed.
        received: u64,
        /// Chunks in the file.
        expected: u64,
    },
    /// The receiver's grant does not fit the offer or the sender's limits.
    #[error("bad window grant: {0}")]
    BadGrant(String),
    /// An acknowledgement that does not follow the chunks written.
    #[error("bad Ack {next}: {why}")]
    BadAck {
        /// The acknowledged index.
        next: u32,
        /// What is wrong with it.
        why: String,
    },
    /// The peer's offer for a fetched file is not the file asked for.
    #[error("offer does not match the fetch: {0}")]
    FetchMismatch(String),
    /// The driver reported something that the state machine did not ask for (a bug in
    /// the driver, not in the peer).
    #[error("driver error: {0}")]
    Driver(String),
    /// Reading the file being sent failed.
    #[error("reading the source file failed: {0}")]
    Source(#[source] io::Error),
    /// The file being sent ended before its offered length.
    #[error("the source file ended at byte {at} of {len}")]
    SourceTruncated {
        /// Bytes read.
        at: u64,
        /// Bytes offered.
        len: u64,
    },
    /// Writing the received file failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A name given locally (not by the peer) is not a plain file name.
    #[error(transparent)]
    Name(#[from] NameError),
    /// An argument or configuration value is out of range.
    #[error("invalid argument: {0}")]
    Invalid(String),
}

/// Result of the file-transfer state machines.
pub type Result<T, E = TransferError> = std::result::Result<T, E>;
