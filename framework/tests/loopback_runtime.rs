//! The whole runtime (CM actor, admission, pollers, connection actors, client) over the
//! loopback transport: no RDMA device, no VM. What only real verbs show stays in
//! `tests/` (the VM suite).

use std::net::SocketAddr;
use std::time::Duration;

use rdmactor::prelude::*;
use rdmactor::proto::hello::RejectCode;
use rdmactor::runtime::{CloseReason, ConnectError, NodeConfig, RequestError};
use rdmactor::transport::loopback::{Fabric, Loopback};

/// Answers every request with its bytes reversed, and closes the connection on "bye".
struct Reverse;

struct ReverseSession;

impl Service<Loopback> for Reverse {
    fn session(&self, _peer: &PeerInfo) -> Box<dyn Session<Loopback>> {
        Box::new(ReverseSession)
    }
}

impl Session<Loopback> for ReverseSession {
    fn on_message(
        &mut self,
        cx: &mut SessionCx<'_, Loopback>,
        msg: Incoming,
    ) -> Result<(), SessionError> {
        if msg.data == b"bye" {
            return Err(SessionError::new("the client said bye"));
        }
        let mut out = msg.data.clone();
        out.reverse();
        cx.reply(&msg, out)
    }
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 1], port))
}

/// Runs `f` in an actix System with a fabric of its own.
fn with_system<F: std::future::Future<Output = ()>>(f: impl FnOnce(Fabric) -> F) {
    actix::System::new().block_on(f(Fabric::default()));
}

