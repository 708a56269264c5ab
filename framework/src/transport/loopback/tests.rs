//! Each RDMA semantic rdmactor relies on, and each fault hook, over loopback.

use std::time::{Duration, Instant};

use super::*;
use crate::transport::{RecvWr, SendWr};
use crate::verbs::{
    Access, CmEventKind, ConnParam, QpCaps, QpState, RemoteRegion, SendOp, WcOpcode, WcStatus,
    WorkCompletion,
};

/// Every access, for regions the tests do not mean to restrict.
fn all() -> Access {
    Access::LOCAL_WRITE
        | Access::REMOTE_WRITE
        | Access::REMOTE_READ
        | Access::REMOTE_ATOMIC
        | Access::MW_BIND
}

/// Short timers, so that timeouts take milliseconds.
fn fabric() -> Fabric {
    Fabric::new(Config {
        ack_timeout: Duration::from_millis(2),
        rnr_timer: Duration::from_millis(1),
        cm_timeout: Duration::from_millis(30),
    })
}

struct Side {
    dev: Device,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn side(fabric: &Fabric, name: &str, access: Access) -> Side {
    let dev = fabric.device(name);
    let cq = dev.create_cq(1024, None).unwrap();
    let caps = QpCaps {
        max_send_wr: 256,
        max_recv_wr: 256,
        ..QpCaps::default()
    };
    let qp = dev.create_qp(&cq, &cq, caps, None).unwrap();
    let mr = dev.register(4096, access).unwrap();
    Side { dev, cq, qp, mr }
}

fn pair_with(param: ConnParam<'_>, access: Access) -> (Fabric, Side, Side) {
    let fabric = fabric();
    let a = side(&fabric, "a", access);
    let b = side(&fabric, "b", access);
    connect_pair(&a.qp, &b.qp, &param).unwrap();
    (fabric, a, b)
}

fn pair() -> (Fabric, Side, Side) {
    pair_with(ConnParam::default(), all())
}

fn post(qp: &Qp, wr_id: u64, op: SendOp, local: Option<Sge<'_>>) {
    qp.post_send(&SendWr::new(wr_id, op, local)).unwrap();
}

fn recv(qp: &Qp, wr_id: u64, local: Option<Sge<'_>>) {
    qp.post_recv(&[RecvWr { wr_id, local }]).unwrap();
}

/// Exactly `n` completions within a few seconds.
fn wait(cq: &Cq, n: usize) -> Vec<WorkCompletion> {
    let got = cq.poll_blocking(n, Duration::from_secs(5)).unwrap();
    assert_eq!(got.len(), n, "completions: {got:?}");
    got
}

fn nothing_more(cq: &Cq) {
    let mut more = Vec::new();
    cq.poll(&mut more).unwrap();
    assert!(more.is_empty(), "unexpected: {more:?}");
}

fn bytes(mr: &Mr, at: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0; len];
    mr.read(at, &mut out).unwrap();
    out
}

#[test]
fn sends_complete_in_order_and_a_write_is_visible_before_the_send_after_it() {
    let (_f, mut a, b) = pair();
    for i in 0..64u64 {
        recv(
            &b.qp,
            i,
            Some(b.mr.sge(i as usize * 8..i as usize * 8 + 8).unwrap()),
        );
    }
    for i in 0..64u64 {
        a.mr.write(i as usize * 8, &i.to_le_bytes()).unwrap();
    }
    for i in 0..64u64 {
        let at = i as usize * 8;
        post(
            &a.qp,
            100 + i,
            SendOp::Send,
            Some(a.mr.sge(at..at + 8).unwrap()),
        );
    }
    let sent = wait(&a.cq, 64);
    let got = wait(&b.cq, 64);
    for (i, (s, r)) in sent.iter().zip(&got).enumerate() {
        assert_eq!(
            (s.wr_id, s.status, s.opcode),
            (100 + i as u64, WcStatus::Success, WcOpcode::Send)
        );
        assert_eq!(
            (r.wr_id, r.opcode, r.byte_len),
            (i as u64, WcOpcode::Recv, 8)
        );
        assert_eq!(r.qp_num, b.qp.qp_num());
    }
    assert_eq!(bytes(&b.mr, 63 * 8, 8), 63u64.to_le_bytes());

    // WRITE then SEND: once the SEND's receive completes, the WRITE's bytes are there.
    a.mr.write(1024, &[7; 512]).unwrap();
    recv(&b.qp, 999, Some(b.mr.sge(0..8).unwrap()));
    let remote = b.mr.remote().slice(2048, 512).unwrap();
    post(
        &a.qp,
        1,
        SendOp::Write(remote),
        Some(a.mr.sge(1024..1536).unwrap()),
    );
    post(&a.qp, 2, SendOp::Send, Some(a.mr.sge(0..8).unwrap()));
    assert_eq!(wait(&b.cq, 1)[0].wr_id, 999);
    assert_eq!(bytes(&b.mr, 2048, 512), vec![7; 512]);
    let done: Vec<u64> = wait(&a.cq, 2).iter().map(|w| w.wr_id).collect();
    assert_eq!(done, [1, 2]);
}

#[test]
fn a_send_without_a_receive_is_retried_then_fails_with_rnr_retry_exceeded() {
    let param = ConnParam {
        rnr_retry_count: 3,
        ..ConnParam::default()
    };
    let (_f, a, b) = pair_with(param, all());
    let started = Instant::now();
    post(&a.qp, 1, SendOp::Send, Some(a.mr.sge(0..8).unwrap()));
    post(&a.qp, 2, SendOp::Send, Some(a.mr.sge(0..8).unwrap()));
    let wcs = wait(&a.cq, 2);
    // The first try and three retries, each after the 1 ms RNR timer.
    assert!(
        started.elapsed() >= Duration::from_millis(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status),
        (1, WcStatus::RnrRetryExceeded)
    );
    assert_eq!((wcs[1].wr_id, wcs[1].status), (2, WcStatus::WrFlushError));
    assert_eq!(a.qp.state(), QpState::Error);
    // The responder is fine: RNR is not its error.
    assert_eq!(b.qp.state(), QpState::ReadyToSend);
    nothing_more(&b.cq);
}

#[test]
fn rnr_retry_seven_waits_for_ever_until_a_receive_comes() {
    let (_f, a, b) = pair(); // rnr_retry_count 7
    post(&a.qp, 1, SendOp::Send, Some(a.mr.sge(0..8).unwrap()));
    // Twenty RNR timers later it still waits, with nothing completed.
    std::thread::sleep(Duration::from_millis(20));
    nothing_more(&a.cq);
    recv(&b.qp, 5, Some(b.mr.sge(0..64).unwrap()));
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(wait(&b.cq, 1)[0].wr_id, 5);
}

