//! Peers that do not keep up their side of flow control: a plain verbs client that
//! floods raw-echo with SENDs and never posts a receive, a framed client that never
//! returns credits, one that sends beyond its credits, and one that returns more
//! credits than could exist. Each connection is closed with a reason naming what went
//! wrong, and the server's memory stays bounded while it happens.

use rdmactor::runtime::ConnectionConfig;
use std::sync::Mutex;
use std::time::Duration;

use rdmactor::blocking::{self, EndpointOptions};
use rdmactor::proto::frame::HEADER_LEN;
use rdmactor::runtime::Server;
use rdmactor::verbs::{Access, MemoryRegion, ProtectionDomain};
use rdmactor_services::echo::RawEcho;
use rdmactor_tests::framed::{
    data_frame, framed_connect, framed_peer_sends, mirror_server, off_thread,
};
use rdmactor_tests::{
    actix_run, assert_released, eventually, first_close_reason, flood_sends, rdma_context,
    resource_counts, rss_kib, test_addr, wait_idle, Recorded,
};

fn has(reasons: &Mutex<Vec<String>>, what: &str) -> bool {
    reasons.lock().unwrap().iter().any(|r| r.contains(what))
}

#[test]
fn raw_peer_that_never_receives_is_closed_and_server_memory_stays_bounded() {
    let Some(ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let (service, reasons) = Recorded::new(RawEcho::default());
        // A bound below the default (4096 sends): under Soft-RoCE the flood stalls after
        // about 1,000 to 2,000 SENDs once the server's replies sit in RNR retries (rxe
        // stops completing the client's SENDs; not understood yet), before the default
        // bound is reached.
        let config = rdmactor::runtime::NodeConfig {
            connection: ConnectionConfig {
                max_queued_sends: 512,
                ..ConnectionConfig::default()
            },
            ..Default::default()
        };
        let server = Server::builder()
            .config(config)
            .listen(test_addr(), Some("raw-echo"))
            .service("raw-echo", service)
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let before = rss_kib();
        let (ctx, seen) = (ctx.clone(), reasons.clone());
        let (sent, peak) = off_thread(move || {
            let pd = ProtectionDomain::new(&ctx).unwrap();
            let mut out = MemoryRegion::register(&pd, 4096, Access::NONE).unwrap();
            let ep =
                blocking::connect(&pd, addr, &EndpointOptions::default(), &[], |_| Ok(())).unwrap();
            // 100,000 SENDs of 4 KiB and not one receive posted: every echo meets RNR
            // (retried forever, rnr_retry_count 7), so the server's replies pile up.
            let mut peak = 0;
            let sent = flood_sends(
                &ep,
                &mut out,
                4096,
                100_000,
                32,
                |i, b| {
                    if i % 4096 == 0 {
                        peak = peak.max(rss_kib());
                    }
                    if i % 1024 == 0 && std::env::var_os("RDMACTOR_PROGRESS").is_some() {
                        eprintln!("raw flood: {i} SENDs posted, RSS {} KiB", rss_kib());
                    }
                    b[0] = i as u8;
                },
                || !seen.lock().unwrap().is_empty(),
            );
            drop(ep);
            (sent, peak.max(rss_kib()))
        })
        .await;
        let grown = peak.saturating_sub(before);
        println!("raw flood: {sent} SENDs completed, server RSS grew by {grown} KiB");
        eventually(
            "the flooding connection to close",
            Duration::from_secs(30),
            || {
                let reasons = reasons.clone();
                async move { has(&reasons, "peer not receiving") }
            },
        )
        .await;
        assert!(
            grown < 64 * 1024,
            "RSS grew by {grown} KiB while {sent} replies were refused: {:?}",
            reasons.lock().unwrap()
        );
        wait_idle(&server, "connections to close", Duration::from_secs(30)).await;
        server.shutdown().await;
    });
    assert_released(&base);
}

