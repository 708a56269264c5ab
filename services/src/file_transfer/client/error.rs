//! Why a client's transfer or question did not reach a verdict.

use rdmactor::runtime::RequestError;

use crate::file_transfer::error::TransferError;

/// Why a transfer did not reach a verdict. The connection is closed after any of them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The protocol went wrong (either peer) or a local file operation failed.
    #[error(transparent)]
    Transfer(#[from] TransferError),
    /// Sending a control message failed.
    #[error("sending {what} failed: {source}")]
    Send {
        /// The message.
        what: &'static str,
        /// Why.
        #[source]
        source: RequestError,
    },
    /// A chunk's WRITE failed (for example a remote access error).
    #[error("WRITE of chunk {index} failed: {source}")]
    Write {
        /// The chunk.
        index: u32,
        /// Why.
        #[source]
        source: RequestError,
    },
    /// Registering the download window failed.
    #[error("registering a window of {len} bytes failed: {source}")]
    Register {
        /// Bytes.
        len: u64,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The connection closed before the verdict.
    #[error("the connection closed during the transfer")]
    Closed,
}
