//! Blocking calls on connections: connect, request, send, read, files, close.
//!
//! Every blocking call takes `timeout_ms`: 0 waits as long as the operation takes
//! (a connect to a host that does not answer: about a minute, rdma_cm's own limit),
//! anything else is a limit in milliseconds, past which the call returns
//! `RDMACTOR_TIMEOUT` and what it started is abandoned as each call says.

use std::ffi::{c_char, c_int};
use std::path::PathBuf;

use super::ptr;
use super::types::{fill, rdmactor_conn, rdmactor_ctx, rdmactor_file_result, rdmactor_verdict};
use super::{guard, RDMACTOR_FILE_OVERWRITE};
use crate::api::{self, FileOp};
use crate::link::{ReadFailure, Transfer, Verdict};
use crate::status::{Failure, Result, RDMACTOR_BUFFER_TOO_SMALL};

/// Connects to `service` at `addr` (`"IP:PORT"`, e.g. `"192.0.2.1:7471"`; names are
/// not resolved). With `key_file` (a key file written by `keygen`), proves that
/// identity to a service that asks for one; NULL connects anonymously. Each distinct
/// key file costs the context one more client (device resources and polling
/// threads), made on its first use.
///
/// On `RDMACTOR_TIMEOUT` the connect is given up and its resources released.
///
/// Thread-safe: any number of threads may connect on one context at once.
///
/// # Safety
/// `addr`, `service` and `key_file` are NULL or NUL-terminated strings; `out` is NULL
/// (refused) or valid for writing one `rdmactor_conn`.
#[no_mangle]
pub unsafe extern "C" fn rdmactor_connect(
    ctx: rdmactor_ctx,
    addr: *const c_char,
    service: *const c_char,
    key_file: *const c_char,
    timeout_ms: u32,
    out: *mut rdmactor_conn,
) -> c_int {
    guard("rdmactor_connect", || {
        // SAFETY: as this function's contract says.
        unsafe {
            connect_to(
                ctx,
                (addr, "addr", false),
                service,
                key_file,
                timeout_ms,
                out,
            )
        }
    })
}

/// Connects to `service` on a server of a cluster, knowing only `seeds`: one or more
/// servers' addresses, comma-separated (`"192.0.2.1:7471,192.0.2.2:7471"`). The seeds
/// are asked in order for the servers of `service` (their `members` service, which a
/// server started with `--cluster` serves), and the servers listed, least loaded first,
/// are connected in order until one accepts. Each connect is given at most 5 s (or
/// `timeout_ms`, if shorter), so a listed server whose host died costs that bound, not
/// rdma_cm's minute. No etcd, no credentials for the registry: the servers watch it.
///
/// Fails with `RDMACTOR_UNREACHABLE` when no seed lists a server or no listed server
/// accepts; `rdmactor_last_error` then names every address tried and its reason.
/// `key_file` and `RDMACTOR_TIMEOUT` as for `rdmactor_connect`.
///
/// Thread-safe.
///
/// # Safety
/// As `rdmactor_connect`, with `seeds` in place of `addr`.
#[no_mangle]
pub unsafe extern "C" fn rdmactor_connect_cluster(
    ctx: rdmactor_ctx,
    seeds: *const c_char,
    service: *const c_char,
    key_file: *const c_char,
    timeout_ms: u32,
    out: *mut rdmactor_conn,
) -> c_int {
    guard("rdmactor_connect_cluster", || {
        // SAFETY: as this function's contract says.
        unsafe {
            connect_to(
                ctx,
                (seeds, "seeds", true),
                service,
                key_file,
                timeout_ms,
                out,
            )
        }
    })
}

/// The two connects: `target` is the string, its name, and whether it is a seed list.
///
/// # Safety
/// As `rdmactor_connect`'s contract.
unsafe fn connect_to(
    ctx: rdmactor_ctx,
    target: (*const c_char, &str, bool),
    service: *const c_char,
    key_file: *const c_char,
    timeout_ms: u32,
    out: *mut rdmactor_conn,
) -> Result<()> {
    let out = ptr::out(out, "out")?;
    // SAFETY: strings as the caller's contract says.
    let (target, service, key) = unsafe { connect_args(target, service, key_file)? };
    let id = api::connect(ctx.id, target, service, key, timeout_ms)?;
    // SAFETY: `out` is valid for one write by the caller's contract.
    unsafe { out.write(rdmactor_conn { id }) };
    Ok(())
}

