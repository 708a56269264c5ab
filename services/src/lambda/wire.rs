//! The `lambda` service's messages: what a client asks, what the server answers, and the
//! kinds of failure. postcard-encoded; one request, one reply, matched by tag.

use std::time::Duration;

use rdmactor::verbs::RemoteRegion;
use serde::{Deserialize, Serialize};

use super::sandbox::{LambdaError, Limits, ModuleHash};

/// Which lambda an invocation runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LambdaRef {
    /// A module uploaded before (on any connection).
    Module(ModuleHash),
    /// A native lambda the application registered under this name.
    Native(String),
}

/// [`Limits`] on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireLimits {
    /// [`Limits::fuel`].
    pub fuel: u64,
    /// [`Limits::max_memory_bytes`].
    pub max_memory_bytes: u64,
    /// [`Limits::wall_clock`], in milliseconds.
    pub wall_clock_ms: u64,
    /// [`Limits::max_output`].
    pub max_output: u64,
}

impl From<Limits> for WireLimits {
    fn from(l: Limits) -> Self {
        WireLimits {
            fuel: l.fuel,
            max_memory_bytes: l.max_memory_bytes as u64,
            wall_clock_ms: u64::try_from(l.wall_clock.as_millis()).unwrap_or(u64::MAX),
            max_output: l.max_output as u64,
        }
    }
}

impl From<WireLimits> for Limits {
    fn from(w: WireLimits) -> Self {
        Limits {
            fuel: w.fuel,
            max_memory_bytes: usize::try_from(w.max_memory_bytes).unwrap_or(usize::MAX),
            wall_clock: Duration::from_millis(w.wall_clock_ms),
            max_output: usize::try_from(w.max_output).unwrap_or(usize::MAX),
        }
    }
}

/// A client's message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LambdaRequest {
    /// Validate, compile and cache a WebAssembly module: [`LambdaResponse::Loaded`].
    Upload {
        /// The module's bytes (binary format).
        #[serde(with = "serde_bytes")]
        module: Vec<u8>,
    },
    /// Run a lambda on `input[..input_len]` and write its output to the start of
    /// `output`: [`LambdaResponse::Done`].
    Invoke {
        /// What to run.
        lambda: LambdaRef,
        /// The client's input region (REMOTE_READ).
        input: RemoteRegion,
        /// Input bytes, from the start of `input`.
        input_len: u64,
        /// The client's output region (REMOTE_WRITE); its length caps the output.
        output: RemoteRegion,
        /// Limits wished for (module lambdas); the server caps each field, and uses its
        /// own cap for `None`.
        limits: Option<WireLimits>,
    },
}

/// The server's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LambdaResponse {
    /// The module is loaded under this hash.
    Loaded {
        /// Its name for [`LambdaRef::Module`].
        hash: ModuleHash,
    },
    /// The lambda ran; its `len` output bytes are at the start of the output region.
    Done {
        /// Output bytes written.
        len: u64,
    },
    /// Nothing ran to completion.
    Failed(Failure),
}

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct Failure {
    /// What kind of failure.
    pub kind: FailureKind,
    /// What the server said.
    pub message: String,
}

/// The kinds of [`Failure`]: one per [`LambdaError`] variant, then the service's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
#[allow(missing_docs)]
pub enum FailureKind {
    InvalidModule,
    ModuleTooLarge,
    ImportsNotAllowed,
    MissingExport,
    CacheFull,
    UnknownLambda,
    Busy,
    InputTooLarge,
    Trap,
    OutOfFuel,
    MemoryLimit,
    Timeout,
    BadResult,
    OutputTooLarge,
    GuestError,
    NativeError,
    /// The request does not make sense (e.g. `input_len` beyond the input region).
    BadRequest,
    /// The server's heap budget (`PoolConfig::heap_bytes`, shared by every client) had
    /// no room for the invocation's input and output; nothing was read or run. The
    /// connection goes on: ask again later.
    HeapFull,
}