#[test]
fn requests_round_trip_through_the_whole_runtime_over_loopback() {
    with_system(|fabric| async move {
        let server = Server::over(Loopback)
            .domain(fabric.device("server"))
            .listen(addr(0), None)
            .service("reverse", Reverse)
            .start()
            .expect("server starts over loopback");
        let at = server.local_addrs()[0];
        assert_ne!(at.port(), 0, "port 0 resolved to a real port");
        let client =
            Client::<Loopback>::on(fabric.device("client"), NodeConfig::default()).unwrap();
        let conn = client.connect(at, "reverse").await.expect("connects");
        for n in [1usize, 64, 4096, 100_000] {
            let data: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
            let got = conn.request(data.clone()).await.expect("answered");
            let mut want = data;
            want.reverse();
            assert_eq!(got, want, "{n} bytes reversed");
        }
        let stats = server.stats().await;
        assert_eq!((stats.connections, stats.accepted), (1, 1));
        conn.close().await;
        client.shutdown().await;
        tokio::time::timeout(Duration::from_secs(5), async {
            while server.stats().await.connections != 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the server released the connection");
        let stats = server.stats().await;
        // Every lease back but the idle shared receive queue's, kept for the next
        // connections (`SharedRecvConfig::keep_empty`).
        assert_eq!(
            stats.pool.leased.iter().sum::<usize>(),
            stats.shared_recv_buffers,
            "{stats:?}"
        );
        assert_eq!(stats.shared_receives_posted, [stats.shared_recv_buffers]);
        server.shutdown().await;
    });
}

#[test]
fn an_unknown_service_is_rejected_with_the_reason_and_a_closing_session_ends_its_connection() {
    with_system(|fabric| async move {
        let server = Server::over(Loopback)
            .domain(fabric.device("server"))
            .listen(addr(7000), None)
            .service("reverse", Reverse)
            .start()
            .unwrap();
        let client =
            Client::<Loopback>::on(fabric.device("client"), NodeConfig::default()).unwrap();
        match client.connect(addr(7000), "nope").await {
            Err(ConnectError::Rejected(r)) => assert_eq!(r.code, RejectCode::UnknownService),
            other => panic!("expected a rejection, got {other:?}"),
        }
        match client.connect(addr(7001), "reverse").await {
            Err(ConnectError::RejectedByTransport(_)) => {}
            other => panic!("nobody listens on 7001, got {other:?}"),
        }
        let bye = client.connect(addr(7000), "reverse").await.unwrap();
        let other = client.connect(addr(7000), "reverse").await.unwrap();
        match bye.request(b"bye".to_vec()).await {
            Err(RequestError::Closed(reason)) => {
                assert!(reason.to_string().contains("bye"), "{reason}")
            }
            got => panic!("expected the close, got {got:?}"),
        }
        assert_eq!(other.request(b"abc".to_vec()).await.unwrap(), b"cba");
        assert_eq!(server.stats().await.rejected, 1);
        client.shutdown().await;
        server.shutdown().await;
    });
}

/// Reverses like [`Reverse`], and panics on "boom": a service with a bug.
struct Panicky;

impl Service<Loopback> for Panicky {
    fn session(&self, _peer: &PeerInfo) -> Box<dyn Session<Loopback>> {
        Box::new(PanickySession)
    }
}

struct PanickySession;

impl Session<Loopback> for PanickySession {
    fn on_message(
        &mut self,
        cx: &mut SessionCx<'_, Loopback>,
        msg: Incoming,
    ) -> Result<(), SessionError> {
        assert!(msg.data != b"boom", "the session's bug");
        cx.reply(&msg, msg.data.clone())
    }
}

#[test]
fn a_full_server_refuses_with_server_full_and_a_panicking_session_ends_only_its_connection() {
    with_system(|fabric| async move {
        let server = Server::over(Loopback)
            .domain(fabric.device("server"))
            .listen(addr(7100), None)
            .service("panicky", Panicky)
            .max_connections(2)
            .max_connections_per_peer(0)
            .start()
            .unwrap();
        let client =
            Client::<Loopback>::on(fabric.device("client"), NodeConfig::default()).unwrap();
        let first = client.connect(addr(7100), "panicky").await.unwrap();
        let second = client.connect(addr(7100), "panicky").await.unwrap();
        match client.connect(addr(7100), "panicky").await {
            Err(ConnectError::Rejected(r)) => assert_eq!(r.code, RejectCode::ServerFull),
            other => panic!("a third connection over the limit of 2: {other:?}"),
        }
        match first.request(b"boom".to_vec()).await {
            Err(RequestError::Closed(reason)) => assert!(
                matches!(reason, CloseReason::PeerClosed(ref why) if why.contains("panicked")),
                "{reason:?}"
            ),
            got => panic!("expected the close, got {got:?}"),
        }
        assert_eq!(
            second.request(b"still here".to_vec()).await.unwrap(),
            b"still here"
        );
        // The panicked connection's slot is given back once it is released.
        let third = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match client.connect(addr(7100), "panicky").await {
                    Ok(conn) => return conn,
                    Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
        })
        .await
        .expect("the slot comes back");
        assert_eq!(third.request(b"x".to_vec()).await.unwrap(), b"x");
        client.shutdown().await;
        server.shutdown().await;
    });
}

#[test]
fn a_client_host_that_vanishes_is_found_by_keepalive_and_its_slot_freed() {
    with_system(|fabric| async move {
        let mut config = NodeConfig::default();
        config.connection.keepalive = Some(Duration::from_millis(100));
        config.connection.ack_timeout = 12; // 16.8 ms
        config.connection.retry_count = 2;
        let bound = config.connection.dead_peer_bound().unwrap();
        let server = Server::over(Loopback)
            .domain(fabric.device("server"))
            .config(config.clone())
            .listen(addr(7200), None)
            .service("reverse", Reverse)
            .start()
            .unwrap();
        let gone = fabric.device("doomed");
        let client = Client::<Loopback>::on(gone.clone(), config.clone()).unwrap();
        let conn = client.connect(addr(7200), "reverse").await.unwrap();
        assert_eq!(conn.request(b"ab".to_vec()).await.unwrap(), b"ba");
        let other = Client::<Loopback>::on(fabric.device("other"), config).unwrap();
        let kept = other.connect(addr(7200), "reverse").await.unwrap();
        gone.vanish();
        let cut = std::time::Instant::now();
        tokio::time::timeout(bound * 3, async {
            while server.stats().await.connections != 1 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the vanished client's connection still open after {:?}",
                bound * 3
            )
        });
        let found = cut.elapsed();
        assert!(found <= bound * 2, "found after {found:?}, bound {bound:?}");
        assert_eq!(kept.request(b"xy".to_vec()).await.unwrap(), b"yx");
        other.shutdown().await;
        server.shutdown().await;
        drop(conn);
        drop(client);
    });
}