/// Posts `op` from a fresh pair and returns both sides' completions and QP states,
/// after one more SEND behind it (which must flush).
fn refused(
    access: Access,
    op: impl Fn(&Mr) -> SendOp,
    local: usize,
) -> (WcStatus, WcStatus, QpState) {
    let (_f, a, b) = pair_with(ConnParam::default(), access | Access::LOCAL_WRITE);
    recv(&b.qp, 77, Some(b.mr.sge(0..8).unwrap()));
    post(&a.qp, 1, op(&b.mr), Some(a.mr.sge(0..local).unwrap()));
    post(&a.qp, 2, SendOp::Send, Some(a.mr.sge(0..8).unwrap()));
    let wcs = wait(&a.cq, 2);
    assert_eq!(wcs[1].status, WcStatus::WrFlushError);
    let peer = wait(&b.cq, 1);
    assert_eq!(
        (peer[0].wr_id, peer[0].status),
        (77, WcStatus::WrFlushError),
        "the responder flushes too"
    );
    (wcs[0].status, peer[0].status, b.qp.state())
}

#[test]
fn remote_operations_are_checked_against_key_bounds_and_access() {
    let bad_key = |m: &Mr| {
        SendOp::Write(RemoteRegion {
            rkey: m.rkey() ^ 0x4400,
            ..m.remote()
        })
    };
    let past_end = |m: &Mr| SendOp::Read(m.remote().at(4090));
    let before = |m: &Mr| {
        SendOp::Write(RemoteRegion {
            addr: m.addr() - 8,
            ..m.remote()
        })
    };
    let write = |m: &Mr| SendOp::Write(m.remote());
    let read = |m: &Mr| SendOp::Read(m.remote());
    let cas = |m: &Mr| SendOp::CompareSwap {
        remote: m.remote(),
        compare: 0,
        swap: 1,
    };
    let rw = Access::REMOTE_READ | Access::REMOTE_WRITE;
    type Case<'a> = (&'a str, Access, &'a dyn Fn(&Mr) -> SendOp, usize, WcStatus);
    let cases: [Case<'_>; 6] = [
        ("unknown rkey", rw, &bad_key, 8, WcStatus::RemoteAccessError),
        (
            "past the end",
            rw,
            &past_end,
            8,
            WcStatus::RemoteAccessError,
        ),
        (
            "before the start",
            rw,
            &before,
            8,
            WcStatus::RemoteAccessError,
        ),
        (
            "write to a read-only region",
            Access::REMOTE_READ,
            &write,
            8,
            WcStatus::RemoteAccessError,
        ),
        (
            "read of a write-only region",
            Access::REMOTE_WRITE,
            &read,
            8,
            WcStatus::RemoteAccessError,
        ),
        (
            "atomic without atomic access",
            rw,
            &cas,
            8,
            WcStatus::RemoteAccessError,
        ),
    ];
    for (what, access, op, local, want) in cases {
        let (status, _, responder) = refused(access, op, local);
        assert_eq!(status, want, "{what}");
        assert_eq!(
            responder,
            QpState::Error,
            "{what}: the responder QP goes to error"
        );
    }
    let misaligned = |m: &Mr| SendOp::FetchAdd {
        remote: m.remote().at(4),
        add: 1,
    };
    let (status, _, _) = refused(all(), misaligned, 8);
    assert_eq!(status, WcStatus::RemoteInvalidRequestError);
}

#[test]
fn a_send_larger_than_the_receive_fails_on_both_sides() {
    let (_f, a, b) = pair();
    recv(&b.qp, 3, Some(b.mr.sge(0..16).unwrap()));
    post(&a.qp, 1, SendOp::Send, Some(a.mr.sge(0..17).unwrap()));
    assert_eq!(
        wait(&a.cq, 1)[0].status,
        WcStatus::RemoteInvalidRequestError
    );
    assert_eq!(wait(&b.cq, 1)[0].status, WcStatus::LocalLengthError);
}

#[test]
fn reads_and_atomics_return_the_remote_bytes() {
    let (_f, mut a, mut b) = pair();
    b.mr.write(100, b"remote bytes").unwrap();
    post(
        &a.qp,
        1,
        SendOp::Read(b.mr.remote().slice(100, 12).unwrap()),
        Some(a.mr.sge(0..12).unwrap()),
    );
    assert_eq!(wait(&a.cq, 1)[0].opcode, WcOpcode::RdmaRead);
    assert_eq!(bytes(&a.mr, 0, 12), b"remote bytes");

    b.mr.write(64, &41u64.to_le_bytes()).unwrap();
    let word = b.mr.remote().slice(64, 8).unwrap();
    post(
        &a.qp,
        2,
        SendOp::FetchAdd {
            remote: word,
            add: 1,
        },
        Some(a.mr.sge(8..16).unwrap()),
    );
    post(
        &a.qp,
        3,
        SendOp::CompareSwap {
            remote: word,
            compare: 42,
            swap: 7,
        },
        Some(a.mr.sge(16..24).unwrap()),
    );
    post(
        &a.qp,
        4,
        SendOp::CompareSwap {
            remote: word,
            compare: 42,
            swap: 9,
        },
        Some(a.mr.sge(24..32).unwrap()),
    );
    let ops: Vec<_> = wait(&a.cq, 3)
        .iter()
        .map(|w| (w.opcode, w.status))
        .collect();
    assert_eq!(ops[0], (WcOpcode::FetchAdd, WcStatus::Success));
    assert_eq!(ops[1].0, WcOpcode::CompareSwap);
    assert_eq!(bytes(&a.mr, 8, 8), 41u64.to_le_bytes());
    assert_eq!(bytes(&a.mr, 16, 8), 42u64.to_le_bytes());
    assert_eq!(
        bytes(&a.mr, 24, 8),
        7u64.to_le_bytes(),
        "the second swap failed"
    );
    assert_eq!(bytes(&b.mr, 64, 8), 7u64.to_le_bytes());
    a.mr.write(0, &[0; 8]).unwrap();
}

