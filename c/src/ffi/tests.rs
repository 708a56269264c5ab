//! The entry points called as C calls them, natively: handle guarding without a
//! server, and every call end to end against a server of this process over the
//! loopback transport (the context's clients made with `Client::over(Loopback, ..)`).

use std::ffi::{c_char, CStr, CString};
use std::net::SocketAddr;
use std::ptr::{null, null_mut};
use std::sync::OnceLock;
use std::time::Duration;

use rdmactor::runtime::{Client, NodeConfig, Server};
use rdmactor::transport::loopback::Loopback;
use rdmactor_services::echo::{Echo, EchoRequest};
use rdmactor_services::file_transfer::{Config, FileTransfer};
use rdmactor_services::members::{Member, MembersService, StaticDirectory};
use rdmactor_services::read::{ReadRegions, ReadService};
use sha2::Digest as _;

use super::*;
use crate::runtime::Context;
use crate::status::rdmactor_status::*;

const OK: c_int = RDMACTOR_OK as c_int;
const REGION: &[u8] = b"bytes of a region, read with one-sided READs";

/// The test server: echo, files (into a directory of its own) and read, on the
/// process's loopback fabric, in a thread with its own System, for the whole run.
fn server() -> &'static (SocketAddr, std::path::PathBuf) {
    static SERVER: OnceLock<(SocketAddr, std::path::PathBuf)> = OnceLock::new();
    SERVER.get_or_init(|| {
        let addr: SocketAddr = "10.0.0.50:7400".parse().expect("an address");
        let store = tempfile::tempdir().expect("a store").keep();
        let (tx, rx) = std::sync::mpsc::channel();
        let dir = store.clone();
        std::thread::spawn(move || {
            actix::System::new().block_on(async move {
                let regions = ReadRegions::<Loopback>::default();
                regions
                    .add_static("greeting", REGION.to_vec())
                    .expect("a region");
                let server = Server::over(Loopback)
                    .listen(addr, None)
                    .service("echo", Echo)
                    .service("files", FileTransfer::new(Config::new(dir)).expect("files"))
                    .service("read", ReadService::new(regions))
                    .handler("members", MembersService::new(members()))
                    .start()
                    .expect("the test server");
                tx.send(()).expect("the test waits");
                std::future::pending::<()>().await;
                drop(server);
            })
        });
        rx.recv().expect("the server started");
        (addr, store)
    })
}

/// An address no test server listens on: a listed node whose host died.
const GONE: &str = "10.0.0.51:7400";

/// What the test server's `members` lists: `echo` on a gone node first, then on itself.
fn members() -> StaticDirectory {
    let directory = StaticDirectory::new();
    let member = |node: &str, addr: &str| Member {
        node: node.into(),
        addr: addr.parse().expect("an address"),
        connections: 0,
    };
    directory.set(
        "echo",
        vec![member("gone", GONE), member("self", "10.0.0.50:7400")],
    );
    directory.set("discard", vec![member("gone", GONE)]);
    directory
}

fn loopback_ctx() -> rdmactor_ctx {
    let ctx = Context::start(NodeConfig::default(), |c| Client::over(Loopback, c))
        .expect("a loopback context");
    rdmactor_ctx {
        id: crate::api::ctx_insert(ctx),
    }
}