#[test]
fn framed_peer_sending_beyond_its_credits_is_closed_as_a_protocol_violation() {
    let Some(ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let (server, addr, reasons) = mirror_server();
        // A well-behaved client on the same shared receive queue (and so the same CQ)
        // as the violator: it must not pay for the violation.
        let client = rdmactor::runtime::Client::start(rdmactor::runtime::NodeConfig::default())
            .expect("client");
        let steady = client.connect(addr, "mirror").await.expect("steady");
        let ping = b"steady before".to_vec();
        assert_eq!(steady.request(ping.clone()).await.expect("before"), ping);
        let before = rss_kib();
        let (ctx, seen) = (ctx.clone(), reasons.clone());
        let (sent, depth, peak) = off_thread(move || {
            let pd = ProtectionDomain::new(&ctx).unwrap();
            let (ep, depth, _recv) = framed_connect(&pd, addr);
            let mut out = MemoryRegion::register(&pd, 4096, Access::NONE).unwrap();
            // Never returns a credit (header credits 0) and ignores its own: sends as
            // fast as the server reposts. The server's replies can never go out.
            let mut peak = 0;
            let sent = flood_sends(
                &ep,
                &mut out,
                1024,
                100_000,
                32,
                |i, b| {
                    if i % 4096 == 0 {
                        peak = peak.max(rss_kib());
                    }
                    data_frame(b, 0, 1024 - HEADER_LEN)
                },
                || !seen.lock().unwrap().is_empty(),
            );
            (sent, depth, peak.max(rss_kib()))
        })
        .await;
        let grown = peak.saturating_sub(before);
        println!(
            "framed flood: {sent} frames completed (server depth {depth}), RSS grew by {grown} KiB"
        );
        let got = first_close_reason(&reasons, Duration::from_secs(30)).await;
        assert!(
            got.contains("protocol violation") && got.contains("credit"),
            "{got:?}"
        );
        // Its own credits, the grants the server's replies carried (at most one share's
        // worth before the server runs out of credits) and the 32 SENDs in flight; with
        // a shared receive queue, frames beyond its credits can use the queue's other
        // receives until the server's close takes effect, so the queue's depth bounds
        // them (they are reposted at once, and the other connections' credits are still
        // backed once the violator is gone).
        let queue = rdmactor::runtime::NodeConfig::default()
            .receives
            .shared
            .map_or(depth as usize, |c| c.depth() as usize);
        assert!(
            sent <= 2 * depth as usize + queue + 32,
            "{sent} frames accepted from a peer with {depth} credits"
        );
        assert!(grown < 64 * 1024, "RSS grew by {grown} KiB");
        eventually(
            "the violator to leave its shared queue",
            Duration::from_secs(30),
            || async { server.stats().await.shared_queues == vec![1] },
        )
        .await;
        for i in 0..50u8 {
            let data = vec![i; 100 + i as usize * 30];
            assert_eq!(
                steady.request(data.clone()).await.expect("steady after"),
                data
            );
        }
        steady.close().await;
        client.shutdown().await;
        wait_idle(&server, "connections to close", Duration::from_secs(30)).await;
        server.shutdown().await;
    });
    assert_released(&base);
}

#[test]
fn framed_peer_returning_impossible_credits_is_closed_as_a_protocol_violation() {
    let Some(ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let (server, addr, reasons) = mirror_server();
        let (ctx, seen) = (ctx.clone(), reasons.clone());
        off_thread(move || {
            // One frame granting u32::MAX credits: the server never granted us a frame
            // to answer with, let alone four billion (this overflowed its counter).
            framed_peer_sends(
                &ctx,
                addr,
                HEADER_LEN + 4,
                1,
                |_, b| data_frame(b, u32::MAX, 4),
                || !seen.lock().unwrap().is_empty(),
            );
        })
        .await;
        let got = first_close_reason(&reasons, Duration::from_secs(30)).await;
        assert!(
            got.contains("protocol violation") && got.contains("credits"),
            "{got:?}"
        );
        wait_idle(&server, "connections to close", Duration::from_secs(30)).await;
        server.shutdown().await;
    });
    assert_released(&base);
}