#[test]
fn write_with_imm_consumes_a_receive_and_waits_for_one() {
    let (_f, mut a, b) = pair();
    a.mr.write(0, b"ingest").unwrap();
    let remote = b.mr.remote().slice(512, 6).unwrap();
    post(
        &a.qp,
        1,
        SendOp::WriteWithImm(remote, 0xfeed),
        Some(a.mr.sge(0..6).unwrap()),
    );
    std::thread::sleep(Duration::from_millis(5));
    nothing_more(&a.cq); // RNR until a receive is posted
    recv(&b.qp, 9, None);
    let r = wait(&b.cq, 1)[0];
    assert_eq!(
        (r.wr_id, r.opcode, r.imm_data, r.byte_len),
        (9, WcOpcode::RecvRdmaWithImm, Some(0xfeed), 6)
    );
    assert_eq!(bytes(&b.mr, 512, 6), b"ingest");
    assert_eq!(wait(&a.cq, 1)[0].opcode, WcOpcode::RdmaWrite);
}

#[test]
fn a_zero_length_write_needs_no_key() {
    let (_f, a, b) = pair();
    let nowhere = RemoteRegion {
        addr: 0,
        len: 0,
        rkey: 0,
    };
    post(&a.qp, 1, SendOp::Write(nowhere), None);
    post(
        &a.qp,
        2,
        SendOp::Write(nowhere),
        Some(a.mr.sge(0..0).unwrap()),
    );
    let wcs = wait(&a.cq, 2);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    assert_eq!(b.qp.state(), QpState::ReadyToSend);
}

/// A server QP on `server` connected to a new client device.
fn connection(fabric: &Fabric, server: &Device, cq: &Cq, name: &str) -> (Qp, Side) {
    let qp = server.create_qp(cq, cq, QpCaps::default(), None).unwrap();
    let client = side(fabric, name, all());
    connect_pair(&qp, &client.qp, &ConnParam::default()).unwrap();
    (qp, client)
}

/// The status of an 8-byte READ of `remote` by `client`.
fn read_status(client: &Side, remote: RemoteRegion) -> WcStatus {
    let local = Some(client.mr.sge(0..8).unwrap());
    post(
        &client.qp,
        5,
        SendOp::Read(remote.slice(0, 8).unwrap()),
        local,
    );
    wait(&client.cq, 1)[0].status
}

#[test]
fn a_window_serves_only_its_qp_and_only_what_it_grants() {
    let fabric = fabric();
    let server = fabric.device("server");
    let cq = server.create_cq(256, None).unwrap();
    // The region grants nothing remotely by itself; windows grant per connection.
    let region = server
        .register(4096, Access::LOCAL_WRITE | Access::MW_BIND)
        .unwrap();
    let (qp1, c1) = connection(&fabric, &server, &cq, "c1");
    let (_qp2, c2) = connection(&fabric, &server, &cq, "c2");
    let window = server.alloc_window().unwrap();
    let plain = server.register(64, Access::LOCAL_WRITE).unwrap();
    assert!(
        qp1.bind_window(1, &window, &plain, Access::REMOTE_READ)
            .is_err(),
        "no MW_BIND"
    );
    let grant = qp1
        .bind_window(1, &window, &region, Access::REMOTE_READ)
        .unwrap();
    assert_eq!(wait(&cq, 1)[0].opcode, WcOpcode::BindMw);
    assert_eq!(read_status(&c1, grant), WcStatus::Success);
    assert_eq!(read_status(&c1, grant.at(4088)), WcStatus::Success);
    assert_eq!(
        read_status(&c2, grant),
        WcStatus::RemoteAccessError,
        "another QP"
    );
    let local = Some(c1.mr.sge(0..8).unwrap());
    post(&c1.qp, 6, SendOp::Write(grant.slice(0, 8).unwrap()), local);
    assert_eq!(
        wait(&c1.cq, 1)[0].status,
        WcStatus::RemoteAccessError,
        "write not granted"
    );
    assert_eq!(qp1.state(), QpState::Error);
}

#[test]
fn a_window_is_revoked_by_binding_it_again_or_dropping_it() {
    let fabric = fabric();
    let server = fabric.device("server");
    let cq = server.create_cq(256, None).unwrap();
    let region = server
        .register(4096, Access::LOCAL_WRITE | Access::MW_BIND)
        .unwrap();

    let (qp, client) = connection(&fabric, &server, &cq, "c1");
    let window = server.alloc_window().unwrap();
    let first = qp
        .bind_window(1, &window, &region, Access::REMOTE_READ)
        .unwrap();
    let second = qp
        .bind_window(2, &window, &region, Access::REMOTE_READ)
        .unwrap();
    assert_ne!(first.rkey, second.rkey);
    assert_eq!(read_status(&client, second), WcStatus::Success);
    assert_eq!(
        read_status(&client, first),
        WcStatus::RemoteAccessError,
        "rebound"
    );

    let (qp, client) = connection(&fabric, &server, &cq, "c2");
    let window = server.alloc_window().unwrap();
    let grant = qp
        .bind_window(1, &window, &region, Access::REMOTE_READ)
        .unwrap();
    assert_eq!(read_status(&client, grant), WcStatus::Success);
    drop(window);
    assert_eq!(
        read_status(&client, grant),
        WcStatus::RemoteAccessError,
        "dropped"
    );
}

#[test]
fn a_window_over_a_range_of_a_shared_region_reaches_that_range_only() {
    let fabric = fabric();
    let server = fabric.device("server");
    let cq = server.create_cq(256, None).unwrap();
    let shared = Shared::alloc(&server, 64).unwrap();
    shared.write(16, b"granted!").unwrap();
    let window = server.alloc_window().unwrap();
    let (qp, client) = connection(&fabric, &server, &cq, "c0");
    for (range, access) in [
        (16..16, Access::REMOTE_READ),
        (60..65, Access::REMOTE_READ),
        (16..32, Access::REMOTE_READ | Access::LOCAL_WRITE),
        (16..32, Access::NONE),
    ] {
        assert!(
            qp.bind_shared_window(1, &window, &shared, range.clone(), access)
                .is_err(),
            "{range:?} {access:?}"
        );
    }
    let grant = qp
        .bind_shared_window(1, &window, &shared, 16..32, Access::REMOTE_READ)
        .unwrap();
    assert_eq!((grant.addr, grant.len), (shared.addr() + 16, 16));
    assert_eq!(wait(&cq, 1)[0].opcode, WcOpcode::BindMw);
    assert_eq!(read_status(&client, grant), WcStatus::Success);
    assert_eq!(bytes(&client.mr, 0, 8), b"granted!");
    assert_eq!(read_status(&client, grant.at(8)), WcStatus::Success);
    // Inside the registration, outside the window: refused (rxe would serve these).
    for (i, addr) in [grant.addr + 9, grant.addr - 1].into_iter().enumerate() {
        let (qp, client) = connection(&fabric, &server, &cq, &format!("c{}", i + 1));
        let window = server.alloc_window().unwrap();
        let grant = qp
            .bind_shared_window(1, &window, &shared, 16..32, Access::REMOTE_READ)
            .unwrap();
        wait(&cq, 1);
        let outside = RemoteRegion {
            addr,
            len: 8,
            ..grant
        };
        assert_eq!(
            read_status(&client, outside),
            WcStatus::RemoteAccessError,
            "{addr:#x} for a window at {:#x}",
            grant.addr
        );
    }
}

