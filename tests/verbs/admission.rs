//! Admission: unknown services and connections beyond the limit are rejected with a
//! reason the client sees, while admitted clients keep being served.

use std::sync::atomic::Ordering;
use std::time::Duration;

use rdmactor::proto::hello::RejectCode;
use rdmactor::runtime::{
    Client, ClientConnection, ConnectError, ConnectionConfig, NodeConfig, ReceiveConfig,
    ReserveStats, Server, SharedRecvConfig,
};
use rdmactor_services::echo::Echo;
use rdmactor_tests::{
    actix_run, assert_released, echo_ok, rdma_context, resource_counts, second_peer_ip, test_addr,
};

fn rejected_with(err: ConnectError, code: RejectCode) -> String {
    match err {
        ConnectError::Rejected(r) if r.code == code => r.message,
        other => panic!("expected a {code:?} reject, got {other}"),
    }
}

#[test]
fn unknown_service_and_full_server_are_rejected_with_reasons() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let server = Server::builder()
            .listen(test_addr(), None)
            .service("echo", Echo)
            .max_connections(2)
            // Every client of this test shares one address.
            .max_connections_per_peer(0)
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");

        let first = client.connect(addr, "echo").await.expect("first");
        let msg = rejected_with(
            client.connect(addr, "no-such").await.unwrap_err(),
            RejectCode::UnknownService,
        );
        assert!(msg.contains("no-such"), "{msg}");
        echo_ok(&first, b"still served".to_vec()).await;

        let second = client.connect(addr, "echo").await.expect("second");
        let msg = rejected_with(
            client.connect(addr, "echo").await.unwrap_err(),
            RejectCode::ServerFull,
        );
        assert!(msg.contains("limit of 2"), "{msg}");
        echo_ok(&first, b"still served".to_vec()).await;
        echo_ok(&second, b"still served".to_vec()).await;

        // A freed slot admits the next client.
        second.close().await;
        rdmactor_tests::eventually(
            "the slot to free",
            std::time::Duration::from_secs(10),
            || async { server.stats().await.connections == 1 },
        )
        .await;
        let third = client
            .connect(addr, "echo")
            .await
            .expect("third after a close");
        echo_ok(&third, b"still served".to_vec()).await;

        let stats = server.stats().await;
        assert_eq!((stats.accepted, stats.rejected), (3, 2));
        client.shutdown().await;
        server.shutdown().await;
    });
    assert_released(&base);
}

#[test]
fn a_client_that_sends_nothing_is_closed_by_the_idle_timeout() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let (service, reasons) = rdmactor_tests::Recorded::new(Echo);
        let server = Server::builder()
            .config(NodeConfig {
                connection: ConnectionConfig {
                    idle_timeout: Some(std::time::Duration::from_secs(2)),
                    ..ConnectionConfig::default()
                },
                ..NodeConfig::default()
            })
            .listen(test_addr(), None)
            .service("echo", service)
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");
        let silent = client.connect(addr, "echo").await.expect("silent");
        let busy = client.connect(addr, "echo").await.expect("busy");
        // The busy one echoes every 300 ms for 4 s: never idle for 2 s.
        for i in 0..13u8 {
            echo_ok(&busy, vec![i; 64]).await;
            actix_rt::time::sleep(std::time::Duration::from_millis(300)).await;
        }
        let got =
            rdmactor_tests::first_close_reason(&reasons, std::time::Duration::from_secs(5)).await;
        assert!(got.contains("idle: no message for 2s"), "{got}");
        assert_eq!(
            reasons.lock().unwrap().len(),
            1,
            "only the silent one closed"
        );
        assert_eq!(server.stats().await.connections, 1);
        echo_ok(&busy, b"still served".to_vec()).await;
        drop(silent);
        busy.close().await;
        client.shutdown().await;
        server.shutdown().await;
    });
    assert_released(&base);
}