/// What every connect reads from C: where (`target`: the string, its name, and
/// whether it is a seed list), the service, and the key file.
///
/// # Safety
/// The three are NUL-terminated strings, `key_file` possibly NULL.
pub(super) unsafe fn connect_args<'a>(
    target: (*const c_char, &str, bool),
    service: *const c_char,
    key_file: *const c_char,
) -> Result<(api::Target, &'a str, Option<PathBuf>)> {
    // SAFETY: strings as the caller's contract says.
    let (text, service, key) = unsafe {
        (
            ptr::str_arg(target.0, target.1)?,
            ptr::str_arg(service, "service")?,
            ptr::opt_str_arg(key_file, "key_file")?,
        )
    };
    Ok((
        api::Target::parse(text, target.2)?,
        service,
        key.map(PathBuf::from),
    ))
}

/// Closes the connection and waits until it is released on both sides; the handle is
/// bad from now on (a second close is `RDMACTOR_BAD_HANDLE`). Also the way to
/// release a connection the server closed (calls on it answer `RDMACTOR_CLOSED`).
///
/// Thread-safe; a call waiting on this connection in another thread ends with
/// `RDMACTOR_CLOSED`.
#[no_mangle]
pub extern "C" fn rdmactor_close(conn: rdmactor_conn) -> c_int {
    guard("rdmactor_close", || api::close(conn.id))
}

/// Sends `req` and waits for the service's reply, copied to `reply` (`reply_cap`
/// bytes); `*reply_len` is its length. A reply longer than `reply_cap` is
/// `RDMACTOR_BUFFER_TOO_SMALL` with `*reply_len` set to the length it needed: the
/// request was served and its reply dropped, so size the buffer for the service's
/// largest reply (`reply` may be NULL when `reply_cap` is 0).
///
/// On `RDMACTOR_TIMEOUT` the reply, if it comes, is discarded; the connection goes on.
///
/// Thread-safe: requests from several threads on one connection interleave, each
/// getting its own reply.
///
/// # Safety
/// `req` points to `req_len` readable bytes (NULL if 0); `reply` to `reply_cap`
/// writable bytes (NULL if 0); `reply_len` is valid for writing one `size_t`. None of
/// them changes or goes away during the call.
#[no_mangle]
pub unsafe extern "C" fn rdmactor_request(
    conn: rdmactor_conn,
    req: *const u8,
    req_len: usize,
    reply: *mut u8,
    reply_cap: usize,
    reply_len: *mut usize,
    timeout_ms: u32,
) -> c_int {
    guard("rdmactor_request", || {
        let reply_len = ptr::out(reply_len, "reply_len")?;
        if reply.is_null() && reply_cap > 0 {
            return Err(Failure::invalid("reply is NULL with a capacity above 0"));
        }
        // SAFETY: `req` as this function's contract says.
        let data = unsafe { ptr::bytes_arg(req, req_len, "req")? }.to_vec();
        let answer = api::request(conn.id, data, timeout_ms)?;
        // SAFETY: `reply_len` is valid for one write by this function's contract.
        unsafe { reply_len.write(answer.len()) };
        if answer.len() > reply_cap {
            return Err(too_small("reply", answer.len(), reply_cap));
        }
        // SAFETY: `reply` holds `reply_cap` writable bytes by this function's contract.
        unsafe { ptr::copy_to(reply, reply_cap, &answer) }
    })
}

pub(super) fn too_small(what: &str, needed: usize, cap: usize) -> Failure {
    Failure::new(
        RDMACTOR_BUFFER_TOO_SMALL,
        format!("{what} of {needed} bytes does not fit a buffer of {cap}"),
    )
}

