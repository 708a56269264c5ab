//! The connection core, natively: two cores joined by a pair of loopback QPs, and the
//! test as their driver. It does what the actor does (`lifecycle.rs`) and nothing
//! more: tell the core the time, hand it its completions, take its deliveries, pump.
//! What these tests see is what rdmactor's protocol does on a transport that keeps
//! RDMA's rules (RC order, RNR, rkeys and bounds, flushes), with no device and no actor.

use std::time::{Duration, Instant};

use super::*;
use crate::memory::PoolConfig;
use crate::proto::credits::Advert;
use crate::proto::frame::{FrameKind, Header};
use crate::runtime::ConnectionConfig;
use crate::transport::loopback::{connect_pair, Config, Cq, Device, Fabric, Loopback, Mr};
use crate::transport::SendWr;
use crate::verbs::{Access, ConnParam, QpCaps, SendOp};

/// Receives per connection (and the credits each side starts with).
const DEPTH: u32 = 8;
/// Receive buffer size: messages above 240 bytes go by rendezvous.
const RECV_SIZE: usize = 256;

/// One side: its core, its CQ, and what reached its session.
struct End {
    core: Core<Loopback>,
    cq: Cq,
    device: Device,
    got: Vec<Incoming>,
    /// Why the core closed, once it did.
    closed: Option<CloseReason>,
}

struct Pair {
    _fabric: Fabric,
    a: End,
    b: End,
}

fn config() -> ConnectionConfig {
    ConnectionConfig {
        send_depth: 16,
        rendezvous_chunk: 4096,
        rendezvous_chunks: 2,
        ..ConnectionConfig::default()
    }
}

fn end(fabric: &Fabric, name: &str, config: ConnectionConfig) -> End {
    let device = fabric.device(name);
    let cq = device.create_cq(256, None).unwrap();
    let caps = QpCaps {
        max_send_wr: config.send_depth,
        max_recv_wr: DEPTH,
        ..QpCaps::default()
    };
    let qp = device.create_qp(&cq, &cq, caps, None).unwrap();
    let pool = MrPool::<Loopback>::registered(
        &device,
        PoolConfig {
            classes: vec![RECV_SIZE, 4096],
            arena_bytes: 64 << 10,
            max_bytes: 4 << 20,
            reserved_smallest: 0,
            keep_bytes: 0,
            heap_bytes: 4 << 20,
        },
    );
    let recv = (0..DEPTH).map(|_| pool.lease(RECV_SIZE).unwrap()).collect();
    let core = Core::new(CoreParts {
        qp,
        id: None,
        shared_recv: None,
        membership: None,
        cq: None,
        framing: Framing::Framed,
        recv,
        recv_size: RECV_SIZE,
        credits: Some(CreditWindow::new(
            Advert::fixed(DEPTH),
            Advert::fixed(DEPTH),
        )),
        pd: device.clone(),
        pool,
        config,
    });
    End {
        core,
        cq,
        device,
        got: Vec::new(),
        closed: None,
    }
}

/// Two framed cores, connected (no RNR retries: a credit rule broken shows as an error
/// rather than a wait), receives posted, established.
fn pair_with(config: ConnectionConfig) -> Pair {
    let fabric = Fabric::new(Config::default());
    let mut a = end(&fabric, "a", config.clone());
    let mut b = end(&fabric, "b", config);
    let param = ConnParam {
        rnr_retry_count: 0,
        ..ConnParam::default()
    };
    connect_pair(&a.core.qp, &b.core.qp, &param).unwrap();
    let now = Instant::now();
    for e in [&mut a, &mut b] {
        e.core.set_now(now);
        e.core.post_all_receives().unwrap();
        e.core.establish(now);
    }
    Pair {
        _fabric: fabric,
        a,
        b,
    }
}

fn pair() -> Pair {
    pair_with(config())
}

impl End {
    /// One turn of the driver: completions in, deliveries out, then everything the
    /// core decided posted. False when nothing completed.
    fn turn(&mut self) -> bool {
        if self.closed.is_some() {
            return false;
        }
        self.core.set_now(Instant::now());
        let mut wcs = Vec::new();
        self.cq.poll(&mut wcs).unwrap();
        if !wcs.is_empty() {
            self.core.liveness.heard();
        }
        for wc in &wcs {
            if let Err(reason) = self.core.handle_completion(wc) {
                self.closed = Some(reason);
                return true;
            }
        }
        while let Some(m) = self.core.next_delivery() {
            self.got.push(m);
        }
        if let Err(reason) = self.core.pump() {
            self.closed = Some(reason);
        }
        !wcs.is_empty()
    }

    fn send(&mut self, tag: u32, bytes: Vec<u8>) {
        self.core.queue(Outgoing::Data { tag, bytes });
    }

    /// A frame made by hand, sent from memory of this side's device on its QP: what a
    /// hostile or broken peer can put on the wire.
    fn send_raw(&self, frame: &[u8]) {
        let mut mr: Mr = self
            .device
            .register(frame.len(), Access::LOCAL_WRITE)
            .unwrap();
        mr.write(0, frame).unwrap();
        let wr = SendWr::new(u64::MAX - 1, SendOp::Send, Some(mr.sge_all()));
        self.core.qp.post_send(&wr).unwrap();
    }
}

