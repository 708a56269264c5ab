//! The non-blocking form: submit an operation, get its id at once, and collect its
//! completion later from the context's queue, woken by the context's fd. One C thread
//! with one `poll`/`epoll` loop drives any number of connections this way.
//!
//! Buffers given to a submit for its reply are written only inside
//! `rdmactor_poll_completions`, on the thread that polls: the runtime thread never
//! touches C's memory, so a reply buffer needs no lock, only to outlive its
//! completion's poll.

use std::ffi::{c_char, c_int};

use super::conn::{connect_args, fetch_op, file_result, overwrite, send_op, too_small};
use super::guard;
use super::ptr;
use super::types::{
    fill, rdmactor_completion, rdmactor_conn, rdmactor_ctx, rdmactor_file_result,
    RDMACTOR_ERROR_LEN,
};
use crate::api::{self, FileOp, Submit};
use crate::runtime::{Done, Output};
use crate::status::{Failure, Result, RDMACTOR_OK};

/// Starts a connect like `rdmactor_connect`; its completion carries the new connection
/// in `conn`. `*op` is the operation's id; `user_data` comes back in the completion.
/// `RDMACTOR_BUSY` when 65,536 operations of the context wait to be polled.
///
/// Thread-safe.
///
/// # Safety
/// As `rdmactor_connect`; `op` is valid for writing one `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn rdmactor_connect_submit(
    ctx: rdmactor_ctx,
    addr: *const c_char,
    service: *const c_char,
    key_file: *const c_char,
    timeout_ms: u32,
    user_data: u64,
    op: *mut u64,
) -> c_int {
    guard("rdmactor_connect_submit", || {
        // SAFETY: as this function's contract says.
        unsafe {
            connect_submit(
                ctx,
                (addr, "addr", false),
                service,
                key_file,
                timeout_ms,
                (user_data, op),
            )
        }
    })
}

/// Starts a connect like `rdmactor_connect_cluster`; its completion carries the new
/// connection in `conn`, as `rdmactor_connect_submit`'s does.
///
/// Thread-safe.
///
/// # Safety
/// As `rdmactor_connect_cluster`; `op` is valid for writing one `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn rdmactor_connect_cluster_submit(
    ctx: rdmactor_ctx,
    seeds: *const c_char,
    service: *const c_char,
    key_file: *const c_char,
    timeout_ms: u32,
    user_data: u64,
    op: *mut u64,
) -> c_int {
    guard("rdmactor_connect_cluster_submit", || {
        // SAFETY: as this function's contract says.
        unsafe {
            connect_submit(
                ctx,
                (seeds, "seeds", true),
                service,
                key_file,
                timeout_ms,
                (user_data, op),
            )
        }
    })
}

/// The two connect submits: `target` is the string, its name, and whether it is a
/// seed list; `done` the user data and where the op id goes.
///
/// # Safety
/// As `rdmactor_connect_submit`'s contract.
unsafe fn connect_submit(
    ctx: rdmactor_ctx,
    target: (*const c_char, &str, bool),
    service: *const c_char,
    key_file: *const c_char,
    timeout_ms: u32,
    done: (u64, *mut u64),
) -> Result<()> {
    let op_out = ptr::out(done.1, "op")?;
    // SAFETY: strings as the caller's contract says.
    let (target, service, key) = unsafe { connect_args(target, service, key_file)? };
    let id = api::connect_submit(ctx.id, target, service, key, timeout_ms, done.0)?;
    // SAFETY: `op` is valid for one write by the caller's contract.
    unsafe { op_out.write(id) };
    Ok(())
}

/// Starts a request like `rdmactor_request`: `req` is copied before the call returns;
/// the reply is copied to `reply` when its completion is polled, its length in the
/// completion's `len` (or the length needed, with `RDMACTOR_BUFFER_TOO_SMALL`).
///
/// Thread-safe.
///
/// # Safety
/// `req` points to `req_len` readable bytes (NULL if 0) during the call. `reply`
/// points to `reply_cap` writable bytes (NULL if 0) that stay valid, and are not
/// otherwise used, until the completion has been polled or the context freed. `op` is
/// valid for writing one `uint64_t`.
#[no_mangle]
#[allow(clippy::too_many_arguments)] // the C call's shape: buffers, lengths, user data, op out.
pub unsafe extern "C" fn rdmactor_request_submit(
    conn: rdmactor_conn,
    req: *const u8,
    req_len: usize,
    reply: *mut u8,
    reply_cap: usize,
    timeout_ms: u32,
    user_data: u64,
    op: *mut u64,
) -> c_int {
    guard("rdmactor_request_submit", || {
        let op_out = ptr::out(op, "op")?;
        if reply.is_null() && reply_cap > 0 {
            return Err(Failure::invalid("reply is NULL with a capacity above 0"));
        }
        // SAFETY: `req` as this function's contract says.
        let data = unsafe { ptr::bytes_arg(req, req_len, "req")? }.to_vec();
        let dest = (reply as usize, reply_cap);
        let id = api::submit(conn.id, Submit::Request(data), dest, timeout_ms, user_data)?;
        // SAFETY: `op` is valid for one write by this function's contract.
        unsafe { op_out.write(id) };
        Ok(())
    })
}

