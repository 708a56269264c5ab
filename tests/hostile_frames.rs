//! Frames a hostile client writes by hand to hurt the server, not merely to break the
//! protocol: each ends its own connection with a reason naming what was wrong, while a
//! well-behaved client on the same server keeps being answered and every resource comes
//! back.

use std::time::Duration;

use rdmactor::proto::frame::{FrameKind, Header, RendezvousOffer, HEADER_LEN, OFFER_LEN};
use rdmactor::runtime::{Client, NodeConfig};
use rdmactor::verbs::{Access, MemoryRegion, ProtectionDomain};
use rdmactor_tests::framed::{framed_connect, mirror_server, off_thread};
use rdmactor_tests::{
    actix_run, assert_leases_returned, assert_released, first_close_reason, flood_sends, pattern,
    rdma_context, resource_counts, wait_idle,
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
            let pd = ProtectionDomain::new(&ctx).unwrap();
            let (ep, _depth, _recv) = framed_connect(&pd, addr);
            let mut out = MemoryRegion::register(&pd, 4096, Access::NONE).unwrap();
            flood_sends(
                &ep,
                &mut out,
                HEADER_LEN + OFFER_LEN,
                1,
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
            // Keep the QP until the server has acted on the frame.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while seen.lock().unwrap().is_empty() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
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
        steady.close().await;
        client.shutdown().await;
        wait_idle(&server, "connections to close", Duration::from_secs(30)).await;
        assert_leases_returned(&server).await;
        server.shutdown().await;
    });
    assert_released(&base);
}
