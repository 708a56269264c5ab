//! Frames a hostile client writes by hand to hurt the server, not merely to break the
//! protocol: each ends its own connection with a reason naming what was wrong, while a
//! well-behaved client on the same server keeps being answered and every resource comes
//! back.

use std::time::Duration;

use rdmactor::proto::frame::{FrameKind, Header, RendezvousOffer, HEADER_LEN, OFFER_LEN};
use rdmactor::runtime::{
    Client, Incoming, NodeConfig, PeerInfo, ReceiveConfig, Service, Session, SessionCx,
    SessionError,
};
use rdmactor::verbs::{Access, MemoryRegion, ProtectionDomain};
use rdmactor_tests::framed::{framed_connect, framed_peer_sends, mirror_server, off_thread};
use rdmactor_tests::{
    actix_run, assert_released, close_all, first_close_reason, flood_sends, pattern, rdma_context,
    resource_counts,
};

/// Issue 26 (7): an offer of 1 MiB at `u64::MAX - 10`. The server READs an offer in
/// chunks at `addr + offset`, which overflowed: a panic on the poller thread (an abort)
/// in a build with overflow checks, a READ at a wrapped address in one without. The
/// offer is now refused as it arrives.
#[test]
fn a_rendezvous_offer_that_wraps_the_address_space_ends_only_its_connection() {
    let Some(ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let (server, addr, reasons) = mirror_server();
        let client = Client::start(NodeConfig::default()).expect("client");
        let steady = client.connect(addr, "mirror").await.expect("steady");
        let ping = pattern(3000, 1);
        assert_eq!(steady.request(ping.clone()).await.expect("before"), ping);

        let (ctx, seen) = (ctx.clone(), reasons.clone());
        off_thread(move || {
            framed_peer_sends(
                &ctx,
                addr,
                HEADER_LEN + OFFER_LEN,
                1,
                |_, b| {
                    Header {
                        kind: FrameKind::RendezvousOffer,
                        credits: 0,
                        len: 1 << 20,
                        tag: 9,
                    }
                    .encode(&mut b[..HEADER_LEN]);
                    RendezvousOffer {
                        addr: u64::MAX - 10,
                        rkey: 0x1234,
                        key: 1,
                    }
                    .encode(&mut b[HEADER_LEN..HEADER_LEN + OFFER_LEN]);
                },
                || !seen.lock().unwrap().is_empty(),
            );
        })
        .await;
        let got = first_close_reason(&reasons, Duration::from_secs(30)).await;
        assert!(
            got.contains("protocol violation") && got.contains("wraps around"),
            "{got:?}"
        );
        for i in 0..20u64 {
            let data = pattern(100 + i as usize * 500, i);
            assert_eq!(steady.request(data.clone()).await.expect("after"), data);
        }
        close_all(&server, client, vec![steady]).await;
        server.shutdown().await;
    });
    assert_released(&base);
}

