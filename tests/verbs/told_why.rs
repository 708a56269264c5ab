//! Issue 14, item 2: a client is told why. A message larger than the service takes is
//! refused when it is offered (the request fails naming the limit, nothing of it moves,
//! the connection goes on); a connection the server ends carries the server's reason to
//! the client (its `Close` frame), instead of a bare disconnect or a flushed request.

use std::time::Duration;

use rdmactor::proto::budget::BudgetError;
use rdmactor::runtime::{
    Client, CloseReason, ConnectionConfig, Incoming, NodeConfig, PeerInfo, RequestError, Server,
    Service, Session, SessionCx, SessionError,
};
use rdmactor_services::echo::Echo;
use rdmactor_tests::{
    actix_run, assert_leases_returned, assert_released, echo_ok, eventually, pattern, rdma_context,
    resource_counts, test_addr,
};

/// Answers every message with its own bytes, and takes messages of 64 KiB at most.
struct Small;

impl Service for Small {
    fn max_message(&self) -> Option<usize> {
        Some(64 << 10)
    }
    fn session(&self, _peer: &PeerInfo) -> Box<dyn Session> {
        Box::new(SmallSession)
    }
}

struct SmallSession;

impl Session for SmallSession {
    fn on_message(&mut self, cx: &mut SessionCx<'_>, msg: Incoming) -> Result<(), SessionError> {
        let data = msg.data.clone();
        cx.reply(&msg, data)
    }
}

/// The server's reason, as the client sees it.
fn peer_said(err: RequestError) -> String {
    match err {
        RequestError::Closed(CloseReason::PeerClosed(why)) => why,
        other => panic!("expected the server's reason, got {other}"),
    }
}

#[test]
fn a_message_over_the_services_limit_is_refused_and_the_connection_goes_on() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let server = Server::builder()
            .listen(test_addr(), None)
            .service("small", Small)
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");
        let conn = client.connect(addr, "small").await.expect("connect");

        for len in [(64 << 10) + 1, 1 << 20, 16 << 20] {
            match conn.request(pattern(len, len as u64)).await {
                Err(RequestError::Refused(BudgetError::TooLarge { len: l, max })) => {
                    assert_eq!((l, max), (len, 64 << 10));
                }
                other => panic!("{len} bytes: expected a refusal, got {other:?}"),
            }
        }
        let printed = conn
            .request(vec![0; 1 << 20])
            .await
            .unwrap_err()
            .to_string();
        assert_eq!(
            printed,
            "refused by the peer: rendezvous offer of 1048576 bytes exceeds the \
             connection's largest message of 65536"
        );
        // The same connection carries what fits, inline and by rendezvous.
        for len in [100, 60 << 10, 64 << 10] {
            let data = pattern(len, 7);
            assert_eq!(conn.request(data.clone()).await.expect("fits"), data);
        }
        let stats = server.stats().await;
        assert_eq!(stats.connections, 1, "never closed: {stats:?}");
        // The 64 KiB answer is held until the client's Done; the refusals held nothing.
        eventually(
            "the last answer's Done",
            Duration::from_secs(10),
            || async { server.stats().await.pool.charged_bytes == 0 },
        )
        .await;

        conn.close().await;
        client.shutdown().await;
        assert_leases_returned(&server).await;
        server.shutdown().await;
    });
    assert_released(&base);
}

#[test]
fn a_connection_the_server_ends_tells_the_client_why() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let server = Server::builder()
            .config(NodeConfig {
                connection: ConnectionConfig {
                    idle_timeout: Some(Duration::from_secs(1)),
                    ..ConnectionConfig::default()
                },
                ..NodeConfig::default()
            })
            .listen(test_addr(), None)
            .service("echo", Echo)
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");

        // A message the service cannot decode: the session's error, word for word.
        let garbage = client.connect(addr, "echo").await.expect("connect");
        let why = peer_said(garbage.request(vec![0xff; 9]).await.unwrap_err());
        assert!(
            why.starts_with("session error: malformed echo request"),
            "{why}"
        );

        // Silent past the idle limit, while a busy neighbour is served throughout.
        let busy = client.connect(addr, "echo").await.expect("connect");
        let silent = client.connect(addr, "echo").await.expect("connect");
        for i in 0..10u8 {
            echo_ok(&busy, vec![i; 64]).await;
            actix_rt::time::sleep(Duration::from_millis(200)).await;
        }
        eventually("the idle close", Duration::from_secs(10), || {
            let closed = silent.close_reason().is_some();
            async move { closed }
        })
        .await;
        assert_eq!(
            silent.close_reason(),
            Some(CloseReason::PeerClosed("idle: no message for 1s".into()))
        );
        let why = peer_said(silent.request(vec![1]).await.unwrap_err());
        assert_eq!(why, "idle: no message for 1s");
        echo_ok(&busy, b"still served".to_vec()).await;

        // A server shutting down says so.
        let stop = server.shutdown();
        let (_, ()) = futures::join!(
            async {
                eventually("the shutdown close", Duration::from_secs(10), || {
                    let closed = busy.close_reason().is_some();
                    async move { closed }
                })
                .await
            },
            stop
        );
        assert_eq!(
            busy.close_reason(),
            Some(CloseReason::PeerClosed("shutting down".into()))
        );
        client.shutdown().await;
    });
    assert_released(&base);
}
