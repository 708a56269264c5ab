//! The status every entry point returns, and how the framework's errors map onto it.
//!
//! C callers branch on a small set of kinds (retry? reconnect? fix the call?), so the
//! framework's many error enums are folded by what the caller can do about them; the
//! full text, with the framework's own reason, goes to `rdmactor_last_error`.

#![allow(non_camel_case_types)]

use rdmactor::proto::budget::BudgetError;
use rdmactor::runtime::{ClientError, ConnectError, CredentialError, RequestError};
use rdmactor_services::file_transfer::{ClientError as FilesError, TransferError};
use rdmactor_services::members::BootstrapError;
use rdmactor_services::read::ReadError;

/// What a call came to. Every entry point returns one of these as an `int`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rdmactor_status {
    /// Done.
    RDMACTOR_OK = 0,
    /// A NULL pointer where one is needed, a string that is not UTF-8, an address that
    /// does not parse, a length that does not fit: fix the call.
    RDMACTOR_INVALID_ARGUMENT = 1,
    /// A handle that was never issued, was closed or freed already, or is of another
    /// kind. Nothing was done.
    RDMACTOR_BAD_HANDLE = 2,
    /// The timeout passed first. What was under way is abandoned (see each call).
    RDMACTOR_TIMEOUT = 3,
    /// The caller's buffer is too small: the length needed was written to the call's
    /// length out-parameter.
    RDMACTOR_BUFFER_TOO_SMALL = 4,
    /// The connection is closed; the last error says why (the framework's close
    /// reason, the server's own words when it gave them). Close the handle.
    RDMACTOR_CLOSED = 5,
    /// The server refused: the connect was rejected (an unknown service, a limit), or a
    /// message is larger than the connection takes. The connection, if any, goes on.
    RDMACTOR_REFUSED = 6,
    /// The service asked for an identity this client did not prove, or the key file
    /// could not be used.
    RDMACTOR_AUTH = 7,
    /// The address could not be resolved or reached (rdma_cm's own failure).
    RDMACTOR_UNREACHABLE = 8,
    /// Try again later: the memory pool had no room, a file transfer is already
    /// running on the connection, a region kept changing while read, or too many
    /// operations are in flight on the context.
    RDMACTOR_BUSY = 9,
    /// A local failure: the device, a verb, a file, or an RDMA operation that
    /// completed with an error status (a READ outside a region).
    RDMACTOR_IO = 10,
    /// The peer answered something the protocol does not allow here, or is not an
    /// rdmactor server.
    RDMACTOR_PROTOCOL = 11,
    /// No such thing on the server: a region name the `read` service does not serve.
    RDMACTOR_NOT_FOUND = 12,
    /// The context is being freed.
    RDMACTOR_SHUTTING_DOWN = 13,
    /// A bug in the library (a panic, caught at the boundary). Please report it with
    /// the last error's text.
    RDMACTOR_INTERNAL = 14,
}

pub use rdmactor_status::*;

/// A failed call: its status and the text `rdmactor_last_error` returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub status: rdmactor_status,
    pub message: String,
}

impl Failure {
    pub fn new(status: rdmactor_status, message: impl Into<String>) -> Failure {
        Failure {
            status,
            message: message.into(),
        }
    }

    pub fn bad_handle(what: &str) -> Failure {
        Failure::new(
            RDMACTOR_BAD_HANDLE,
            format!("{what}: not a live handle (never issued, already closed or freed, or of another kind)"),
        )
    }

    pub fn invalid(message: impl Into<String>) -> Failure {
        Failure::new(RDMACTOR_INVALID_ARGUMENT, message)
    }
}

/// Library-wide result.
pub type Result<T, E = Failure> = std::result::Result<T, E>;

impl From<ConnectError> for Failure {
    fn from(e: ConnectError) -> Failure {
        let status = match &e {
            ConnectError::Rejected(_) | ConnectError::RejectedByTransport(_) => RDMACTOR_REFUSED,
            ConnectError::NotRdmactor => RDMACTOR_PROTOCOL,
            ConnectError::Failed { .. } => RDMACTOR_UNREACHABLE,
            ConnectError::Auth(_) => RDMACTOR_AUTH,
            ConnectError::ShuttingDown => RDMACTOR_SHUTTING_DOWN,
            ConnectError::Abandoned => RDMACTOR_TIMEOUT,
            _ => RDMACTOR_IO,
        };
        Failure::new(status, format!("connect: {e}"))
    }
}

