//! The C entry points: every `extern "C"` function of the library, and the only module
//! with `unsafe` outside the framework's verbs wrapper (scripts/lint allows this one
//! folder, and says why).
//!
//! Each entry point runs its body under `guard`: a panic becomes
//! `RDMACTOR_INTERNAL` with its message, never an unwind into C; a failure sets the
//! thread's last error. Pointers are read in `ptr.rs`, values handed to `api.rs`.

mod conn;
mod ptr;
mod submit;
mod types;

#[cfg(test)]
mod tests;

use std::ffi::{c_char, c_int};
use std::panic::{catch_unwind, AssertUnwindSafe};

pub use conn::*;
pub use submit::*;
pub use types::*;

use crate::api;
use crate::last_error;
use crate::status::{rdmactor_status, Failure, Result, RDMACTOR_INTERNAL};

/// Runs an entry point's body: its status as C sees it, the failure's message kept for
/// `rdmactor_last_error`, a panic caught.
fn guard(what: &str, body: impl FnOnce() -> Result<()>) -> c_int {
    let failure = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return rdmactor_status::RDMACTOR_OK as c_int,
        Ok(Err(failure)) => failure,
        Err(panic) => {
            let text = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            Failure::new(
                RDMACTOR_INTERNAL,
                format!("{what} panicked (a bug): {text}"),
            )
        }
    };
    last_error::set(&failure);
    failure.status as c_int
}

/// The message of the last call that failed on this thread: what went wrong, with the
/// framework's own reason (a server's close reason in its words, a connect's rdma_cm
/// event). Never NULL; empty if nothing failed on this thread yet.
///
/// The pointer stays valid until the next failing call on this thread; copy it to
/// keep it. Thread-safe: each thread has its own.
#[no_mangle]
pub extern "C" fn rdmactor_last_error() -> *const c_char {
    last_error::as_ptr()
}

/// The name of a status (`"RDMACTOR_TIMEOUT"`), for logs; `"RDMACTOR_UNKNOWN"` for a
/// value that is none. A static string: never freed, valid for ever. Thread-safe.
#[no_mangle]
pub extern "C" fn rdmactor_status_name(status: c_int) -> *const c_char {
    use rdmactor_status::*;
    let name = match status {
        s if s == RDMACTOR_OK as c_int => c"RDMACTOR_OK",
        s if s == RDMACTOR_INVALID_ARGUMENT as c_int => c"RDMACTOR_INVALID_ARGUMENT",
        s if s == RDMACTOR_BAD_HANDLE as c_int => c"RDMACTOR_BAD_HANDLE",
        s if s == RDMACTOR_TIMEOUT as c_int => c"RDMACTOR_TIMEOUT",
        s if s == RDMACTOR_BUFFER_TOO_SMALL as c_int => c"RDMACTOR_BUFFER_TOO_SMALL",
        s if s == RDMACTOR_CLOSED as c_int => c"RDMACTOR_CLOSED",
        s if s == RDMACTOR_REFUSED as c_int => c"RDMACTOR_REFUSED",
        s if s == RDMACTOR_AUTH as c_int => c"RDMACTOR_AUTH",
        s if s == RDMACTOR_UNREACHABLE as c_int => c"RDMACTOR_UNREACHABLE",
        s if s == RDMACTOR_BUSY as c_int => c"RDMACTOR_BUSY",
        s if s == RDMACTOR_IO as c_int => c"RDMACTOR_IO",
        s if s == RDMACTOR_PROTOCOL as c_int => c"RDMACTOR_PROTOCOL",
        s if s == RDMACTOR_NOT_FOUND as c_int => c"RDMACTOR_NOT_FOUND",
        s if s == RDMACTOR_SHUTTING_DOWN as c_int => c"RDMACTOR_SHUTTING_DOWN",
        s if s == RDMACTOR_INTERNAL as c_int => c"RDMACTOR_INTERNAL",
        _ => c"RDMACTOR_UNKNOWN",
    };
    name.as_ptr()
}

/// Creates a context: starts its runtime thread and opens the RDMA device rdma_cm
/// routes to (fails with `RDMACTOR_IO` and the reason when there is none). Contexts
/// are independent; most programs need one.
///
/// Thread-safe.
///
/// # Safety
/// `out` is NULL (refused) or valid for writing one `rdmactor_ctx`.
#[no_mangle]
pub unsafe extern "C" fn rdmactor_ctx_new(out: *mut rdmactor_ctx) -> c_int {
    guard("rdmactor_ctx_new", || {
        let out = ptr::out(out, "out")?;
        let id = api::ctx_new()?;
        // SAFETY: `out` is valid for one write by this function's contract.
        unsafe { out.write(rdmactor_ctx { id }) };
        Ok(())
    })
}

/// Frees a context: closes its connections (their handles become bad), waits until
/// they are released, stops its runtime thread. Operations submitted and not polled
/// are dropped (their buffers are not written again). A second free, or a context
/// never created, is `RDMACTOR_BAD_HANDLE`.
///
/// Thread-safe, but a call on one of the context's connections that is still waiting
/// in another thread ends with `RDMACTOR_CLOSED` or `RDMACTOR_SHUTTING_DOWN`.
#[no_mangle]
pub extern "C" fn rdmactor_ctx_free(ctx: rdmactor_ctx) -> c_int {
    guard("rdmactor_ctx_free", || api::ctx_free(ctx.id))
}

/// The context's completion fd: readable (`poll`, `epoll`, `select`) while completions
/// of non-blocking operations wait to be polled. An eventfd the context owns: do not
/// read, write or close it; it is closed by `rdmactor_ctx_free`.
///
/// Thread-safe.
///
/// # Safety
/// `fd` is NULL (refused) or valid for writing one `int`.
#[no_mangle]
pub unsafe extern "C" fn rdmactor_ctx_fd(ctx: rdmactor_ctx, fd: *mut c_int) -> c_int {
    guard("rdmactor_ctx_fd", || {
        let fd = ptr::out(fd, "fd")?;
        let raw = api::ctx_fd(ctx.id)?;
        // SAFETY: `fd` is valid for one write by this function's contract.
        unsafe { fd.write(raw) };
        Ok(())
    })
}