/// Sends `data` as a one-way message (for services that take messages without
/// answering). Returns once the connection has queued it, in order behind earlier
/// messages; it fails only when the connection is closing.
///
/// Thread-safe.
///
/// # Safety
/// `data` points to `len` readable bytes (NULL if 0), unchanged during the call.
#[no_mangle]
pub unsafe extern "C" fn rdmactor_send(
    conn: rdmactor_conn,
    data: *const u8,
    len: usize,
    timeout_ms: u32,
) -> c_int {
    guard("rdmactor_send", || {
        // SAFETY: `data` as this function's contract says.
        let data = unsafe { ptr::bytes_arg(data, len, "data")? }.to_vec();
        api::send(conn.id, data, timeout_ms)
    })
}

/// Reads the `read` service's region `name` from byte `offset` to its end into `buf`
/// with one-sided RDMA READs (the server's CPU is not involved), consistent: all the
/// bytes belong to one version of the region, written to `*version` (may be NULL).
/// The first read of a name looks it up (one request); later ones on the connection
/// are READs only.
///
/// `*len` is the number of bytes read; `RDMACTOR_BUFFER_TOO_SMALL` when they would be
/// more than `cap`, with `*len` the length needed (nothing was read: call with
/// `buf = NULL, cap = 0` to learn a region's size). `RDMACTOR_NOT_FOUND` for a name
/// the server does not serve.
///
/// Thread-safe.
///
/// # Safety
/// `name` is a NUL-terminated string; `buf` points to `cap` writable bytes (NULL if
/// 0); `len` is valid for one `size_t` write, `version` NULL or valid for one
/// `uint64_t` write; all unchanged during the call.
#[no_mangle]
#[allow(clippy::too_many_arguments)] // the C call's shape: buffer, lengths, version out.
pub unsafe extern "C" fn rdmactor_read(
    conn: rdmactor_conn,
    name: *const c_char,
    offset: u64,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
    version: *mut u64,
    timeout_ms: u32,
) -> c_int {
    guard("rdmactor_read", || {
        let len_out = ptr::out(len, "len")?;
        let version_out = ptr::opt_out(version, "version")?;
        if buf.is_null() && cap > 0 {
            return Err(Failure::invalid("buf is NULL with a capacity above 0"));
        }
        // SAFETY: `name` as this function's contract says.
        let name = unsafe { ptr::str_arg(name, "name")? };
        let (data, v) = match api::read(conn.id, name, offset, cap, timeout_ms) {
            Ok(read) => read,
            Err(ReadFailure::TooSmall { needed }) => {
                // SAFETY: `len` is valid for one write by this function's contract.
                unsafe { len_out.write(needed) };
                return Err(too_small(&format!("region {name:?}"), needed, cap));
            }
            Err(ReadFailure::Failed(f)) => return Err(f),
        };
        // SAFETY: `buf` holds `cap` >= data.len() bytes (the read was sized to fit);
        // `len` and `version` are valid for one write each, by the contract.
        unsafe {
            ptr::copy_to(buf, cap, &data)?;
            len_out.write(data.len());
            if let Some(version_out) = version_out {
                version_out.write(v);
            }
        }
        Ok(())
    })
}

/// Uploads the file at `path` to the `files` service as `name` (NULL: the path's file
/// name), SHA-256 checked by the server, and fills `*result` with the verdict and the
/// digest. `RDMACTOR_OK` means a verdict was reached, GOOD or not: look at
/// `result->verdict`. `flags`: `RDMACTOR_FILE_OVERWRITE` or 0.
///
/// The connection carries nothing else during the transfer: a second transfer on it
/// meanwhile is `RDMACTOR_BUSY`. On any failure, `RDMACTOR_TIMEOUT` included, the
/// connection is closed (the server drops the partial file); close the handle.
///
/// Thread-safe.
///
/// # Safety
/// `path` is a NUL-terminated string, `name` NULL or one; `result` is valid for writing
/// one `rdmactor_file_result`.
#[no_mangle]
pub unsafe extern "C" fn rdmactor_file_send(
    conn: rdmactor_conn,
    path: *const c_char,
    name: *const c_char,
    flags: u32,
    result: *mut rdmactor_file_result,
    timeout_ms: u32,
) -> c_int {
    guard("rdmactor_file_send", || {
        let out = ptr::out(result, "result")?;
        // SAFETY: strings as this function's contract says.
        let op = unsafe { send_op(path, name)? };
        let overwrite = overwrite(flags)?;
        let done = api::file(conn.id, op, overwrite, timeout_ms)?;
        // SAFETY: `result` is valid for one write by this function's contract.
        unsafe { out.write(file_result(&done)) };
        Ok(())
    })
}