/// Issue 26 (2): a member of a shared receive queue sends a `Close` frame with a burst
/// of frames right behind it, then vanishes. The server closed it in the middle of the
/// completion batch and dropped the rest of the batch, and the completions still in the
/// CQ: their shared buffers were never posted again. A few such clients emptied the
/// queue, and every other member's SENDs met RNR for ever. Every buffer now comes back
/// (`ServerStats::shared_receives_posted`, counted, returns to the queue's depth).
#[test]
fn a_member_closing_in_the_middle_of_a_burst_gives_back_every_shared_receive() {
    let Some(ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        // One small queue, so that a leak of a few buffers a round would empty it.
        let shared = rdmactor::runtime::SharedRecvConfig {
            share: 4,
            max_credits: 8,
            members: 4,
            reserve: 8,
            reserve_per_peer: None,
            keep_empty: 1,
        };
        let depth = shared.depth() as usize;
        let (service, reasons) = rdmactor_tests::Recorded::new(StallingMirror);
        let server = rdmactor::runtime::Server::builder()
            .config(NodeConfig {
                receives: ReceiveConfig {
                    shared: Some(shared),
                    ..ReceiveConfig::default()
                },
                ..NodeConfig::default()
            })
            .listen(rdmactor_tests::test_addr(), None)
            .service("mirror", service)
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");
        let steady = client.connect(addr, "mirror").await.expect("steady");
        let ping = pattern(2000, 3);
        assert_eq!(steady.request(ping.clone()).await.expect("before"), ping);
        assert_eq!(server.stats().await.shared_receives_posted, vec![depth]);

        let rounds = 6;
        for round in 0..rounds {
            let ctx = ctx.clone();
            let (ready_tx, ready) = std::sync::mpsc::channel();
            let (go, go_rx) = std::sync::mpsc::channel::<()>();
            let hostile = std::thread::spawn(move || {
                let pd = ProtectionDomain::new(&ctx).unwrap();
                let (ep, _depth, _recv) = framed_connect(&pd, addr);
                let mut out = MemoryRegion::register(&pd, 4096, Access::NONE).unwrap();
                ready_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                let why = b"bye";
                // One burst, then the QP is gone: Close and 15 frames behind it.
                flood_sends(
                    &ep,
                    &mut out,
                    HEADER_LEN + 64,
                    16,
                    16,
                    |i, b| {
                        let kind = if i == 0 {
                            FrameKind::Close
                        } else {
                            FrameKind::Data
                        };
                        Header {
                            kind,
                            credits: 0,
                            len: 64,
                            tag: 0,
                        }
                        .encode(&mut b[..HEADER_LEN]);
                        b[HEADER_LEN..HEADER_LEN + why.len()].copy_from_slice(why);
                    },
                    || false,
                );
            });
            while ready.try_recv().is_err() {
                actix_rt::time::sleep(Duration::from_millis(5)).await;
            }
            // The steady client's frame holds the poller thread they share for 50 ms:
            // the burst lands meanwhile and reaches its connection in one batch.
            steady.send(vec![STALL; 64]).await.expect("stall");
            go.send(()).unwrap();
            while !hostile.is_finished() {
                actix_rt::time::sleep(Duration::from_millis(10)).await;
            }
            hostile.join().expect("hostile client");
            println!(
                "round {round}: posted {:?} of {depth}",
                server.stats().await.shared_receives_posted
            );
        }
        rdmactor_tests::eventually(
            "every shared receive to be posted again",
            Duration::from_secs(30),
            || async { server.stats().await.shared_receives_posted == vec![depth] },
        )
        .await;
        rdmactor_tests::eventually(
            "each burst's connection to be closed",
            Duration::from_secs(30),
            || async { reasons.lock().unwrap().len() >= rounds },
        )
        .await;
        println!("closed: {:?}", reasons.lock().unwrap());
        // The queue still serves its members: the steady client's frames find receives.
        for i in 0..30u64 {
            let data = pattern(64 + i as usize * 100, i);
            let answer =
                tokio::time::timeout(Duration::from_secs(10), steady.request(data.clone()))
                    .await
                    .expect("the steady client is answered (its SENDs find receives)")
                    .expect("after");
            assert_eq!(answer, data);
        }
        close_all(&server, client, vec![steady]).await;
        server.shutdown().await;
    });
    assert_released(&base);
}

/// A frame starting with this byte holds the poller thread for a moment (see
/// [`StallingMirror`]).
const STALL: u8 = 0xAA;

/// Answers every message with its bytes, after 50 ms when it starts with [`STALL`]: the
/// frames behind it then wait in the CQ and reach the connection in one batch.
struct StallingMirror;

impl Service for StallingMirror {
    fn session(&self, _peer: &PeerInfo) -> Box<dyn Session> {
        Box::new(StallingSession)
    }
}

struct StallingSession;

impl Session for StallingSession {
    fn on_message(&mut self, cx: &mut SessionCx<'_>, msg: Incoming) -> Result<(), SessionError> {
        if msg.data.first() == Some(&STALL) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let data = msg.data.clone();
        cx.reply(&msg, data)
    }
}