fn last_error() -> String {
    // SAFETY: rdmactor_last_error never returns NULL, and the text stays until the
    // next failing call on this thread; it is copied at once.
    unsafe { CStr::from_ptr(rdmactor_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn c(s: &str) -> CString {
    CString::new(s).expect("no NUL")
}

fn connect(ctx: rdmactor_ctx, service: &str) -> rdmactor_conn {
    let addr = c(&server().0.to_string());
    let service = c(service);
    let mut conn = rdmactor_conn::default();
    // SAFETY: valid strings and out-parameter, alive for the call.
    let rc = unsafe {
        rdmactor_connect(
            ctx,
            addr.as_ptr(),
            service.as_ptr(),
            null(),
            5000,
            &mut conn,
        )
    };
    assert_eq!(rc, OK, "connect: {}", last_error());
    conn
}

/// Status, reply length, and the reply, of a request with a buffer of `cap`.
fn request(conn: rdmactor_conn, req: &[u8], cap: usize) -> (c_int, usize, Vec<u8>) {
    let mut reply = vec![0u8; cap];
    let mut len = usize::MAX;
    // SAFETY: the slices and the length live across the call, with their own lengths.
    let rc = unsafe {
        rdmactor_request(
            conn,
            req.as_ptr(),
            req.len(),
            reply.as_mut_ptr(),
            cap,
            &mut len,
            5000,
        )
    };
    reply.truncate(len.min(cap));
    (rc, len, reply)
}

fn echo_request(payload: &[u8]) -> Vec<u8> {
    postcard::to_allocvec(&EchoRequest {
        payload: payload.to_vec(),
    })
    .expect("encodes")
}

#[test]
fn zero_handles_and_null_pointers_are_refused_with_a_reason() {
    let zero = rdmactor_conn::default();
    assert_eq!(rdmactor_close(zero), RDMACTOR_BAD_HANDLE as c_int);
    assert!(last_error().contains("connection"), "{}", last_error());
    assert_eq!(
        rdmactor_ctx_free(rdmactor_ctx::default()),
        RDMACTOR_BAD_HANDLE as c_int
    );
    let (rc, ..) = request(zero, b"x", 8);
    assert_eq!(rc, RDMACTOR_BAD_HANDLE as c_int);
    // SAFETY: NULL is what is being tested; the library must refuse it.
    let rc = unsafe { rdmactor_ctx_new(null_mut()) };
    assert_eq!(rc, RDMACTOR_INVALID_ARGUMENT as c_int);
    assert!(last_error().contains("out is NULL"), "{}", last_error());
    let mut fd = 0;
    // SAFETY: a valid out-parameter.
    let rc = unsafe { rdmactor_ctx_fd(rdmactor_ctx { id: 12345 }, &mut fd) };
    assert_eq!(rc, RDMACTOR_BAD_HANDLE as c_int);
}

#[test]
fn a_freed_context_is_refused_and_a_second_free_is_bad_handle() {
    let ctx = loopback_ctx();
    let mut fd = -1;
    // SAFETY: a valid out-parameter.
    assert_eq!(unsafe { rdmactor_ctx_fd(ctx, &mut fd) }, OK);
    assert!(fd >= 0);
    let conn = connect(ctx, "echo");
    assert_eq!(rdmactor_ctx_free(ctx), OK);
    assert_eq!(rdmactor_ctx_free(ctx), RDMACTOR_BAD_HANDLE as c_int);
    // The context's connections went with it.
    assert_eq!(rdmactor_close(conn), RDMACTOR_BAD_HANDLE as c_int);
    let addr = c(&server().0.to_string());
    let mut out = rdmactor_conn::default();
    // SAFETY: valid strings and out-parameter.
    let rc = unsafe { rdmactor_connect(ctx, addr.as_ptr(), c"echo".as_ptr(), null(), 0, &mut out) };
    assert_eq!(rc, RDMACTOR_BAD_HANDLE as c_int);
}

#[test]
fn bad_arguments_to_connect_say_which() {
    let ctx = loopback_ctx();
    let mut out = rdmactor_conn::default();
    // SAFETY: NULL and a valid string; the library must refuse the NULL.
    let rc = unsafe { rdmactor_connect(ctx, null(), c"echo".as_ptr(), null(), 0, &mut out) };
    assert_eq!(rc, RDMACTOR_INVALID_ARGUMENT as c_int);
    assert!(last_error().contains("addr is NULL"), "{}", last_error());
    // SAFETY: valid strings.
    let rc = unsafe {
        rdmactor_connect(
            ctx,
            c"nowhere".as_ptr(),
            c"echo".as_ptr(),
            null(),
            0,
            &mut out,
        )
    };
    assert_eq!(rc, RDMACTOR_INVALID_ARGUMENT as c_int);
    assert!(last_error().contains("IP:PORT"), "{}", last_error());
    let bad_utf8 = [0xffu8, 0];
    // SAFETY: a NUL-terminated byte string.
    let rc = unsafe {
        rdmactor_connect(
            ctx,
            bad_utf8.as_ptr().cast::<c_char>(),
            c"echo".as_ptr(),
            null(),
            0,
            &mut out,
        )
    };
    assert_eq!(rc, RDMACTOR_INVALID_ARGUMENT as c_int);
    assert_eq!(rdmactor_ctx_free(ctx), OK);
}

#[test]
fn an_unknown_service_is_refused_with_the_servers_reason() {
    let ctx = loopback_ctx();
    let addr = c(&server().0.to_string());
    let mut out = rdmactor_conn::default();
    // SAFETY: valid strings and out-parameter.
    let rc = unsafe {
        rdmactor_connect(
            ctx,
            addr.as_ptr(),
            c"no-such".as_ptr(),
            null(),
            5000,
            &mut out,
        )
    };
    assert_eq!(rc, RDMACTOR_REFUSED as c_int, "{}", last_error());
    assert!(last_error().contains("no-such"), "{}", last_error());
    assert_eq!(rdmactor_ctx_free(ctx), OK);
}

/// `rdmactor_connect_cluster` with `seeds`, to `service`: the status and the handle.
fn connect_cluster(ctx: rdmactor_ctx, seeds: &str, service: &str) -> (c_int, rdmactor_conn) {
    let (seeds, service) = (c(seeds), c(service));
    let mut conn = rdmactor_conn::default();
    // SAFETY: valid strings and out-parameter, alive for the call.
    let rc = unsafe {
        rdmactor_connect_cluster(
            ctx,
            seeds.as_ptr(),
            service.as_ptr(),
            null(),
            10_000,
            &mut conn,
        )
    };
    (rc, conn)
}

#[test]
fn a_cluster_connect_asks_the_seeds_and_skips_a_listed_node_that_is_gone() {
    let ctx = loopback_ctx();
    let live = server().0.to_string();
    // The first seed is gone; the second lists echo on the gone node, then on itself.
    let (rc, conn) = connect_cluster(ctx, &format!("{GONE}, {live}"), "echo");
    assert_eq!(rc, OK, "{}", last_error());
    let req = echo_request(b"through the seeds");
    let (rc, _, reply) = request(conn, &req, 64);
    assert_eq!((rc, reply), (OK, req));
    assert_eq!(rdmactor_close(conn), OK);
    // Only a gone node listed: UNREACHABLE, naming each address tried.
    let (rc, _) = connect_cluster(ctx, &live, "discard");
    assert_eq!(rc, RDMACTOR_UNREACHABLE as c_int, "{}", last_error());
    let error = last_error();
    assert!(
        error.contains(&format!("node gone at {GONE}")),
        "the gone node named: {error}"
    );
    // A service the seed does not list, and seed lists that are not addresses.
    let (rc, _) = connect_cluster(ctx, &live, "no-such");
    assert_eq!(rc, RDMACTOR_UNREACHABLE as c_int, "{}", last_error());
    assert!(last_error().contains("no service"), "{}", last_error());
    for bad in ["", " , ", "not-an-address"] {
        let (rc, _) = connect_cluster(ctx, bad, "echo");
        assert_eq!(
            rc,
            RDMACTOR_INVALID_ARGUMENT as c_int,
            "{bad:?}: {}",
            last_error()
        );
    }
    assert_eq!(rdmactor_ctx_free(ctx), OK);
}

#[test]
fn echo_round_trips_and_a_closed_connection_is_refused() {
    let ctx = loopback_ctx();
    let conn = connect(ctx, "echo");
    let req = echo_request(b"hello from C");
    let (rc, len, reply) = request(conn, &req, 64);
    assert_eq!(rc, OK, "{}", last_error());
    assert_eq!(len, req.len());
    assert_eq!(reply, req, "echo answers with the request's encoding");
    assert_eq!(rdmactor_close(conn), OK);
    let (rc, ..) = request(conn, &req, 64);
    assert_eq!(rc, RDMACTOR_BAD_HANDLE as c_int);
    assert_eq!(
        rdmactor_close(conn),
        RDMACTOR_BAD_HANDLE as c_int,
        "double close"
    );
    // A newer connection may reuse the slot; the old id still does not reach it.
    let again = connect(ctx, "echo");
    assert_ne!(again, conn);
    assert_eq!(request(conn, &req, 64).0, RDMACTOR_BAD_HANDLE as c_int);
    assert_eq!(request(again, &req, 64).0, OK);
    // The handle of the context is not a connection.
    assert_eq!(
        rdmactor_close(rdmactor_conn { id: ctx.id }),
        RDMACTOR_BAD_HANDLE as c_int
    );
    assert_eq!(rdmactor_ctx_free(ctx), OK);
}

#[test]
fn a_reply_larger_than_the_buffer_gives_the_length_it_needs() {
    let ctx = loopback_ctx();
    let conn = connect(ctx, "echo");
    let req = echo_request(&[7; 100]);
    let (rc, len, _) = request(conn, &req, 10);
    assert_eq!(rc, RDMACTOR_BUFFER_TOO_SMALL as c_int);
    assert_eq!(len, req.len());
    assert!(last_error().contains("does not fit"), "{}", last_error());
    // NULL with no capacity: the way to learn the length.
    let mut needed = 0;
    // SAFETY: the request slice lives across the call; NULL reply with capacity 0.
    let rc =
        unsafe { rdmactor_request(conn, req.as_ptr(), req.len(), null_mut(), 0, &mut needed, 0) };
    assert_eq!(rc, RDMACTOR_BUFFER_TOO_SMALL as c_int);
    assert_eq!(needed, req.len());
    // NULL with a capacity is a bad call, refused before anything is sent.
    // SAFETY: as above; the NULL is refused.
    let rc =
        unsafe { rdmactor_request(conn, req.as_ptr(), req.len(), null_mut(), 8, &mut needed, 0) };
    assert_eq!(rc, RDMACTOR_INVALID_ARGUMENT as c_int);
    // The connection goes on.
    assert_eq!(request(conn, &req, req.len()).0, OK);
    assert_eq!(rdmactor_ctx_free(ctx), OK);
}

#[test]
fn a_malformed_request_closes_the_connection_with_the_servers_reason() {
    let ctx = loopback_ctx();
    let conn = connect(ctx, "echo");
    // Not an echo request (a length prefix promising more than follows).
    let (rc, ..) = request(conn, &[0x7f], 64);
    assert_eq!(rc, RDMACTOR_CLOSED as c_int, "{}", last_error());
    assert!(
        last_error().contains("malformed echo request"),
        "{}",
        last_error()
    );
    assert_eq!(
        rdmactor_close(conn),
        OK,
        "a closed connection's handle is still closed once"
    );
    assert_eq!(rdmactor_ctx_free(ctx), OK);
}

#[test]
fn one_thread_drives_many_connections_through_the_completion_fd() {
    use rustix::event::{poll, PollFd, PollFlags};
    const N: usize = 8;
    let ctx = loopback_ctx();
    let mut fd = -1;
    // SAFETY: a valid out-parameter.
    assert_eq!(unsafe { rdmactor_ctx_fd(ctx, &mut fd) }, OK);
    // SAFETY: the context owns the fd and outlives this borrow.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let addr = c(&server().0.to_string());
    let mut ops = std::collections::HashSet::new();
    for i in 0..N {
        let mut op = 0;
        // SAFETY: valid strings and out-parameter.
        let rc = unsafe {
            rdmactor_connect_submit(
                ctx,
                addr.as_ptr(),
                c"echo".as_ptr(),
                null(),
                5000,
                i as u64,
                &mut op,
            )
        };
        assert_eq!(rc, OK, "{}", last_error());
        ops.insert(op);
    }
    let reqs: Vec<Vec<u8>> = (0..N)
        .map(|i| echo_request(&vec![i as u8; 64 + i]))
        .collect();
    let mut replies = vec![vec![0u8; 256]; N];
    let mut conns = [rdmactor_conn::default(); N];
    let mut answered = 0;
    let mut out = [empty_completion(); 4];
    while answered < N {
        let mut fds = [PollFd::new(&borrowed, PollFlags::IN)];
        let ready = poll(
            &mut fds,
            Some(&rustix::event::Timespec {
                tv_sec: 10,
                tv_nsec: 0,
            }),
        )
        .expect("poll");
        assert_eq!(ready, 1, "a completion within 10 s");
        let mut n = 0;
        // SAFETY: `out` holds 4 completions; the reply buffers outlive every poll.
        let rc = unsafe { rdmactor_poll_completions(ctx, out.as_mut_ptr(), 4, &mut n) };
        assert_eq!(rc, OK);
        for done in &out[..n] {
            let i = (done.user_data % 100) as usize;
            assert_eq!(done.status, OK, "op {}", done.op);
            if done.user_data < 100 {
                assert!(ops.remove(&done.op), "a connect's op");
                conns[i] = done.conn;
                let mut op = 0;
                // SAFETY: the request is copied during the call; the reply buffer
                // lives until the end of the test, past its completion's poll.
                let rc = unsafe {
                    rdmactor_request_submit(
                        done.conn,
                        reqs[i].as_ptr(),
                        reqs[i].len(),
                        replies[i].as_mut_ptr(),
                        256,
                        5000,
                        100 + i as u64,
                        &mut op,
                    )
                };
                assert_eq!(rc, OK, "{}", last_error());
            } else {
                assert_eq!(done.conn, conns[i]);
                assert_eq!(&replies[i][..done.len], &reqs[i][..]);
                answered += 1;
            }
        }
    }
    let mut n = 9;
    // SAFETY: as above.
    let rc = unsafe { rdmactor_poll_completions(ctx, out.as_mut_ptr(), 4, &mut n) };
    assert_eq!(rc, OK);
    assert_eq!(n, 0);
    let mut fds = [PollFd::new(&borrowed, PollFlags::IN)];
    assert_eq!(
        poll(
            &mut fds,
            Some(&rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: 0
            })
        )
        .unwrap(),
        0,
        "not readable when empty"
    );
    assert_eq!(rdmactor_ctx_free(ctx), OK);
}

fn file_result() -> rdmactor_file_result {
    rdmactor_file_result {
        verdict: rdmactor_verdict::RDMACTOR_VERDICT_ABORTED,
        bytes: 0,
        sha256_hex: [0; 65],
        reason: [0; RDMACTOR_REASON_LEN],
    }
}

fn text(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8(bytes).expect("UTF-8")
}

/// A completion to be overwritten by a poll.
fn empty_completion() -> rdmactor_completion {
    rdmactor_completion {
        op: 0,
        user_data: 0,
        status: 0,
        conn: rdmactor_conn::default(),
        len: 0,
        version: 0,
        error: [0; RDMACTOR_ERROR_LEN],
    }
}

/// Waits on `ctx`'s fd until `n` completions are taken; returns them, oldest first.
fn completions(ctx: rdmactor_ctx, n: usize) -> Vec<rdmactor_completion> {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut fd = -1;
    // SAFETY: a valid out-parameter.
    assert_eq!(unsafe { rdmactor_ctx_fd(ctx, &mut fd) }, OK);
    // SAFETY: the context owns the fd and outlives this borrow.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let mut got = Vec::new();
    while got.len() < n {
        let mut fds = [PollFd::new(&borrowed, PollFlags::IN)];
        let limit = rustix::event::Timespec {
            tv_sec: 30,
            tv_nsec: 0,
        };
        assert_eq!(
            poll(&mut fds, Some(&limit)).expect("poll"),
            1,
            "a completion within 30 s"
        );
        let mut out = [empty_completion(); 4];
        let mut taken = 0;
        // SAFETY: `out` holds 4 completions; the caller's buffers outlive this poll.
        let rc = unsafe { rdmactor_poll_completions(ctx, out.as_mut_ptr(), 4, &mut taken) };
        assert_eq!(rc, OK, "{}", last_error());
        got.extend_from_slice(&out[..taken]);
    }
    got
}

#[test]
fn reads_and_file_transfers_complete_through_the_fd_too() {
    let ctx = loopback_ctx();
    let reader = connect(ctx, "read");
    let files = connect(ctx, "files");
    let (mut fits, mut short) = (vec![0u8; 64], vec![0u8; 4]);
    let src = tempfile::tempdir().unwrap();
    let bytes: Vec<u8> = (0..1_500_000u32).map(|i| (i * 13 % 251) as u8).collect();
    let path = src.path().join("c-submitted.bin");
    std::fs::write(&path, &bytes).unwrap();
    let p = c(path.to_str().unwrap());
    let (mut sent, mut busy) = (file_result(), file_result());
    let mut op = 0;
    // SAFETY: valid strings, buffers and out-parameters, which outlive the polls below.
    unsafe {
        let rc = rdmactor_read_submit(
            reader,
            c"greeting".as_ptr(),
            0,
            fits.as_mut_ptr(),
            64,
            5000,
            1,
            &mut op,
        );
        assert_eq!(rc, OK, "{}", last_error());
        let rc = rdmactor_read_submit(
            reader,
            c"greeting".as_ptr(),
            0,
            short.as_mut_ptr(),
            4,
            5000,
            2,
            &mut op,
        );
        assert_eq!(rc, OK, "{}", last_error());
        let rc =
            rdmactor_file_send_submit(files, p.as_ptr(), null(), 0, &mut sent, 30_000, 3, &mut op);
        assert_eq!(rc, OK, "{}", last_error());
        // One transfer per connection: the second is refused at submit.
        let rc =
            rdmactor_file_send_submit(files, p.as_ptr(), null(), 0, &mut busy, 30_000, 4, &mut op);
        assert_eq!(rc, RDMACTOR_BUSY as c_int, "{}", last_error());
        // A NULL buffer with a capacity, and a NULL result, are the caller's mistakes.
        let rc = rdmactor_read_submit(
            reader,
            c"greeting".as_ptr(),
            0,
            null_mut(),
            8,
            5000,
            5,
            &mut op,
        );
        assert_eq!(rc, RDMACTOR_INVALID_ARGUMENT as c_int);
        let rc = rdmactor_file_send_submit(files, p.as_ptr(), null(), 0, null_mut(), 0, 6, &mut op);
        assert_eq!(rc, RDMACTOR_INVALID_ARGUMENT as c_int);
    }
    let mut done = completions(ctx, 3);
    done.sort_by_key(|d| d.user_data);
    assert_eq!(
        (done[0].status, done[0].len),
        (OK, REGION.len()),
        "{}",
        text(&done[0].error)
    );
    assert_eq!(&fits[..REGION.len()], REGION);
    assert_eq!(
        (done[1].status, done[1].len),
        (RDMACTOR_BUFFER_TOO_SMALL as c_int, REGION.len()),
        "the length needed"
    );
    assert_eq!(short, [0; 4], "nothing read into a buffer too small");
    assert_eq!(done[2].status, OK, "{}", text(&done[2].error));
    assert_eq!(
        sent.verdict,
        rdmactor_verdict::RDMACTOR_VERDICT_GOOD,
        "{}",
        text(&sent.reason)
    );
    let want = hex::encode(sha2::Sha256::digest(&bytes));
    assert_eq!(text(&sent.sha256_hex), want);
    // And back, without blocking: the transfer flag was given back at completion.
    let dst = tempfile::tempdir().unwrap();
    let d = c(dst.path().to_str().unwrap());
    let mut fetched = file_result();
    // SAFETY: as above.
    let rc = unsafe {
        rdmactor_file_fetch_submit(
            files,
            c"c-submitted.bin".as_ptr(),
            d.as_ptr(),
            0,
            &mut fetched,
            30_000,
            7,
            &mut op,
        )
    };
    assert_eq!(rc, OK, "{}", last_error());
    let done = completions(ctx, 1);
    assert_eq!(
        (done[0].status, done[0].user_data),
        (OK, 7),
        "{}",
        text(&done[0].error)
    );
    assert_eq!(
        fetched.verdict,
        rdmactor_verdict::RDMACTOR_VERDICT_GOOD,
        "{}",
        text(&fetched.reason)
    );
    assert_eq!(text(&fetched.sha256_hex), want);
    assert_eq!(
        std::fs::read(dst.path().join("c-submitted.bin")).unwrap(),
        bytes
    );
    assert_eq!(rdmactor_ctx_free(ctx), OK);
}

#[test]
fn files_upload_and_fetch_with_their_verdict_and_digest() {
    let ctx = loopback_ctx();
    let conn = connect(ctx, "files");
    let src = tempfile::tempdir().unwrap();
    let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let path = src.path().join("c-upload.bin");
    std::fs::write(&path, &bytes).unwrap();
    let want = hex::encode(sha2::Sha256::digest(&bytes));
    let p = c(path.to_str().unwrap());
    let mut r = file_result();
    // SAFETY: valid strings and out-parameter.
    let rc = unsafe { rdmactor_file_send(conn, p.as_ptr(), null(), 0, &mut r, 30_000) };
    assert_eq!(rc, OK, "{}", last_error());
    assert_eq!(
        r.verdict,
        rdmactor_verdict::RDMACTOR_VERDICT_GOOD,
        "{}",
        text(&r.reason)
    );
    assert_eq!(r.bytes, bytes.len() as u64);
    assert_eq!(text(&r.sha256_hex), want);
    assert_eq!(
        std::fs::read(server().1.join("c-upload.bin")).unwrap(),
        bytes
    );
    // The same name again, without overwrite: the service's verdict, not an error.
    let mut r = file_result();
    // SAFETY: as above.
    let rc = unsafe { rdmactor_file_send(conn, p.as_ptr(), null(), 0, &mut r, 30_000) };
    assert_eq!(rc, OK, "{}", last_error());
    assert_eq!(r.verdict, rdmactor_verdict::RDMACTOR_VERDICT_REJECTED);
    assert!(!text(&r.reason).is_empty());
    // And back.
    let dst = tempfile::tempdir().unwrap();
    let d = c(dst.path().to_str().unwrap());
    let mut r = file_result();
    // SAFETY: as above.
    let rc = unsafe {
        rdmactor_file_fetch(
            conn,
            c"c-upload.bin".as_ptr(),
            d.as_ptr(),
            0,
            &mut r,
            30_000,
        )
    };
    assert_eq!(rc, OK, "{}", last_error());
    assert_eq!(
        r.verdict,
        rdmactor_verdict::RDMACTOR_VERDICT_GOOD,
        "{}",
        text(&r.reason)
    );
    assert_eq!(text(&r.sha256_hex), want);
    assert_eq!(
        std::fs::read(dst.path().join("c-upload.bin")).unwrap(),
        bytes
    );
    // SAFETY: as above; the unknown flag is refused.
    let rc = unsafe { rdmactor_file_send(conn, p.as_ptr(), null(), 0x80, &mut r, 0) };
    assert_eq!(rc, RDMACTOR_INVALID_ARGUMENT as c_int);
    assert_eq!(rdmactor_ctx_free(ctx), OK);
}

#[test]
fn a_region_reads_into_a_buffer_that_fits_and_says_what_fits_otherwise() {
    let ctx = loopback_ctx();
    let conn = connect(ctx, "read");
    let mut buf = vec![0u8; 8];
    let (mut len, mut version) = (0usize, 0u64);
    // SAFETY: the buffer, length and version live across the call.
    let rc = unsafe {
        rdmactor_read(
            conn,
            c"greeting".as_ptr(),
            0,
            buf.as_mut_ptr(),
            8,
            &mut len,
            &mut version,
            5000,
        )
    };
    assert_eq!(rc, RDMACTOR_BUFFER_TOO_SMALL as c_int);
    assert_eq!(len, REGION.len());
    buf.resize(len, 0);
    // SAFETY: as above, with the length it needs.
    let rc = unsafe {
        rdmactor_read(
            conn,
            c"greeting".as_ptr(),
            0,
            buf.as_mut_ptr(),
            buf.len(),
            &mut len,
            &mut version,
            5000,
        )
    };
    assert_eq!(rc, OK, "{}", last_error());
    assert_eq!(&buf[..len], REGION);
    // From an offset, without the version.
    // SAFETY: as above; NULL version is allowed.
    let rc = unsafe {
        rdmactor_read(
            conn,
            c"greeting".as_ptr(),
            6,
            buf.as_mut_ptr(),
            buf.len(),
            &mut len,
            null_mut(),
            5000,
        )
    };
    assert_eq!(rc, OK, "{}", last_error());
    assert_eq!(&buf[..len], &REGION[6..]);
    // SAFETY: as above.
    let rc = unsafe {
        rdmactor_read(
            conn,
            c"nothing".as_ptr(),
            0,
            buf.as_mut_ptr(),
            buf.len(),
            &mut len,
            null_mut(),
            5000,
        )
    };
    assert_eq!(rc, RDMACTOR_NOT_FOUND as c_int, "{}", last_error());
    assert_eq!(rdmactor_ctx_free(ctx), OK);
}

#[test]
fn a_panic_is_an_internal_status_not_an_unwind_into_c() {
    let rc = guard("a test", || panic!("on purpose"));
    assert_eq!(rc, RDMACTOR_INTERNAL as c_int);
    assert!(last_error().contains("on purpose"), "{}", last_error());
}

#[test]
fn every_status_has_a_name() {
    for s in 0..=RDMACTOR_INTERNAL as c_int {
        // SAFETY: a static string.
        let name = unsafe { CStr::from_ptr(rdmactor_status_name(s)) };
        assert_ne!(name.to_str().unwrap(), "RDMACTOR_UNKNOWN", "status {s}");
    }
    // SAFETY: a static string.
    let name = unsafe { CStr::from_ptr(rdmactor_status_name(-1)) };
    assert_eq!(name.to_str().unwrap(), "RDMACTOR_UNKNOWN");
    let _ = Duration::ZERO;
}