/// Fetches the file `name` from the `files` service into directory `dir` (same name),
/// verified with SHA-256 before it appears there, and fills `*result`. As
/// `rdmactor_file_send` otherwise (`RDMACTOR_OK` with a verdict, the connection closed
/// on failure, no partial file left).
///
/// Thread-safe.
///
/// # Safety
/// `name` and `dir` are NUL-terminated strings; `result` is valid for writing one
/// `rdmactor_file_result`.
#[no_mangle]
pub unsafe extern "C" fn rdmactor_file_fetch(
    conn: rdmactor_conn,
    name: *const c_char,
    dir: *const c_char,
    flags: u32,
    result: *mut rdmactor_file_result,
    timeout_ms: u32,
) -> c_int {
    guard("rdmactor_file_fetch", || {
        let out = ptr::out(result, "result")?;
        // SAFETY: strings as this function's contract says.
        let op = unsafe { fetch_op(name, dir)? };
        let done = api::file(conn.id, op, overwrite(flags)?, timeout_ms)?;
        // SAFETY: `result` is valid for one write by this function's contract.
        unsafe { out.write(file_result(&done)) };
        Ok(())
    })
}

/// An upload of `path` under `name` (its file name when NULL).
///
/// # Safety
/// `path` is a NUL-terminated string, `name` NULL or one.
pub(super) unsafe fn send_op(path: *const c_char, name: *const c_char) -> Result<FileOp> {
    // SAFETY: strings as the caller's contract says.
    let (path, name) = unsafe { (ptr::str_arg(path, "path")?, ptr::opt_str_arg(name, "name")?) };
    let path = PathBuf::from(path);
    let name = match name {
        Some(n) => n.to_owned(),
        None => api::upload_name(&path)?,
    };
    Ok(FileOp::Send { path, name })
}

/// A fetch of `name` into `dir`.
///
/// # Safety
/// `name` and `dir` are NUL-terminated strings.
pub(super) unsafe fn fetch_op(name: *const c_char, dir: *const c_char) -> Result<FileOp> {
    // SAFETY: strings as the caller's contract says.
    let (name, dir) = unsafe { (ptr::str_arg(name, "name")?, ptr::str_arg(dir, "dir")?) };
    Ok(FileOp::Fetch {
        name: name.to_owned(),
        dir: PathBuf::from(dir),
    })
}

pub(super) fn overwrite(flags: u32) -> Result<bool> {
    if flags & !RDMACTOR_FILE_OVERWRITE != 0 {
        return Err(Failure::invalid(format!("unknown flags {flags:#x}")));
    }
    Ok(flags & RDMACTOR_FILE_OVERWRITE != 0)
}

pub(super) fn file_result(t: &Transfer) -> rdmactor_file_result {
    let mut r = rdmactor_file_result {
        verdict: match t.verdict {
            Verdict::Good => rdmactor_verdict::RDMACTOR_VERDICT_GOOD,
            Verdict::Bad => rdmactor_verdict::RDMACTOR_VERDICT_BAD,
            Verdict::Rejected => rdmactor_verdict::RDMACTOR_VERDICT_REJECTED,
            Verdict::Aborted => rdmactor_verdict::RDMACTOR_VERDICT_ABORTED,
        },
        bytes: t.bytes,
        sha256_hex: [0; 65],
        reason: [0; super::RDMACTOR_REASON_LEN],
    };
    if let Some(d) = &t.digest {
        fill(&mut r.sha256_hex, &d.to_hex());
    }
    fill(&mut r.reason, &t.reason);
    r
}