#[test]
fn closing_a_qp_flushes_its_outstanding_work() {
    let (_f, a, _b) = pair(); // _b: alive, with no receive posted
    for i in 0..4 {
        recv(&a.qp, 10 + i, Some(a.mr.sge(0..8).unwrap()));
    }
    // b posts no receive and a retries RNR for ever, so a's sends wait.
    for i in 0..3 {
        post(&a.qp, i, SendOp::Send, Some(a.mr.sge(0..8).unwrap()));
    }
    a.qp.to_error().unwrap();
    let wcs = wait(&a.cq, 7);
    assert!(
        wcs.iter().all(|w| w.status == WcStatus::WrFlushError),
        "{wcs:?}"
    );
    let mut ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [0, 1, 2, 10, 11, 12, 13]);
    // Work posted after the close completes at once, flushed.
    post(&a.qp, 20, SendOp::Send, Some(a.mr.sge(0..8).unwrap()));
    recv(&a.qp, 21, None);
    let late: Vec<_> = wait(&a.cq, 2).iter().map(|w| (w.wr_id, w.status)).collect();
    assert!(
        late.contains(&(20, WcStatus::WrFlushError))
            && late.contains(&(21, WcStatus::WrFlushError))
    );
}

#[test]
fn a_vanished_peer_is_seen_only_through_retry_exceeded() {
    let param = ConnParam {
        retry_count: 3,
        ..ConnParam::default()
    };
    let (_f, a, b) = pair_with(param, all());
    recv(&b.qp, 1, Some(b.mr.sge(0..8).unwrap()));
    b.dev.vanish();
    let started = Instant::now();
    post(&a.qp, 1, SendOp::Send, Some(a.mr.sge(0..8).unwrap()));
    post(
        &a.qp,
        2,
        SendOp::Read(b.mr.remote().slice(0, 8).unwrap()),
        Some(a.mr.sge(8..16).unwrap()),
    );
    let wcs = wait(&a.cq, 2);
    let took = started.elapsed();
    // ACK timeout 2 ms × (3 retries + 1).
    assert!(took >= Duration::from_millis(8), "{took:?}");
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::RetryExceeded));
    assert_eq!((wcs[1].wr_id, wcs[1].status), (2, WcStatus::WrFlushError));
    nothing_more(&b.cq); // the vanished side hears nothing either
}

#[test]
fn a_shared_receive_queue_feeds_every_qp_on_it() {
    let fabric = fabric();
    let server = fabric.device("server");
    let cq = server.create_cq(256, None).unwrap();
    let srq = server.create_srq(16).unwrap();
    let buffers = server
        .register(16 * 64, Access::LOCAL_WRITE)
        .unwrap()
        .split(64);
    let wrs: Vec<_> = buffers
        .iter()
        .enumerate()
        .map(|(i, b)| RecvWr {
            wr_id: i as u64,
            local: Some(b.sge_all()),
        })
        .collect();
    srq.post_recv(&wrs).unwrap();
    let mut clients = Vec::new();
    for name in ["c1", "c2", "c3"] {
        let qp = server
            .create_qp(&cq, &cq, QpCaps::default(), Some(&srq))
            .unwrap();
        assert!(
            qp.post_recv(&[RecvWr {
                wr_id: 0,
                local: None
            }])
            .is_err(),
            "post on the SRQ"
        );
        let c = side(&fabric, name, all());
        connect_pair(&qp, &c.qp, &ConnParam::default()).unwrap();
        clients.push((qp, c));
    }
    for (i, (_, c)) in clients.iter().enumerate() {
        for _ in 0..2 {
            post(
                &c.qp,
                i as u64,
                SendOp::Send,
                Some(c.mr.sge(0..32).unwrap()),
            );
        }
    }
    let wcs = wait(&cq, 6);
    assert_eq!(srq.posted(), 10);
    for (qp, _) in &clients {
        assert_eq!(wcs.iter().filter(|w| w.qp_num == qp.qp_num()).count(), 2);
    }
    let mut slots: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    slots.sort_unstable();
    assert_eq!(
        slots,
        [0, 1, 2, 3, 4, 5],
        "six distinct receives, oldest first"
    );
    // A QP that leaves does not flush the shared receives.
    clients[0].0.to_error().unwrap();
    nothing_more(&cq);
    assert_eq!(srq.posted(), 10);
}

#[test]
fn an_armed_cq_wakes_a_poller_blocked_on_its_channel() {
    let fabric = fabric();
    let a = side(&fabric, "a", all());
    let dev = fabric.device("b");
    let channel = dev.create_channel().unwrap();
    let cq = dev.create_cq(64, Some(&channel)).unwrap();
    let qp = dev.create_qp(&cq, &cq, QpCaps::default(), None).unwrap();
    let mr = dev.register(64, Access::LOCAL_WRITE).unwrap();
    connect_pair(&a.qp, &qp, &ConnParam::default()).unwrap();
    recv(&qp, 4, Some(mr.sge_all()));
    cq.req_notify(false);
    let key = cq.key();
    let poller = std::thread::spawn({
        let (channel, cq) = (channel.clone(), cq.clone());
        move || {
            let woke = channel.wait(Some(Duration::from_secs(5)));
            let mut wcs = Vec::new();
            cq.poll(&mut wcs).unwrap();
            (woke, wcs, Instant::now())
        }
    });
    std::thread::sleep(Duration::from_millis(20));
    let sent = Instant::now();
    post(&a.qp, 1, SendOp::Send, Some(a.mr.sge(0..8).unwrap()));
    let (woke, wcs, at) = poller.join().unwrap();
    assert_eq!(woke, Some(key));
    assert_eq!(wcs[0].wr_id, 4);
    assert!(at >= sent);
    // Not armed: no event.
    recv(&qp, 5, Some(mr.sge_all()));
    post(&a.qp, 2, SendOp::Send, Some(a.mr.sge(0..8).unwrap()));
    assert_eq!(channel.wait(Some(Duration::from_millis(20))), None);
    // Armed for solicited only: an unsolicited SEND does not wake, a solicited one does.
    wait(&cq, 1);
    cq.req_notify(true);
    recv(&qp, 6, Some(mr.sge_all()));
    recv(&qp, 7, Some(mr.sge_all()));
    post(&a.qp, 3, SendOp::Send, Some(a.mr.sge(0..8).unwrap()));
    assert_eq!(channel.wait(Some(Duration::from_millis(20))), None);
    let mut wr = SendWr::new(4, SendOp::Send, Some(a.mr.sge(0..8).unwrap()));
    wr.solicited = true;
    a.qp.post_send(&wr).unwrap();
    assert_eq!(channel.wait(Some(Duration::from_secs(5))), Some(key));
}