/// Issue 26 (5): on its defaults the server had no per-peer limit and no idle timeout,
/// so one live client that opened `max_connections` connections and said nothing held
/// every slot for ever, and every other host was refused with `ServerFull`. Now one
/// address gets at most its per-peer limit (64 by default, 4 here): its next connect is
/// refused with a reason naming the per-peer limit, another host still gets in and is
/// served, and the silent connections go at the idle limit, after which the first host
/// gets in again.
#[test]
fn one_silent_host_cannot_take_every_slot() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let (service, reasons) = rdmactor_tests::Recorded::new(Echo);
        let idle = std::time::Duration::from_secs(3);
        // max_connections 8 and 4 per address (the default, 64, is past max_connections).
        let server = Server::builder()
            .config(NodeConfig {
                connection: ConnectionConfig {
                    idle_timeout: Some(idle),
                    ..ConnectionConfig::default()
                },
                ..NodeConfig::default()
            })
            .listen(test_addr(), None)
            .service("echo", service)
            .max_connections(8)
            .max_connections_per_peer(4)
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");
        let here = test_addr().ip();
        let mut silent = Vec::new();
        for i in 0..4 {
            let conn = client
                .connect_from(here, addr, "echo")
                .await
                .unwrap_or_else(|e| panic!("silent connection {i}: {e}"));
            silent.push(conn);
        }
        let msg = rejected_with(
            client.connect_from(here, addr, "echo").await.unwrap_err(),
            RejectCode::ServerFull,
        );
        assert!(msg.contains("per-peer connection limit of 4"), "{msg}");
        assert!(msg.contains(&here.to_string()), "{msg}");

        // Another host is admitted and served while the first holds its four.
        let other = client
            .connect_from(rdmactor_tests::second_peer_ip(), addr, "echo")
            .await
            .expect("a second host gets a slot");
        for i in 0..6u8 {
            echo_ok(&other, vec![i; 100 * (i as usize + 1)]).await;
            actix_rt::time::sleep(std::time::Duration::from_millis(400)).await;
        }
        assert_eq!(server.stats().await.connections, 5);

        // The silent four go at the idle limit; the busy one stays.
        rdmactor_tests::eventually(
            "the silent connections to reach the idle limit",
            std::time::Duration::from_secs(20),
            || async { reasons.lock().unwrap().len() >= 4 },
        )
        .await;
        for why in reasons.lock().unwrap().iter() {
            assert!(why.contains("idle: no message for 3s"), "{why}");
        }
        echo_ok(&other, b"still served".to_vec()).await;
        let again = client
            .connect_from(here, addr, "echo")
            .await
            .expect("the first host gets in again once its slots are free");
        echo_ok(&again, b"back".to_vec()).await;
        let stats = server.stats().await;
        assert_eq!((stats.accepted, stats.rejected), (6, 1));
        drop(silent);
        other.close().await;
        again.close().await;
        client.shutdown().await;
        server.shutdown().await;
    });
    assert_released(&base);
}

/// Floods each connection with `n` one-way messages at once; all of them must go.
async fn flood(conns: &[ClientConnection], n: usize) {
    let sends = conns
        .iter()
        .map(|c| c.send_all((0..n).map(|i| vec![i as u8; 64]).collect()));
    for (i, sent) in futures::future::join_all(sends)
        .await
        .into_iter()
        .enumerate()
    {
        sent.unwrap_or_else(|e| panic!("flood on connection {i}: {e}"));
    }
}