/// Starts a one-way send like `rdmactor_send` (`data` is copied before the call
/// returns); it completes once the connection has queued the message.
///
/// Thread-safe.
///
/// # Safety
/// `data` points to `len` readable bytes (NULL if 0) during the call; `op` is valid for
/// writing one `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn rdmactor_send_submit(
    conn: rdmactor_conn,
    data: *const u8,
    len: usize,
    timeout_ms: u32,
    user_data: u64,
    op: *mut u64,
) -> c_int {
    guard("rdmactor_send_submit", || {
        let op_out = ptr::out(op, "op")?;
        // SAFETY: `data` as this function's contract says.
        let data = unsafe { ptr::bytes_arg(data, len, "data")? }.to_vec();
        let id = api::submit(conn.id, Submit::Send(data), (0, 0), timeout_ms, user_data)?;
        // SAFETY: `op` is valid for one write by this function's contract.
        unsafe { op_out.write(id) };
        Ok(())
    })
}

/// Starts a read like `rdmactor_read`: the region's bytes from `offset` are copied to
/// `buf` when its completion is polled, their length in the completion's `len` and
/// their version in its `version`; `RDMACTOR_BUFFER_TOO_SMALL` with the length needed
/// in `len` when they would be more than `cap` (nothing was read).
///
/// Thread-safe.
///
/// # Safety
/// `name` is a NUL-terminated string during the call; `buf` points to `cap` writable
/// bytes (NULL if 0) until the completion is polled; `op` is valid for writing one
/// `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn rdmactor_read_submit(
    conn: rdmactor_conn,
    name: *const c_char,
    offset: u64,
    buf: *mut u8,
    cap: usize,
    timeout_ms: u32,
    user_data: u64,
    op: *mut u64,
) -> c_int {
    guard("rdmactor_read_submit", || {
        let op_out = ptr::out(op, "op")?;
        if buf.is_null() && cap > 0 {
            return Err(Failure::invalid("buf is NULL with a capacity above 0"));
        }
        // SAFETY: `name` as this function's contract says.
        let name = unsafe { ptr::str_arg(name, "name")? }.to_owned();
        let what = Submit::Read { name, offset, cap };
        let id = api::submit(conn.id, what, (buf as usize, cap), timeout_ms, user_data)?;
        // SAFETY: `op` is valid for one write by this function's contract.
        unsafe { op_out.write(id) };
        Ok(())
    })
}

/// Starts an upload like `rdmactor_file_send`; `*result` is filled when its completion
/// is polled (the completion's status is OK whatever the verdict, as the blocking call
/// returns). One transfer per connection at a time: `RDMACTOR_BUSY` at submit
/// otherwise.
///
/// Thread-safe.
///
/// # Safety
/// `path` is a NUL-terminated string and `name` NULL or one, during the call; `result`
/// is valid for writing one `rdmactor_file_result` until the completion is polled;
/// `op` is valid for writing one `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn rdmactor_file_send_submit(
    conn: rdmactor_conn,
    path: *const c_char,
    name: *const c_char,
    flags: u32,
    result: *mut rdmactor_file_result,
    timeout_ms: u32,
    user_data: u64,
    op: *mut u64,
) -> c_int {
    guard("rdmactor_file_send_submit", || {
        // SAFETY: strings as this function's contract says.
        let file = unsafe { send_op(path, name)? };
        // SAFETY: `result` and `op` as this function's contract says.
        unsafe { file_submit(conn, file, flags, result, timeout_ms, (user_data, op)) }
    })
}