#[test]
fn a_stalled_qp_holds_its_work_and_its_peer_times_out_if_it_lasts() {
    // ACK timeout 10 ms, 7 retries: a stall shorter than 80 ms is ridden out.
    let fabric = Fabric::new(Config {
        ack_timeout: Duration::from_millis(10),
        ..fabric().config()
    });
    let (a, b) = (side(&fabric, "a", all()), side(&fabric, "b", all()));
    connect_pair(&a.qp, &b.qp, &ConnParam::default()).unwrap();
    recv(&b.qp, 1, Some(b.mr.sge(0..8).unwrap()));
    recv(&a.qp, 2, Some(a.mr.sge(0..8).unwrap()));
    // A stalled sender sends nothing, and resumes where it stopped.
    a.qp.stall();
    post(&a.qp, 10, SendOp::Send, Some(a.mr.sge(0..8).unwrap()));
    std::thread::sleep(Duration::from_millis(30));
    nothing_more(&b.cq);
    a.qp.resume();
    assert_eq!(wait(&b.cq, 1)[0].wr_id, 1);
    assert_eq!(wait(&a.cq, 1)[0].wr_id, 10);
    // A short stall of the responder is ridden out by retransmission...
    b.qp.stall();
    post(
        &a.qp,
        11,
        SendOp::Read(b.mr.remote().slice(0, 8).unwrap()),
        Some(a.mr.sge(8..16).unwrap()),
    );
    std::thread::sleep(Duration::from_millis(5));
    b.qp.resume();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
    // ...a long one is not: 10 ms × 8 later the request fails.
    b.qp.stall();
    post(&a.qp, 12, SendOp::Send, Some(a.mr.sge(0..8).unwrap()));
    assert_eq!(wait(&a.cq, 2)[0].status, WcStatus::RetryExceeded);
}

#[test]
fn delayed_completions_arrive_late_in_order_and_still_wake_the_poller() {
    let fabric = fabric();
    let client = side(&fabric, "client", all());
    let dev = fabric.device("server");
    let channel = dev.create_channel().unwrap();
    let cq = dev.create_cq(16, Some(&channel)).unwrap();
    let qp = dev.create_qp(&cq, &cq, QpCaps::default(), None).unwrap();
    connect_pair(&qp, &client.qp, &ConnParam::default()).unwrap();
    cq.delay_completions(Duration::from_millis(200));
    let mr = dev.register(64, Access::LOCAL_WRITE).unwrap();
    recv(&qp, 1, Some(mr.sge(0..8).unwrap()));
    recv(&qp, 2, Some(mr.sge(8..16).unwrap()));
    cq.req_notify(false);
    let sent = Instant::now();
    post(
        &client.qp,
        1,
        SendOp::Send,
        Some(client.mr.sge(0..8).unwrap()),
    );
    post(
        &client.qp,
        2,
        SendOp::Send,
        Some(client.mr.sge(0..8).unwrap()),
    );
    nothing_more(&cq);
    assert_eq!(channel.wait(Some(Duration::from_secs(5))), Some(cq.key()));
    assert!(sent.elapsed() >= Duration::from_millis(200));
    let ids: Vec<u64> = wait(&cq, 2).iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [1, 2]);
}

#[test]
fn refused_registrations_fail_until_allowed_again() {
    let fabric = fabric();
    let dev = fabric.device("d");
    dev.refuse_registrations(true);
    assert_eq!(
        dev.register(4096, Access::LOCAL_WRITE).unwrap_err(),
        LoopbackError::RegistrationRefused { len: 4096 }
    );
    dev.refuse_registrations(false);
    assert!(dev.register(4096, Access::LOCAL_WRITE).is_ok());
}

#[test]
fn a_dropped_registration_fails_the_requests_that_name_it() {
    let (_f, a, b) = pair();
    let remote = b.mr.remote();
    let Side { mr, .. } = b;
    drop(mr);
    post(
        &a.qp,
        1,
        SendOp::Read(remote.slice(0, 8).unwrap()),
        Some(a.mr.sge(0..8).unwrap()),
    );
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::RemoteAccessError);
}

/// A listener and a connecting client on one fabric.
struct Cm {
    fabric: Fabric,
    server: Device,
    server_events: EventChannel,
    listener: CmId,
    addr: std::net::SocketAddr,
}

fn cm() -> Cm {
    let fabric = fabric();
    let server = fabric.device("server");
    let server_events = server.create_event_channel().unwrap();
    let listener = server.create_id(&server_events).unwrap();
    let addr = "10.0.0.1:7471".parse().unwrap();
    listener.bind(addr).unwrap();
    listener.listen(16).unwrap();
    Cm {
        fabric,
        server,
        server_events,
        listener,
        addr,
    }
}

fn next(events: &EventChannel, kind: CmEventKind) -> CmEvent {
    let ev = events.next(Some(Duration::from_secs(5))).expect("an event");
    assert_eq!(ev.kind, kind, "{ev:?}");
    ev
}

/// A client id with a QP, connecting to `addr` with `hello` (its events, id, QP, CQ).
fn dial(cm: &Cm, addr: std::net::SocketAddr, hello: &[u8]) -> (EventChannel, CmId, Qp, Cq) {
    let dev = cm.fabric.device("client");
    let events = dev.create_event_channel().unwrap();
    let id = dev.create_id(&events).unwrap();
    id.resolve_addr(None, addr, Duration::from_secs(1)).unwrap();
    next(&events, CmEventKind::AddrResolved);
    id.resolve_route(Duration::from_secs(1)).unwrap();
    next(&events, CmEventKind::RouteResolved);
    let cq = dev.create_cq(64, None).unwrap();
    let qp = id
        .create_qp(&dev, &cq, &cq, QpCaps::default(), None)
        .unwrap();
    let param = ConnParam {
        private_data: hello,
        ..ConnParam::default()
    };
    id.connect(&param).unwrap();
    (events, id, qp, cq)
}