/// One queue of 16 members with a reserve of 32 credits, `cap` of them per peer
/// address. Host A floods six connections; then host B floods two while A floods
/// again. Returns the reserve's stats after each phase.
async fn flood_from_two_hosts(cap: Option<u32>) -> (ReserveStats, ReserveStats, ReserveStats) {
    let shared = SharedRecvConfig {
        members: 16,
        reserve: 32,
        reserve_per_peer: cap,
        ..SharedRecvConfig::default()
    };
    // A little slower than a client sends, so every sender runs low on credits and
    // borrows from its queue's reserve.
    let (sink, got) = rdmactor_tests::SlowSink::new(Duration::from_micros(200));
    let server = Server::builder()
        .config(NodeConfig {
            receives: ReceiveConfig {
                shared: Some(shared),
                ..ReceiveConfig::default()
            },
            ..NodeConfig::default()
        })
        .listen(test_addr(), None)
        .service("sink", sink)
        .max_connections_per_peer(0)
        .start()
        .expect("server");
    let addr = server.local_addrs()[0];
    let client = Client::start(NodeConfig::default()).expect("client");
    let mut a = Vec::new();
    for _ in 0..6 {
        a.push(
            client
                .connect_from(test_addr().ip(), addr, "sink")
                .await
                .expect("host a"),
        );
    }
    let mut b = Vec::new();
    for _ in 0..2 {
        b.push(
            client
                .connect_from(second_peer_ip(), addr, "sink")
                .await
                .expect("host b"),
        );
    }
    let per_conn = 500;
    flood(&a, per_conn).await;
    rdmactor_tests::eventually(
        "host a's messages to arrive",
        Duration::from_secs(60),
        || async { got.load(Ordering::Relaxed) == 6 * per_conn },
    )
    .await;
    let stats = server.stats().await;
    assert_eq!(stats.shared_queues, vec![8], "one queue holds all eight");
    let after_a = stats.shared_reserves[0];

    let both = a.iter().chain(&b).cloned().collect::<Vec<_>>();
    flood(&both, per_conn).await;
    rdmactor_tests::eventually(
        "every message to arrive",
        Duration::from_secs(60),
        || async { got.load(Ordering::Relaxed) == 14 * per_conn },
    )
    .await;
    let after_both = server.stats().await.shared_reserves[0];
    for c in both {
        c.close().await;
    }
    rdmactor_tests::wait_idle(&server, "the sink's connections", Duration::from_secs(20)).await;
    // The queue stays (one empty queue is kept), with what came back to its reserve.
    let closed = server.stats().await.shared_reserves[0];
    client.shutdown().await;
    server.shutdown().await;
    (after_a, after_both, closed)
}

/// Issue 26 (5), the reserve: one client host that opened several connections on a
/// shared queue and flooded them all borrowed its whole credit reserve, so every other
/// host's busy connections ran on their four-credit shares. Now one address holds at
/// most its cap (half the reserve by default; 16 of 32 here), a second host borrows
/// from the rest, and everything sent arrives. The same flood without a cap takes more
/// than half of the reserve: the cap is what keeps the room.
#[test]
fn one_flooding_host_cannot_borrow_a_whole_credit_reserve() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    let (uncapped, _, _) = actix_run(flood_from_two_hosts(None));
    println!("no cap: after host a {uncapped:?}");
    // Without a cap, host a takes more than half (24 of 32 in the VM on 2026-11-26):
    // the capped assertions below fail on the old code.
    assert!(
        uncapped.most_to_one_peer > 16 && uncapped.lowest < 16,
        "six flooding connections take more than half: {uncapped:?}"
    );
    let (after_a, after_both, closed) = actix_run(flood_from_two_hosts(Some(16)));
    println!("cap 16: after host a {after_a:?}, after both {after_both:?}");
    assert_eq!(
        after_a.most_to_one_peer, 16,
        "host a borrowed up to its cap"
    );
    assert_eq!(after_a.lowest, 16, "and left the other half: {after_a:?}");
    assert!(
        after_both.lowest < 16,
        "host b borrowed from what host a left: {after_both:?}"
    );
    assert!(after_both.most_to_one_peer <= 16, "{after_both:?}");
    assert_eq!(closed.free, 32, "every lent credit came back: {closed:?}");
    assert_released(&base);
}