impl From<&LambdaError> for FailureKind {
    fn from(e: &LambdaError) -> Self {
        match e {
            LambdaError::InvalidModule(_) => FailureKind::InvalidModule,
            LambdaError::ModuleTooLarge { .. } => FailureKind::ModuleTooLarge,
            LambdaError::ImportsNotAllowed(_) => FailureKind::ImportsNotAllowed,
            LambdaError::MissingExport(_) => FailureKind::MissingExport,
            LambdaError::CacheFull { .. } | LambdaError::CacheTaken { .. } => {
                FailureKind::CacheFull
            }
            LambdaError::UnknownLambda(_) => FailureKind::UnknownLambda,
            LambdaError::Busy { .. } => FailureKind::Busy,
            LambdaError::InputTooLarge { .. } => FailureKind::InputTooLarge,
            LambdaError::Trap(_) => FailureKind::Trap,
            LambdaError::OutOfFuel { .. } => FailureKind::OutOfFuel,
            LambdaError::MemoryLimit { .. } => FailureKind::MemoryLimit,
            LambdaError::Timeout { .. } => FailureKind::Timeout,
            LambdaError::BadResult(_) => FailureKind::BadResult,
            LambdaError::OutputTooLarge { .. } => FailureKind::OutputTooLarge,
            LambdaError::GuestError(_) => FailureKind::GuestError,
            LambdaError::NativeError(_) => FailureKind::NativeError,
        }
    }
}

impl From<&LambdaError> for Failure {
    fn from(e: &LambdaError) -> Self {
        Failure {
            kind: e.into(),
            message: e.to_string(),
        }
    }
}

impl Failure {
    /// A failure of `kind` with the server's `message`.
    pub(crate) fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Failure {
            kind,
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(addr: u64, len: u64) -> RemoteRegion {
        RemoteRegion { addr, len, rkey: 7 }
    }

    fn hash() -> ModuleHash {
        ModuleHash::of(b"module")
    }

    #[test]
    fn every_lambda_error_has_its_kind() {
        let cases = [
            (
                LambdaError::InvalidModule(String::new()),
                FailureKind::InvalidModule,
            ),
            (LambdaError::Trap("t".into()), FailureKind::Trap),
            (LambdaError::OutOfFuel { fuel: 1 }, FailureKind::OutOfFuel),
            (
                LambdaError::MemoryLimit { limit: 1 },
                FailureKind::MemoryLimit,
            ),
            (
                LambdaError::Timeout {
                    limit: Duration::from_millis(1),
                },
                FailureKind::Timeout,
            ),
            (LambdaError::GuestError(-1), FailureKind::GuestError),
            (
                LambdaError::CacheTaken {
                    modules: 4,
                    bytes: 8,
                },
                FailureKind::CacheFull,
            ),
        ];
        for (e, kind) in cases {
            let f = Failure::from(&e);
            assert_eq!(f.kind, kind);
            assert_eq!(f.message, e.to_string());
        }
    }

    #[test]
    fn messages_round_trip() {
        let limits: WireLimits = Limits::default().into();
        assert_eq!(Limits::from(limits), Limits::default());
        for req in [
            LambdaRequest::Upload {
                module: vec![0, 97, 115, 109],
            },
            LambdaRequest::Invoke {
                lambda: LambdaRef::Module(hash()),
                input: region(1, 2),
                input_len: 2,
                output: region(3, 4),
                limits: Some(limits),
            },
        ] {
            let bytes = postcard::to_allocvec(&req).unwrap();
            assert_eq!(postcard::from_bytes::<LambdaRequest>(&bytes).unwrap(), req);
        }
        let resp = LambdaResponse::Failed(Failure::new(FailureKind::Timeout, "slow"));
        let bytes = postcard::to_allocvec(&resp).unwrap();
        assert_eq!(
            postcard::from_bytes::<LambdaResponse>(&bytes).unwrap(),
            resp
        );
    }
}