/// Waits until `conn` knows why it closed.
async fn closed_why<T: rdmactor::transport::Transport>(
    conn: &rdmactor::runtime::ClientConnection<T>,
) -> CloseReason {
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if let Some(reason) = conn.close_reason() {
                return reason;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the connection closed")
}

#[test]
fn every_goodbye_reaches_the_peer_with_the_servers_reason() {
    with_system(|fabric| async move {
        let mut config = NodeConfig::default();
        config.connection.idle_timeout = Some(Duration::from_millis(300));
        let server = Server::over(Loopback)
            .domain(fabric.device("server"))
            .config(config)
            .listen(addr(7500), None)
            .service("reverse", Reverse)
            .start()
            .unwrap();
        let client =
            Client::<Loopback>::on(fabric.device("client"), NodeConfig::default()).unwrap();
        let silent = client.connect(addr(7500), "reverse").await.unwrap();
        let busy = client.connect(addr(7500), "reverse").await.unwrap();
        // The busy neighbour is served throughout while the silent one is let go.
        let started = std::time::Instant::now();
        while silent.close_reason().is_none() {
            assert_eq!(busy.request(b"ab".to_vec()).await.unwrap(), b"ba");
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "never idled out"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        match closed_why(&silent).await {
            CloseReason::PeerClosed(why) => assert!(why.starts_with("idle"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(busy.request(b"xyz".to_vec()).await.unwrap(), b"zyx");
        // A server shutting down says so to every client.
        server.shutdown().await;
        match closed_why(&busy).await {
            CloseReason::PeerClosed(why) => assert_eq!(why, "shutting down"),
            other => panic!("{other:?}"),
        }
        client.shutdown().await;
    });
}

#[test]
fn a_close_frame_overtaken_by_the_disconnect_still_names_the_close() {
    with_system(|fabric| async move {
        let mut config = NodeConfig::default();
        config.connection.idle_timeout = Some(Duration::from_millis(200));
        let server = Server::over(Loopback)
            .domain(fabric.device("server"))
            .config(config)
            .listen(addr(7501), None)
            .service("reverse", Reverse)
            .start()
            .unwrap();
        // The client's completions lag its CM events by more than the server waits for
        // a goodbye to be read (3 s): the server's Close frame sits unseen in the CQ when
        // its DISCONNECTED arrives, as on a busy host.
        let device = fabric.device("client");
        device.delay_completions(Duration::from_secs(4));
        let client = Client::<Loopback>::on(device, NodeConfig::default()).unwrap();
        let conn = client.connect(addr(7501), "reverse").await.unwrap();
        let why = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                if let Some(reason) = conn.close_reason() {
                    return reason;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the idle connection closed");
        match why {
            CloseReason::PeerClosed(why) => assert!(why.starts_with("idle"), "{why}"),
            other => panic!("the server's reason was lost to its disconnect: {other:?}"),
        }
        client.shutdown().await;
        server.shutdown().await;
    });
}

/// Answers every request with `len` bytes of 7: replies sent by rendezvous, each
/// registered out of the pool until the client has READ it.
struct Big {
    len: usize,
}

impl Service<Loopback> for Big {
    fn session(&self, _peer: &PeerInfo) -> Box<dyn Session<Loopback>> {
        Box::new(BigSession(self.len))
    }
}

struct BigSession(usize);

impl Session<Loopback> for BigSession {
    fn on_message(
        &mut self,
        cx: &mut SessionCx<'_, Loopback>,
        msg: Incoming,
    ) -> Result<(), SessionError> {
        cx.reply(&msg, vec![7; self.0])
    }
}

#[test]
fn replies_beyond_the_pools_cap_wait_their_turn_and_every_charge_comes_back() {
    with_system(|fabric| async move {
        const REPLY: usize = 7 << 20;
        let mut config = NodeConfig::default();
        // Room for one 7 MiB reply at a time beyond the receive buffers: four clients
        // asking at once make three wait.
        config.pool.max_bytes = config.pool.reserved_smallest + (12 << 20);
        let cap = config.pool.max_bytes;
        let server = Server::over(Loopback)
            .domain(fabric.device("server"))
            .config(config)
            .listen(addr(7600), None)
            .service("big", Big { len: REPLY })
            .start()
            .unwrap();
        let client =
            Client::<Loopback>::on(fabric.device("client"), NodeConfig::default()).unwrap();
        let mut conns = Vec::new();
        for _ in 0..4 {
            conns.push(client.connect(addr(7600), "big").await.unwrap());
        }
        for round in 0..3 {
            let asks: Vec<_> = conns
                .iter()
                .enumerate()
                .map(|(c, conn)| {
                    let conn = conn.clone();
                    actix::spawn(async move {
                        let reply = conn
                            .request(vec![c as u8; 64])
                            .await
                            .unwrap_or_else(|e| panic!("client {c} round {round}: {e}"));
                        assert_eq!(reply.len(), REPLY, "client {c}");
                        assert!(reply.iter().all(|&b| b == 7), "client {c}: bytes differ");
                    })
                })
                .collect();
            for ask in asks {
                ask.await.expect("a client's request");
            }
        }
        let stats = server.stats().await;
        assert!(stats.pool.waits >= 1, "no reply waited: {stats:?}");
        assert!(stats.pool.peak_bytes <= cap, "{stats:?}");
        assert_eq!(stats.connections, 4, "{stats:?}");
        for conn in conns {
            conn.close().await;
        }
        tokio::time::timeout(Duration::from_secs(5), async {
            while server.stats().await.pool.charged_bytes != 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("every charge back");
        client.shutdown().await;
        server.shutdown().await;
    });
}

/// A host that takes connect requests and never answers them: a raw listener that
/// nobody serves, as a dead host's requests wait (rdma_cm resends them for a minute).
/// Its events, its listener (kept listening), and the first request, once it arrived
/// while `client`'s connect to `at` was still waiting: the connect is then dropped, as a
/// caller's timeout drops it.
async fn given_up_while_unanswered(
    fabric: &Fabric,
    client: &Client<Loopback>,
    at: SocketAddr,
) -> (
    rdmactor::transport::loopback::Device,
    rdmactor::transport::loopback::EventChannel,
    rdmactor::transport::loopback::CmId,
    rdmactor::transport::loopback::CmId,
) {
    let silent = fabric.device("silent");
    let events = silent.create_event_channel().unwrap();
    let listener = silent.create_id(&events).unwrap();
    listener.bind(at).unwrap();
    listener.listen(16).unwrap();
    let request = async {
        loop {
            if let Some(ev) = events.try_next() {
                return ev;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let mut ev = tokio::select! {
        done = client.connect(at, "reverse") => panic!("nothing answers, yet: {:?}", done.err()),
        ev = request => ev,
    };
    assert_eq!(ev.kind, rdmactor::verbs::CmEventKind::ConnectRequest);
    let passive = ev.take_request().expect("a connect request");
    (silent, events, listener, passive)
}

/// Waits until `client` holds no connection (or fails after 10 s, naming `what`).
async fn until_released(client: &Client<Loopback>, what: &str) {
    let released = tokio::time::timeout(Duration::from_secs(10), async {
        while client.stats().await.connections != 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    if released.is_err() {
        panic!("{what}: the client still holds {:?}", client.stats().await);
    }
}

fn answer(
    silent: &rdmactor::transport::loopback::Device,
    passive: &rdmactor::transport::loopback::CmId,
) -> Result<(), String> {
    let cq = silent.create_cq(16, None).unwrap();
    let caps = rdmactor::verbs::QpCaps::default();
    passive.create_qp(silent, &cq, &cq, caps, None).unwrap();
    passive
        .accept(&rdmactor::verbs::ConnParam::default())
        .map_err(|e| e.to_string())
}

#[test]
fn a_connect_its_caller_gives_up_releases_its_cm_id_and_qp() {
    with_system(|fabric| async move {
        let client =
            Client::<Loopback>::on(fabric.device("client"), NodeConfig::default()).unwrap();
        let (silent, _events, _listener, passive) =
            given_up_while_unanswered(&fabric, &client, addr(7300)).await;
        // Without an end of its own, the connect would hold its QP until the host
        // answered: here, never.
        until_released(&client, "a connect given up").await;
        // And its cm_id is gone: the host's late accept finds no one to answer.
        let late = answer(&silent, &passive);
        assert!(
            late.as_ref()
                .is_err_and(|e| e.contains("requester is gone")),
            "{late:?}"
        );
        client.shutdown().await;
    });
}

#[test]
fn a_connect_given_up_just_before_its_answer_opens_no_connection() {
    with_system(|fabric| async move {
        let client =
            Client::<Loopback>::on(fabric.device("client"), NodeConfig::default()).unwrap();
        let (silent, events, _listener, passive) =
            given_up_while_unanswered(&fabric, &client, addr(7301)).await;
        // The host answers at once, most likely before the client's CM actor ends the
        // connect: ESTABLISHED reaches a connect nobody waits for, which is closed (the
        // CM actor sees it abandoned; before that check, dropping the unclaimed
        // handle closed it already: this guards that path).
        let accepted = answer(&silent, &passive);
        until_released(&client, "a connect answered after it was given up").await;
        if accepted.is_ok() {
            let closed = tokio::time::timeout(Duration::from_secs(10), async {
                loop {
                    match events.try_next().map(|ev| ev.kind) {
                        Some(rdmactor::verbs::CmEventKind::Disconnected) => return,
                        _ => tokio::time::sleep(Duration::from_millis(5)).await,
                    }
                }
            })
            .await;
            assert!(
                closed.is_ok(),
                "the host was never told the connection closed"
            );
        }
        client.shutdown().await;
    });
}
