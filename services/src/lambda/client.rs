//! Client helpers: upload a module, invoke a lambda on regions the client registered.

use rdmactor::runtime::{ClientConnection, RequestError};
use rdmactor::transport::Transport;
use rdmactor::verbs::RemoteRegion;

use super::sandbox::{Limits, ModuleHash};
use super::wire::{Failure, FailureKind, LambdaRef, LambdaRequest, LambdaResponse, WireLimits};

/// Why a lambda call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The server answered with a failure (the connection stays usable).
    #[error("lambda failed: {0}")]
    Failed(Failure),
    /// The request failed or the connection closed.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The server answered something unexpected.
    #[error("unexpected reply: {0}")]
    Protocol(String),
}

impl CallError {
    /// The failure's kind, when the server reported one.
    pub fn kind(&self) -> Option<FailureKind> {
        match self {
            CallError::Failed(f) => Some(f.kind),
            _ => None,
        }
    }
}

/// What to run and on which regions, for [`invoke`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// The lambda.
    pub lambda: LambdaRef,
    /// A region registered with `REMOTE_READ` holding the input at its start.
    pub input: RemoteRegion,
    /// Input bytes.
    pub input_len: u64,
    /// A region registered with `REMOTE_WRITE` for the output.
    pub output: RemoteRegion,
    /// Limits wished for (`None`: the server's cap).
    pub limits: Option<Limits>,
}

async fn call<T: Transport>(
    conn: &ClientConnection<T>,
    req: &LambdaRequest,
) -> Result<LambdaResponse, CallError> {
    Ok(conn.request_typed(req).await?)
}

/// Uploads a WebAssembly module; returns the hash that names it.
///
/// # Errors
/// [`CallError::Failed`] with [`FailureKind::InvalidModule`], `ImportsNotAllowed`,
/// `MissingExport`, `ModuleTooLarge`, `CacheFull` or `Busy`; [`CallError::Request`].
pub async fn upload<T: Transport>(
    conn: &ClientConnection<T>,
    module: &[u8],
) -> Result<ModuleHash, CallError> {
    let req = LambdaRequest::Upload {
        module: module.to_vec(),
    };
    match call(conn, &req).await? {
        LambdaResponse::Loaded { hash } => Ok(hash),
        LambdaResponse::Failed(f) => Err(CallError::Failed(f)),
        other => Err(CallError::Protocol(format!("{other:?}"))),
    }
}

/// Runs a lambda on the client's input region and returns how many output bytes it
/// wrote to the start of the output region.
///
/// # Errors
/// [`CallError::Failed`] with the kind of failure (`Trap`, `OutOfFuel`, `Timeout`,
/// `MemoryLimit`, `UnknownLambda`, `OutputTooLarge`, `Busy` when the service's job slots
/// are taken, `HeapFull` when the server's heap budget has no room for the input and
/// output, ...); [`CallError::Request`] when
/// the connection closed (for example because a region lacked the access it needs).
pub async fn invoke<T: Transport>(
    conn: &ClientConnection<T>,
    inv: &Invocation,
) -> Result<u64, CallError> {
    let req = LambdaRequest::Invoke {
        lambda: inv.lambda.clone(),
        input: inv.input,
        input_len: inv.input_len,
        output: inv.output,
        limits: inv.limits.map(WireLimits::from),
    };
    match call(conn, &req).await? {
        LambdaResponse::Done { len } => Ok(len),
        LambdaResponse::Failed(f) => Err(CallError::Failed(f)),
        other => Err(CallError::Protocol(format!("{other:?}"))),
    }
}