#[test]
fn connect_accept_and_disconnect_carry_private_data_and_reach_both_sides() {
    let cm = cm();
    let (client_events, client, client_qp, _cq) = dial(&cm, cm.addr, b"hello echo");
    let mut req = next(&cm.server_events, CmEventKind::ConnectRequest);
    assert_eq!(req.private_data, b"hello echo");
    assert_eq!(req.listen_id, Some(cm.listener.key()));
    let id = req.take_request().unwrap();
    assert_eq!(id.key(), req.id);
    let cq = cm.server.create_cq(64, None).unwrap();
    let qp = id
        .create_qp(&cm.server, &cq, &cq, QpCaps::default(), None)
        .unwrap();
    let param = ConnParam {
        private_data: b"welcome",
        ..ConnParam::default()
    };
    id.accept(&param).unwrap();
    assert_eq!(
        next(&client_events, CmEventKind::Established).private_data,
        b"welcome"
    );
    next(&cm.server_events, CmEventKind::Established);
    assert_eq!(qp.state(), QpState::ReadyToSend);
    assert_eq!(client_qp.state(), QpState::ReadyToSend);

    client.disconnect().unwrap();
    next(&client_events, CmEventKind::Disconnected);
    assert_eq!(
        next(&cm.server_events, CmEventKind::Disconnected).id,
        id.key()
    );
    assert_eq!(
        client_qp.state(),
        QpState::Error,
        "rdma_disconnect moves the QP to error"
    );
    assert!(id.disconnect().is_err(), "already disconnected");
}

#[test]
fn rejects_say_why_and_nobody_listening_is_reason_8() {
    let cm = cm();
    let (client_events, _client, _qp, _cq) = dial(&cm, cm.addr, b"v9");
    let mut req = next(&cm.server_events, CmEventKind::ConnectRequest);
    req.take_request()
        .unwrap()
        .reject(b"version 9 unknown")
        .unwrap();
    let ev = next(&client_events, CmEventKind::Rejected);
    assert_eq!(
        (ev.status, ev.private_data.as_slice()),
        (28, &b"version 9 unknown"[..])
    );

    // A request dropped unanswered is a reject too.
    let (client_events, _client, _qp, _cq) = dial(&cm, cm.addr, b"again");
    drop(next(&cm.server_events, CmEventKind::ConnectRequest));
    assert_eq!(next(&client_events, CmEventKind::Rejected).status, 28);

    let elsewhere = "10.0.0.2:7471".parse().unwrap();
    let (client_events, _client, _qp, _cq) = dial(&cm, elsewhere, b"");
    assert_eq!(next(&client_events, CmEventKind::Rejected).status, 8);
}

#[test]
fn a_connect_to_a_vanished_host_is_unreachable_after_the_cm_timeout() {
    let cm = cm();
    cm.server.vanish();
    let started = Instant::now();
    let (client_events, _client, _qp, _cq) = dial(&cm, cm.addr, b"hello");
    let ev = next(&client_events, CmEventKind::Unreachable);
    assert_eq!(ev.status, -110);
    assert!(started.elapsed() >= cm.fabric.config().cm_timeout);
    assert!(cm.server_events.try_next().is_none());
}

#[test]
fn a_removed_device_tells_its_ids_and_flushes_its_qps() {
    let cm = cm();
    let (_client_events, _client, _cqp, _ccq) = dial(&cm, cm.addr, b"hi");
    let mut req = next(&cm.server_events, CmEventKind::ConnectRequest);
    let id = req.take_request().unwrap();
    let cq = cm.server.create_cq(64, None).unwrap();
    let qp = id
        .create_qp(&cm.server, &cq, &cq, QpCaps::default(), None)
        .unwrap();
    let mr = cm.server.register(64, Access::LOCAL_WRITE).unwrap();
    recv(&qp, 3, Some(mr.sge_all()));
    id.accept(&ConnParam::default()).unwrap();
    next(&cm.server_events, CmEventKind::Established);
    cm.server.remove();
    let mut kinds = vec![
        cm.server_events
            .next(Some(Duration::from_secs(1)))
            .unwrap()
            .kind,
        cm.server_events
            .next(Some(Duration::from_secs(1)))
            .unwrap()
            .kind,
    ];
    kinds.dedup();
    assert_eq!(
        kinds,
        [CmEventKind::DeviceRemoval],
        "the listener and the connection"
    );
    assert_eq!(wait(&cq, 1)[0].status, WcStatus::WrFlushError);
    assert!(matches!(
        cm.server.register(64, Access::NONE),
        Err(LoopbackError::DeviceRemoved(_))
    ));
}

/// The same exchange written once against the traits: what the runtime will do.
fn generic_ping<T: crate::transport::Transport>(
    a: &T::Qp,
    b: &T::Qp,
    a_cq: &T::Cq,
    b_cq: &T::Cq,
    a_mr: &T::Region,
    b_mr: &mut T::Region,
) -> Vec<u8>
where
    T::Error: std::fmt::Debug,
{
    use crate::transport::{CompletionQueue as _, QueuePair as _, Region as _};
    b.post_recv(&[RecvWr {
        wr_id: 1,
        local: Some(b_mr.sge(0..16).unwrap()),
    }])
    .unwrap();
    a.post_send(&SendWr::new(2, SendOp::Send, Some(a_mr.sge(0..5).unwrap())))
        .unwrap();
    let mut wcs = Vec::new();
    while wcs.is_empty() {
        b_cq.poll(&mut wcs).unwrap();
    }
    let mut sent = Vec::new();
    while sent.is_empty() {
        a_cq.poll(&mut sent).unwrap();
    }
    let mut out = vec![0; wcs[0].byte_len as usize];
    b_mr.read(0, &mut out).unwrap();
    b_mr.write(0, &[0; 16]).unwrap();
    out
}

#[test]
fn the_traits_drive_loopback() {
    let (_f, mut a, mut b) = pair();
    a.mr.write(0, b"hello").unwrap();
    let got = generic_ping::<Loopback>(&a.qp, &b.qp, &a.cq, &b.cq, &a.mr, &mut b.mr);
    assert_eq!(got, b"hello");
}