impl Pair {
    /// Turns both sides until `done` holds or nothing moves for a while.
    fn run_until(&mut self, mut done: impl FnMut(&Pair) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done(self) {
            assert!(Instant::now() < deadline, "no progress: stuck");
            let moved = self.a.turn() | self.b.turn();
            if !moved {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
}

/// Message `i` of a run: its length varies, its bytes say which message it is.
fn message(i: u32, len: usize) -> Vec<u8> {
    (0..len).map(|k| (i as usize * 31 + k) as u8).collect()
}

#[test]
fn messages_arrive_once_and_in_order_through_a_window_of_eight_credits() {
    let mut p = pair();
    let n = 300u32;
    for i in 0..n {
        p.a.send(i + 1, message(i, (i as usize * 7) % 241));
    }
    p.run_until(|p| p.b.got.len() == n as usize || p.a.closed.is_some());
    assert_eq!(p.a.closed, None);
    assert_eq!(p.b.closed, None);
    for (i, m) in p.b.got.iter().enumerate() {
        let i = i as u32;
        assert_eq!(m.tag, i + 1, "in order");
        assert_eq!(m.data, message(i, (i as usize * 7) % 241));
    }
    // Credits came back as they were used (no RNR retries are allowed), and the
    // window is whole again once everything is acknowledged.
    p.run_until(|p| p.a.core.send_outstanding == 0 && p.b.core.send_outstanding == 0);
    assert!(p.a.core.pending.is_empty());
}

#[test]
fn a_large_message_is_read_by_rendezvous_in_chunks_and_released() {
    let mut p = pair();
    let big = message(7, 50_000);
    p.a.send(9, big.clone());
    p.a.send(10, b"after".to_vec());
    p.run_until(|p| p.b.got.len() == 2 || p.b.closed.is_some());
    assert_eq!(p.b.closed, None);
    assert_eq!(p.b.got[0].tag, 9);
    assert_eq!(p.b.got[0].data, big, "every byte of 13 READ chunks");
    assert_eq!(
        p.b.got[1].data, b"after",
        "and the small one after it, in order"
    );
    // The Done frame releases the offer: window revoked, registration and budget back.
    p.run_until(|p| p.a.core.rendezvous_out.is_empty());
    assert_eq!(p.a.core.budget_out.in_use(), 0);
    assert_eq!(p.b.core.budget_in.in_use(), 0);
}

#[test]
fn a_frame_of_an_unknown_kind_closes_the_connection_with_a_protocol_reason() {
    let mut p = pair();
    let mut frame = [0u8; 16];
    Header {
        kind: FrameKind::Data,
        credits: 0,
        len: 0,
        tag: 1,
    }
    .encode(&mut frame);
    frame[1] = 0x7f;
    p.a.send_raw(&frame);
    p.run_until(|p| p.b.closed.is_some());
    let reason = p.b.closed.clone().unwrap();
    assert!(matches!(reason, CloseReason::Protocol(_)), "{reason}");
}

#[test]
fn a_peer_granting_credits_it_never_had_is_a_protocol_error() {
    let mut p = pair();
    let mut frame = [0u8; 16];
    Header {
        kind: FrameKind::Credit,
        credits: 1000,
        len: 0,
        tag: 0,
    }
    .encode(&mut frame);
    p.a.send_raw(&frame);
    p.run_until(|p| p.b.closed.is_some());
    let reason = p.b.closed.clone().unwrap();
    assert!(matches!(reason, CloseReason::Protocol(_)), "{reason}");
}

#[test]
fn the_close_frame_tells_the_peer_why() {
    let mut p = pair();
    let why = CloseReason::Local("maintenance".into());
    p.a.core.closing = Some(why.clone());
    assert!(
        p.a.core.post_goodbye(&why),
        "a framed connection with credits says why"
    );
    p.run_until(|p| p.b.closed.is_some());
    match p.b.closed.clone().unwrap() {
        CloseReason::PeerClosed(text) => assert!(text.contains("maintenance"), "{text}"),
        other => panic!("expected the peer's reason, got {other}"),
    }
    // The frame's completion says the peer has it: the QP may go now.
    p.run_until(|p| p.a.core.goodbye == Goodbye::Delivered);
}

#[test]
fn a_silent_peer_is_probed_and_a_vanished_one_declared_unreachable() {
    let config = ConnectionConfig {
        keepalive: Some(Duration::from_millis(50)),
        ..config()
    };
    let mut p = pair_with(config);
    // The deadline the driver arms its one timer for is the keepalive check.
    let first = p.a.core.poll_timeout().expect("keepalive is timed");
    // Silent for a whole period: a probe, which a live peer acknowledges.
    assert_eq!(p.a.core.handle_timeout(first), Ok(Timeout::Checked));
    assert!(p.a.core.liveness.probing());
    p.a.core.pump().unwrap();
    p.run_until(|p| !p.a.core.liveness.probing());
    assert_eq!(p.a.closed, None);
    // The peer's host dies. The probe's own completion was heard, so the next check
    // finds the connection busy; the one after finds it silent and probes again, and
    // that probe goes unanswered and fails.
    p.b.device.vanish();
    for _ in 0..2 {
        let next = p.a.core.poll_timeout().unwrap();
        assert_eq!(p.a.core.handle_timeout(next), Ok(Timeout::Checked));
    }
    assert!(p.a.core.liveness.probing());
    p.a.core.pump().unwrap();
    p.run_until(|p| p.a.closed.is_some());
    let reason = p.a.closed.clone().unwrap();
    assert!(
        matches!(reason, CloseReason::PeerUnreachable(_)),
        "{reason}"
    );
}