impl From<BootstrapError> for Failure {
    fn from(e: BootstrapError) -> Failure {
        let status = match &e {
            BootstrapError::NoSeeds => RDMACTOR_INVALID_ARGUMENT,
            BootstrapError::NoList(_) | BootstrapError::NoneServed(_) => RDMACTOR_UNREACHABLE,
        };
        Failure::new(status, format!("connect through the cluster: {e}"))
    }
}

impl From<RequestError> for Failure {
    fn from(e: RequestError) -> Failure {
        let status = match &e {
            RequestError::Closed(_) => RDMACTOR_CLOSED,
            RequestError::Refused(BudgetError::NoRoom { .. }) => RDMACTOR_BUSY,
            RequestError::Refused(_) => RDMACTOR_REFUSED,
            RequestError::Invalid(_) => RDMACTOR_INVALID_ARGUMENT,
            _ => RDMACTOR_IO,
        };
        Failure::new(status, e.to_string())
    }
}

impl From<ReadError> for Failure {
    fn from(e: ReadError) -> Failure {
        match e {
            ReadError::Request(e) => e.into(),
            ReadError::UnknownRegion(_) => Failure::new(RDMACTOR_NOT_FOUND, e.to_string()),
            ReadError::Refused(_) => Failure::new(RDMACTOR_REFUSED, e.to_string()),
            ReadError::Contended(_) => Failure::new(RDMACTOR_BUSY, e.to_string()),
            _ => Failure::new(RDMACTOR_PROTOCOL, e.to_string()),
        }
    }
}

impl From<FilesError> for Failure {
    fn from(e: FilesError) -> Failure {
        match e {
            FilesError::Send { source, what } => {
                let f = Failure::from(source);
                Failure::new(f.status, format!("sending {what}: {}", f.message))
            }
            FilesError::Write { source, index } => {
                let f = Failure::from(source);
                Failure::new(f.status, format!("WRITE of chunk {index}: {}", f.message))
            }
            FilesError::Closed => Failure::new(RDMACTOR_CLOSED, e.to_string()),
            FilesError::Transfer(t) => {
                let status = match &t {
                    TransferError::Source(_)
                    | TransferError::SourceTruncated { .. }
                    | TransferError::Store(_) => RDMACTOR_IO,
                    TransferError::Name(_) | TransferError::Invalid(_) => RDMACTOR_INVALID_ARGUMENT,
                    _ => RDMACTOR_PROTOCOL,
                };
                Failure::new(status, t.to_string())
            }
            _ => Failure::new(RDMACTOR_IO, e.to_string()),
        }
    }
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Failure {
        let status = match &e {
            ClientError::Invalid(_) => RDMACTOR_INVALID_ARGUMENT,
            _ => RDMACTOR_IO,
        };
        Failure::new(status, format!("starting the client: {e}"))
    }
}

impl From<CredentialError> for Failure {
    fn from(e: CredentialError) -> Failure {
        Failure::new(RDMACTOR_AUTH, format!("key file: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdmactor::runtime::CloseReason;

    #[test]
    fn kinds_follow_what_the_caller_can_do() {
        let closed = RequestError::Closed(CloseReason::PeerClosed("bye".into()));
        let f = Failure::from(closed);
        assert_eq!(f.status, RDMACTOR_CLOSED);
        assert!(f.message.contains("bye"), "{}", f.message);
        let no_room = RequestError::Refused(BudgetError::NoRoom {
            len: 1,
            waited_ms: 5,
        });
        assert_eq!(Failure::from(no_room).status, RDMACTOR_BUSY);
        let too_large = RequestError::Refused(BudgetError::TooLarge { len: 9, max: 1 });
        assert_eq!(Failure::from(too_large).status, RDMACTOR_REFUSED);
        assert_eq!(
            Failure::from(ConnectError::Auth("unknown identity".into())).status,
            RDMACTOR_AUTH
        );
        assert_eq!(
            Failure::from(ReadError::UnknownRegion("x".into())).status,
            RDMACTOR_NOT_FOUND
        );
        assert_eq!(Failure::from(FilesError::Closed).status, RDMACTOR_CLOSED);
    }
}
