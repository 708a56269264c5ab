//! The types of the C interface, laid out for C (`#[repr(C)]`), named as the header
//! names them.

#![allow(non_camel_case_types)]

use std::ffi::c_char;

/// A library context: the runtime thread, the RDMA device's resources, and the queue
/// that non-blocking operations complete to. An id, never a pointer: a freed or
/// made-up context is refused with `RDMACTOR_BAD_HANDLE`. `{0}` is never a context.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct rdmactor_ctx {
    pub id: u64,
}

/// A connection to one service of one server. An id, like `rdmactor_ctx`: a closed
/// connection's handle is refused with `RDMACTOR_BAD_HANDLE`, even once its slot holds
/// a newer connection. `{0}` is never a connection.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct rdmactor_conn {
    pub id: u64,
}

/// The `files` service's verdict on a transfer that reached one.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rdmactor_verdict {
    /// The digest matched and the file is stored (on the server for an upload, in the
    /// directory for a fetch).
    RDMACTOR_VERDICT_GOOD = 0,
    /// The bytes that arrived hash to something else; nothing was stored.
    RDMACTOR_VERDICT_BAD = 1,
    /// Refused before any byte moved (a name taken without overwrite, no such file, a
    /// quota, a bad name); `reason` says which.
    RDMACTOR_VERDICT_REJECTED = 2,
    /// Ended midway by either side; nothing was stored.
    RDMACTOR_VERDICT_ABORTED = 3,
}

/// Replace a file of the same name (on the server for an upload, in the directory
/// for a fetch). Without it, an existing file makes the transfer `REJECTED`.
pub const RDMACTOR_FILE_OVERWRITE: u32 = 1;

/// Bytes of `rdmactor_file_result.reason`, its NUL included.
pub const RDMACTOR_REASON_LEN: usize = 256;

/// Bytes of `rdmactor_completion.error`, its NUL included.
pub const RDMACTOR_ERROR_LEN: usize = 192;

/// How a file transfer ended. Filled by `rdmactor_file_send` and `rdmactor_file_fetch`
/// when they return `RDMACTOR_OK`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rdmactor_file_result {
    pub verdict: rdmactor_verdict,
    /// The file's length in bytes (0 if the transfer ended before an offer).
    pub bytes: u64,
    /// The file's SHA-256 as 64 lowercase hex digits and a NUL, as `sha256sum` prints
    /// it; empty if the transfer ended before an offer.
    pub sha256_hex: [c_char; 65],
    /// Why, for anything but GOOD, NUL-terminated (cut to fit).
    pub reason: [c_char; RDMACTOR_REASON_LEN],
}

/// One finished non-blocking operation, from `rdmactor_poll_completions`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rdmactor_completion {
    /// The id its submit returned.
    pub op: u64,
    /// The caller's value given at submit, unchanged.
    pub user_data: u64,
    /// An `rdmactor_status`.
    pub status: i32,
    /// The connection it ran on; for a connect, the new connection (`{0}` if it
    /// failed).
    pub conn: rdmactor_conn,
    /// Reply bytes copied to the submit's buffer; with `RDMACTOR_BUFFER_TOO_SMALL`,
    /// the length the reply needed (it was dropped; for a read, nothing was read).
    pub len: usize,
    /// A read's region version (as `rdmactor_read`'s `*version`); 0 for the rest.
    pub version: u64,
    /// The message when `status` is not OK, NUL-terminated (cut to fit).
    pub error: [c_char; RDMACTOR_ERROR_LEN],
}

/// Copies `text` into a C char array, cut to fit with its NUL (at a character
/// boundary, so the cut text is still UTF-8).
pub(crate) fn fill<const N: usize>(dst: &mut [c_char; N], text: &str) {
    let mut end = text.len().min(N - 1);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    for (d, s) in dst.iter_mut().zip(text.as_bytes()[..end].iter()) {
        *d = *s as c_char;
    }
    dst[end] = 0;
}