/// SEND ping-pong of `len` bytes between two threads, each spinning on its CQ; the
/// average round trip.
fn ping_pong(len: usize, rounds: u64) -> Duration {
    let (_f, a, b) = pair();
    // One side: post a receive, then for each round wait for its message and answer
    // (`first` sends before waiting). Sends are signaled one in 16, as the runtime's are.
    let run = |s: &Side, first: bool| {
        let mut wcs = Vec::with_capacity(32);
        recv(&s.qp, 0, Some(s.mr.sge(0..len).unwrap()));
        for i in 0..rounds {
            let mut wr = SendWr::new(i, SendOp::Send, Some(s.mr.sge(0..len).unwrap()));
            wr.signaled = i % 16 == 0;
            if first {
                s.qp.post_send(&wr).unwrap();
            }
            while !wcs
                .iter()
                .any(|w: &WorkCompletion| w.opcode == WcOpcode::Recv)
            {
                wcs.clear();
                s.cq.poll(&mut wcs).unwrap();
            }
            wcs.clear();
            recv(&s.qp, i + 1, Some(s.mr.sge(0..len).unwrap()));
            if !first {
                s.qp.post_send(&wr).unwrap();
            }
        }
    };
    std::thread::scope(|scope| {
        scope.spawn(|| run(&b, false));
        let started = Instant::now();
        run(&a, true);
        started.elapsed() / rounds as u32
    })
}

/// The same exchange on one thread (post, then poll the peer's CQ at once): the
/// transport's own cost, without two spinning threads competing for the machine.
pub(crate) fn ping_pong_one_thread(len: usize, rounds: u64) -> Duration {
    let (_f, a, b) = pair();
    let mut wcs = Vec::with_capacity(32);
    recv(&a.qp, 0, Some(a.mr.sge(0..len).unwrap()));
    recv(&b.qp, 0, Some(b.mr.sge(0..len).unwrap()));
    let started = Instant::now();
    for i in 0..rounds {
        for (from, to) in [(&a, &b), (&b, &a)] {
            let mut wr = SendWr::new(i, SendOp::Send, Some(from.mr.sge(0..len).unwrap()));
            wr.signaled = i % 16 == 0;
            from.qp.post_send(&wr).unwrap();
            wcs.clear();
            to.cq.poll(&mut wcs).unwrap();
            assert!(wcs.iter().any(|w| w.opcode == WcOpcode::Recv));
            recv(&to.qp, i + 1, Some(to.mr.sge(0..len).unwrap()));
        }
    }
    started.elapsed() / rounds as u32
}

/// The transport's own cost per round trip. Run with `cargo test --release -p rdmactor
/// loopback_speed -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement; run by hand in release"]
fn loopback_speed() {
    for len in [16, 4096] {
        let one = ping_pong_one_thread(len, 200_000);
        let two = ping_pong(len, 20_000);
        println!(
            "loopback SEND ping-pong, {len} B: {} ns per round trip on one thread, {} ns between two spinning threads",
            one.as_nanos(),
            two.as_nanos()
        );
    }
}

/// The measurement's exchanges complete (each side checks what it receives); how long
/// they take is `loopback_speed`'s business, never a test's: a loaded machine would fail
/// a time limit here.
#[test]
fn ping_pong_runs() {
    ping_pong(64, 100);
    ping_pong_one_thread(64, 100);
}

#[test]
fn unsignaled_requests_complete_only_when_they_fail() {
    let (_f, a, b) = pair();
    recv(&b.qp, 1, Some(b.mr.sge(0..8).unwrap()));
    let mut wr = SendWr::new(1, SendOp::Send, Some(a.mr.sge(0..8).unwrap()));
    wr.signaled = false;
    a.qp.post_send(&wr).unwrap();
    wait(&b.cq, 1);
    nothing_more(&a.cq);
    let bad = RemoteRegion {
        addr: 8,
        len: 8,
        rkey: 1,
    };
    let mut wr = SendWr::new(2, SendOp::Write(bad), Some(a.mr.sge(0..8).unwrap()));
    wr.signaled = false;
    a.qp.post_send(&wr).unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::RemoteAccessError);
}

#[test]
fn inline_bytes_are_taken_at_post_time() {
    let (_f, mut a, b) = pair();
    a.mr.write(0, b"before").unwrap();
    let mut wr = SendWr::new(1, SendOp::Send, Some(a.mr.sge(0..6).unwrap()));
    wr.inline = true;
    a.qp.post_send(&wr).unwrap(); // waits: no receive yet
    a.mr.write(0, b"after!").unwrap();
    recv(&b.qp, 1, Some(b.mr.sge(0..6).unwrap()));
    wait(&b.cq, 1);
    assert_eq!(bytes(&b.mr, 0, 6), b"before");
    let big = a.mr.sge(0..MAX_INLINE + 1).unwrap();
    let mut wr = SendWr::new(2, SendOp::Send, Some(big));
    wr.inline = true;
    assert!(a.qp.post_send(&wr).is_err());
}

#[test]
fn full_queues_refuse_and_an_overrun_cq_says_so() {
    let fabric = fabric();
    let a = side(&fabric, "a", all());
    let dev = fabric.device("b");
    let cq = dev.create_cq(2, None).unwrap();
    let caps = QpCaps {
        max_send_wr: 2,
        max_recv_wr: 3,
        ..QpCaps::default()
    };
    let qp = dev.create_qp(&cq, &cq, caps, None).unwrap();
    let mr = dev.register(64, all()).unwrap();
    connect_pair(&a.qp, &qp, &ConnParam::default()).unwrap();
    let three: Vec<_> = (0..3)
        .map(|i| RecvWr {
            wr_id: i,
            local: Some(mr.sge_all()),
        })
        .collect();
    qp.post_recv(&three).unwrap();
    assert!(matches!(
        qp.post_recv(&three[..1]),
        Err(LoopbackError::QueueFull { .. })
    ));
    a.qp.stall(); // its answers stop, so b's requests stay queued
    let read = SendOp::Read(a.mr.remote().slice(0, 8).unwrap());
    post(&qp, 1, read, Some(mr.sge(0..8).unwrap()));
    post(&qp, 2, read, Some(mr.sge(0..8).unwrap()));
    let refused = qp.post_send(&SendWr::new(3, read, Some(mr.sge(0..8).unwrap())));
    assert!(matches!(
        refused,
        Err(LoopbackError::QueueFull { capacity: 2, .. })
    ));
    // Five flushes into a CQ of two.
    qp.to_error().unwrap();
    let mut wcs = Vec::new();
    assert!(matches!(
        cq.poll(&mut wcs),
        Err(LoopbackError::CqOverrun(_))
    ));
}

