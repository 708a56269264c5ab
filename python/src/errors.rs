//! The exceptions: one class per kind of failure a caller acts on, the C library's
//! statuses, under one base, `rdmactor.Error`, so that `except rdmactor.Error` catches
//! everything the library raises and `except rdmactor.Timeout` only what it names.
//! The message is the C library's last-error text: the framework's reason, a server's
//! close reason in its own words.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use rdmactor_c::status::{rdmactor_status as S, Failure};

create_exception!(
    rdmactor,
    Error,
    PyException,
    "Base of every error the library raises."
);
create_exception!(
    rdmactor,
    InvalidArgument,
    Error,
    "The call was wrong: an address that does not parse, a bad name or length."
);
create_exception!(
    rdmactor,
    Timeout,
    Error,
    "The timeout passed first; what was under way was abandoned."
);
create_exception!(
    rdmactor,
    BufferTooSmall,
    Error,
    "read_into's buffer is smaller than the region: `args[1]` is the length needed."
);
create_exception!(
    rdmactor,
    Closed,
    Error,
    "The connection (or its context) is closed; the message says why."
);
create_exception!(
    rdmactor,
    Refused,
    Error,
    "The server refused: an unknown service, a limit, a message larger than it takes."
);
create_exception!(
    rdmactor,
    Auth,
    Error,
    "The service asked for an identity this client did not prove, or the key file failed."
);
create_exception!(
    rdmactor,
    Unreachable,
    Error,
    "The address could not be resolved or reached."
);
create_exception!(
    rdmactor,
    Busy,
    Error,
    "Try again later: no room in the pool, a transfer already running, a region kept changing."
);
create_exception!(
    rdmactor,
    IoFailure,
    Error,
    "A local failure: the device, a verb, a file, an RDMA operation's error status."
);
create_exception!(
    rdmactor,
    ProtocolError,
    Error,
    "The peer answered something the protocol does not allow, or is not an rdmactor server."
);
create_exception!(
    rdmactor,
    NotFound,
    Error,
    "No such thing on the server: a region the read service does not serve."
);
create_exception!(
    rdmactor,
    ShuttingDown,
    Error,
    "The context is being closed."
);
create_exception!(
    rdmactor,
    InternalError,
    Error,
    "A bug in the library (a panic caught at the boundary): please report it."
);

/// The exception for `f`. A bad handle is a closed one: Python objects hold only
/// handles the library issued, so a handle refused is one closed already (by `close`,
/// or by its context's).
pub fn to_py(f: Failure) -> PyErr {
    let m = f.message;
    match f.status {
        S::RDMACTOR_INVALID_ARGUMENT => InvalidArgument::new_err(m),
        S::RDMACTOR_BAD_HANDLE | S::RDMACTOR_CLOSED => Closed::new_err(m),
        S::RDMACTOR_TIMEOUT => Timeout::new_err(m),
        S::RDMACTOR_BUFFER_TOO_SMALL => BufferTooSmall::new_err(m),
        S::RDMACTOR_REFUSED => Refused::new_err(m),
        S::RDMACTOR_AUTH => Auth::new_err(m),
        S::RDMACTOR_UNREACHABLE => Unreachable::new_err(m),
        S::RDMACTOR_BUSY => Busy::new_err(m),
        S::RDMACTOR_IO => IoFailure::new_err(m),
        S::RDMACTOR_PROTOCOL => ProtocolError::new_err(m),
        S::RDMACTOR_NOT_FOUND => NotFound::new_err(m),
        S::RDMACTOR_SHUTTING_DOWN => ShuttingDown::new_err(m),
        S::RDMACTOR_INTERNAL | S::RDMACTOR_OK => InternalError::new_err(m),
    }
}

/// Adds the classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("InvalidArgument", py.get_type::<InvalidArgument>())?;
    m.add("Timeout", py.get_type::<Timeout>())?;
    m.add("BufferTooSmall", py.get_type::<BufferTooSmall>())?;
    m.add("Closed", py.get_type::<Closed>())?;
    m.add("Refused", py.get_type::<Refused>())?;
    m.add("Auth", py.get_type::<Auth>())?;
    m.add("Unreachable", py.get_type::<Unreachable>())?;
    m.add("Busy", py.get_type::<Busy>())?;
    m.add("IoFailure", py.get_type::<IoFailure>())?;
    m.add("ProtocolError", py.get_type::<ProtocolError>())?;
    m.add("NotFound", py.get_type::<NotFound>())?;
    m.add("ShuttingDown", py.get_type::<ShuttingDown>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    Ok(())
}