/// Starts a fetch like `rdmactor_file_fetch`; `*result` is filled when its completion
/// is polled, as `rdmactor_file_send_submit`'s is.
///
/// Thread-safe.
///
/// # Safety
/// `name` and `dir` are NUL-terminated strings during the call; `result` is valid for
/// writing one `rdmactor_file_result` until the completion is polled; `op` is valid for
/// writing one `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn rdmactor_file_fetch_submit(
    conn: rdmactor_conn,
    name: *const c_char,
    dir: *const c_char,
    flags: u32,
    result: *mut rdmactor_file_result,
    timeout_ms: u32,
    user_data: u64,
    op: *mut u64,
) -> c_int {
    guard("rdmactor_file_fetch_submit", || {
        // SAFETY: strings as this function's contract says.
        let file = unsafe { fetch_op(name, dir)? };
        // SAFETY: `result` and `op` as this function's contract says.
        unsafe { file_submit(conn, file, flags, result, timeout_ms, (user_data, op)) }
    })
}

/// The two transfer submits once their strings are read.
///
/// # Safety
/// `result` is valid for one `rdmactor_file_result` write until the completion is
/// polled; `done.1` for one `uint64_t` write.
unsafe fn file_submit(
    conn: rdmactor_conn,
    op: FileOp,
    flags: u32,
    result: *mut rdmactor_file_result,
    timeout_ms: u32,
    done: (u64, *mut u64),
) -> Result<()> {
    let op_out = ptr::out(done.1, "op")?;
    ptr::out(result, "result")?;
    let overwrite = overwrite(flags)?;
    let what = Submit::File { op, overwrite };
    let id = api::submit(conn.id, what, (result as usize, 0), timeout_ms, done.0)?;
    // SAFETY: `op` is valid for one write by the caller's contract.
    unsafe { op_out.write(id) };
    Ok(())
}

/// Takes up to `max` completions, oldest first, into `out`; `*n` is how many (0 when
/// none waits: this never blocks). Copies each reply to its submit's buffer. The
/// context's fd stays readable while completions remain.
///
/// Thread-safe: several threads may poll one context; each completion goes to one.
///
/// # Safety
/// `out` points to `max` writable `rdmactor_completion`s (NULL if `max` is 0); `n` is
/// valid for writing one `size_t`; the reply buffers of the operations polled are as
/// their submits promised.
#[no_mangle]
pub unsafe extern "C" fn rdmactor_poll_completions(
    ctx: rdmactor_ctx,
    out: *mut rdmactor_completion,
    max: usize,
    n: *mut usize,
) -> c_int {
    guard("rdmactor_poll_completions", || {
        let n_out = ptr::out(n, "n")?;
        if max == 0 {
            api::poll(ctx.id, 0)?;
            // SAFETY: `n` is valid for one write by this function's contract.
            unsafe { n_out.write(0) };
            return Ok(());
        }
        let out = ptr::out(out, "out")?;
        let done = api::poll(ctx.id, max)?;
        for (i, d) in done.iter().enumerate() {
            // SAFETY: `out` holds `max` >= done.len() completions, and the reply
            // buffers are valid as the submits' contracts say.
            unsafe { out.write_at(i, completion(d)) };
        }
        // SAFETY: `n` is valid for one write by this function's contract.
        unsafe { n_out.write(done.len()) };
        Ok(())
    })
}

/// The C form of `d`, its reply copied to the submit's buffer.
fn completion(d: &Done) -> rdmactor_completion {
    let mut c = rdmactor_completion {
        op: d.op,
        user_data: d.user_data,
        status: RDMACTOR_OK as i32,
        conn: rdmactor_conn { id: d.conn },
        len: 0,
        version: 0,
        error: [0; RDMACTOR_ERROR_LEN],
    };
    let (buf, cap) = d.dest;
    let copied = match &d.result {
        Ok(Output::Nothing) => Ok(()),
        Ok(Output::Bytes(reply) | Output::Region { data: reply, .. }) => {
            c.len = reply.len();
            if let Ok(Output::Region { version, .. }) = &d.result {
                c.version = *version;
            }
            if reply.len() > cap {
                Err(too_small("reply", reply.len(), cap))
            } else {
                // SAFETY: `buf` holds `cap` writable bytes until this poll, by the
                // submit's contract (checked there: NULL only with cap 0).
                unsafe { ptr::copy_to(buf as *mut u8, cap, reply) }
            }
        }
        Ok(Output::RegionTooSmall { needed }) => {
            c.len = *needed;
            Err(too_small("region", *needed, cap))
        }
        Ok(Output::File(done)) => {
            // SAFETY: `buf` is the submit's `result`, valid for one write until this
            // poll by its contract (checked non-NULL there).
            unsafe { (buf as *mut rdmactor_file_result).write(file_result(done)) };
            Ok(())
        }
        Err(f) => Err(f.clone()),
    };
    if let Err(f) = copied {
        c.status = f.status as i32;
        fill(&mut c.error, &f.message);
    }
    c
}
