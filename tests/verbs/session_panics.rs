//! A session that panics takes down its own connection only: the framework catches the
//! panic at the session boundary, closes that connection with "session panicked: ..."
//! and its poller thread keeps serving everyone else.

use std::sync::Mutex;
use std::time::Duration;

use rdmactor::runtime::{
    Client, Incoming, NodeConfig, OpId, PeerInfo, Server, Service, Session, SessionCx, SessionError,
};
use rdmactor::verbs::RemoteRegion;
use rdmactor_services::echo::Echo;
use rdmactor_tests::{
    actix_run, assert_released, echo_ok, eventually, pattern, rdma_context, resource_counts,
    test_addr, wait_idle, Recorded,
};

/// Panics where the message asks it to: in `on_message`, in `on_wake` (after waking
/// itself) or in `on_op` (after a READ that fails); with `at_start`, in
/// `on_established`. Otherwise answers with the message's bytes.
struct Fragile {
    at_start: bool,
}

impl Service for Fragile {
    fn session(&self, _peer: &PeerInfo) -> Box<dyn Session> {
        Box::new(FragileSession {
            at_start: self.at_start,
        })
    }
}

struct FragileSession {
    at_start: bool,
}

impl Session for FragileSession {
    fn on_established(&mut self, _cx: &mut SessionCx<'_>) -> Result<(), SessionError> {
        if self.at_start {
            panic!("boom in on_established");
        }
        Ok(())
    }

    fn on_message(&mut self, cx: &mut SessionCx<'_>, msg: Incoming) -> Result<(), SessionError> {
        match &msg.data[..] {
            b"panic" => panic!("boom in on_message"),
            b"wake" => {
                cx.waker().wake(1);
                Ok(())
            }
            b"op" => {
                let buf = cx.alloc(8)?;
                // rkey 0 is nobody's: the READ fails and on_op runs.
                let src = RemoteRegion {
                    addr: 0,
                    len: 8,
                    rkey: 0,
                };
                cx.post(rdmactor::runtime::Op::Read {
                    buf,
                    range: 0..8,
                    src,
                })?;
                Ok(())
            }
            _ => {
                let data = msg.data.clone();
                cx.reply(&msg, data)
            }
        }
    }

    fn on_op(
        &mut self,
        _cx: &mut SessionCx<'_>,
        _op: OpId,
        _result: rdmactor::verbs::Result<()>,
    ) -> Result<(), SessionError> {
        panic!("boom in on_op")
    }

    fn on_wake(&mut self, _cx: &mut SessionCx<'_>, _token: u64) -> Result<(), SessionError> {
        panic!("boom in on_wake")
    }
}

async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    actix_rt::time::timeout(Duration::from_secs(20), fut)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what} (is the server's poller thread dead?)"))
}

fn reasons_of(r: &Mutex<Vec<String>>) -> Vec<String> {
    r.lock().unwrap().clone()
}

#[test]
fn a_panicking_session_closes_only_its_own_connection() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let (fragile, reasons) = Recorded::new(Fragile { at_start: false });
        let (fragile_start, start_reasons) = Recorded::new(Fragile { at_start: true });
        // One poller (the default): a panic that killed it would stop every connection.
        let server = Server::builder()
            .listen(test_addr(), None)
            .service("echo", Echo)
            .service("fragile", fragile)
            .service("fragile-start", fragile_start)
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");
        let steady = client.connect(addr, "echo").await.expect("connect echo");
        within("echo before", echo_ok(&steady, pattern(100, 1))).await;

        for (i, (trigger, place)) in [
            ("panic", "on_message"),
            ("wake", "on_wake"),
            ("op", "on_op"),
        ]
        .into_iter()
        .enumerate()
        {
            let conn = client
                .connect(addr, "fragile")
                .await
                .expect("connect fragile");
            let back = within("a plain echo", conn.request(b"hello".to_vec())).await;
            assert_eq!(back.expect("echo"), b"hello");
            let res = within(
                "the panicking request",
                conn.request(trigger.as_bytes().to_vec()),
            )
            .await;
            assert!(
                res.is_err(),
                "{trigger}: the connection was closed, got {res:?}"
            );
            let want = format!("session panicked: boom in {place}");
            eventually(&want, Duration::from_secs(20), || {
                let reasons = reasons.clone();
                let want = want.clone();
                async move { reasons_of(&reasons).iter().any(|r| r.contains(&want)) }
            })
            .await;
            assert_eq!(
                reasons_of(&reasons).len(),
                i + 1,
                "{:?}",
                reasons_of(&reasons)
            );
            // The other client is still served, on the same poller thread.
            within("echo after", echo_ok(&steady, pattern(5000, 10 + i as u64))).await;
        }

        let conn = client.connect(addr, "fragile-start").await;
        if let Ok(conn) = conn {
            let _ = within("a request to a dead session", conn.request(b"x".to_vec())).await;
        }
        eventually("on_established's panic", Duration::from_secs(20), || {
            let r = start_reasons.clone();
            async move {
                reasons_of(&r)
                    .iter()
                    .any(|r| r.contains("session panicked: boom in on_established"))
            }
        })
        .await;
        within("echo at the end", echo_ok(&steady, pattern(64, 99))).await;

        steady.close().await;
        wait_idle(&server, "all closed", Duration::from_secs(20)).await;
        rdmactor_tests::assert_leases_returned(&server).await;
        client.shutdown().await;
        server.shutdown().await;
    });
    assert_released(&base);
}