/// A sender and a receiver on two threads with two receives in flight: most SENDs meet
/// RNR and wait for the clock, and every one arrives once, in order.
#[test]
fn sends_stay_in_order_through_rnr_waits_across_threads() {
    let (_f, mut a, b) = pair();
    const N: u64 = 1000;
    for i in 0..2 {
        recv(
            &b.qp,
            i,
            Some(b.mr.sge(i as usize * 8..i as usize * 8 + 8).unwrap()),
        );
    }
    let receiver = std::thread::spawn(move || {
        let mut wcs = Vec::new();
        let mut next = 0u64;
        let deadline = Instant::now() + Duration::from_secs(30);
        while next < N && Instant::now() < deadline {
            wcs.clear();
            b.cq.poll(&mut wcs).unwrap();
            for wc in &wcs {
                assert_eq!(wc.status, WcStatus::Success);
                let slot = wc.wr_id as usize % 2;
                let got = u64::from_le_bytes(bytes(&b.mr, slot * 8, 8).try_into().unwrap());
                assert_eq!(got, next, "in order, once");
                next += 1;
                recv(
                    &b.qp,
                    wc.wr_id + 2,
                    Some(b.mr.sge(slot * 8..slot * 8 + 8).unwrap()),
                );
            }
        }
        next
    });
    let mut sent = 0u64;
    let mut wcs = Vec::new();
    let mut inflight = 0;
    while sent < N {
        wcs.clear();
        a.cq.poll(&mut wcs).unwrap();
        inflight -= wcs.len();
        if inflight == 64 {
            continue;
        }
        // Each message from its own 8 bytes of the ring of 64, untouched until it completes.
        let at = (sent % 64) as usize * 8 + 64;
        a.mr.write(at, &sent.to_le_bytes()).unwrap();
        post(
            &a.qp,
            sent,
            SendOp::Send,
            Some(a.mr.sge(at..at + 8).unwrap()),
        );
        inflight += 1;
        sent += 1;
    }
    assert_eq!(receiver.join().unwrap(), N);
}

/// The poller's event mode, written against the traits: arm, wait on the channel as a
/// task, drain.
async fn next_completion<T: crate::transport::Transport>(
    channel: &T::Channel,
    cq: &T::Cq,
) -> WorkCompletion
where
    T::Error: std::fmt::Debug,
{
    use crate::transport::{CompletionChannel as _, CompletionQueue as _};
    let waiter = channel.waiter().unwrap();
    let mut wcs = Vec::new();
    loop {
        cq.req_notify(false).unwrap();
        if cq.poll(&mut wcs).unwrap() > 0 {
            return wcs[0];
        }
        channel.ready(&waiter).await.unwrap();
    }
}

#[test]
fn a_task_awaiting_the_channel_wakes_on_a_completion() {
    let fabric = fabric();
    let a = side(&fabric, "a", all());
    let dev = fabric.device("b");
    let channel = dev.create_channel().unwrap();
    let cq = dev.create_cq(64, Some(&channel)).unwrap();
    let qp = dev.create_qp(&cq, &cq, QpCaps::default(), None).unwrap();
    let mr = dev.register(64, Access::LOCAL_WRITE).unwrap();
    connect_pair(&a.qp, &qp, &ConnParam::default()).unwrap();
    recv(&qp, 4, Some(mr.sge_all()));
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        post(&a.qp, 1, SendOp::Send, Some(a.mr.sge(0..8).unwrap()));
        a
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let wc = runtime.block_on(async {
        let next = next_completion::<Loopback>(&channel, &cq);
        tokio::time::timeout(Duration::from_secs(5), next).await
    });
    assert_eq!(wc.expect("woken").wr_id, 4);
    drop(sender.join().unwrap());
}

/// Two threads posting on one QP at once: one executes while the other's requests are
/// picked up by it; each thread's messages arrive once and in its order.
#[test]
fn two_threads_posting_on_one_qp_lose_nothing_and_keep_each_order() {
    let fabric = fabric();
    let a = side(&fabric, "a", all());
    let dev = fabric.device("b");
    let cq = dev.create_cq(4096, None).unwrap();
    let caps = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 2048,
        ..QpCaps::default()
    };
    let qp = dev.create_qp(&cq, &cq, caps, None).unwrap();
    let mr = dev.register(2048 * 8, Access::LOCAL_WRITE).unwrap();
    connect_pair(&a.qp, &qp, &ConnParam::default()).unwrap();
    const EACH: u64 = 1000;
    let wrs: Vec<_> = (0..2 * EACH as usize)
        .map(|i| RecvWr {
            wr_id: i as u64,
            local: Some(mr.sge(i * 8..i * 8 + 8).unwrap()),
        })
        .collect();
    qp.post_recv(&wrs).unwrap();
    let regions: Vec<Mr> = (0..2)
        .map(|_| {
            let mut r = a.dev.register(EACH as usize * 8, Access::NONE).unwrap();
            for i in 0..EACH {
                r.write(i as usize * 8, &i.to_le_bytes()).unwrap();
            }
            r
        })
        .collect();
    std::thread::scope(|s| {
        for (t, region) in regions.iter().enumerate() {
            let qp = &a.qp;
            s.spawn(move || {
                for i in 0..EACH {
                    let at = i as usize * 8;
                    let mut wr = SendWr::new(
                        t as u64,
                        SendOp::SendWithImm(t as u32),
                        Some(region.sge(at..at + 8).unwrap()),
                    );
                    wr.signaled = false;
                    while let Err(LoopbackError::QueueFull { .. }) = qp.post_send(&wr) {
                        std::thread::yield_now();
                    }
                }
            });
        }
    });
    let got = wait(&cq, 2 * EACH as usize);
    let mut next = [0u64; 2];
    for wc in got {
        let t = wc.imm_data.unwrap() as usize;
        let value = u64::from_le_bytes(bytes(&mr, wc.wr_id as usize * 8, 8).try_into().unwrap());
        assert_eq!(value, next[t], "thread {t}");
        next[t] += 1;
    }
    assert_eq!(next, [EACH, EACH]);
    nothing_more(&a.cq);
}
