//! Bad clients and overload: a SIGKILLed client is torn down while others are served; a
//! flood into a slow service causes no RNR (credits), even with RNR retries disabled;
//! the server binary shuts down cleanly on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use rdmactor::runtime::{Client, ConnectionConfig, NodeConfig, ReceiveConfig, Server};
use rdmactor_services::echo::Echo;
use rdmactor_tests::{
    actix_run, assert_released, echo_ok, eventually, pattern, rdma_context, resource_counts, serve,
    target_bin, test_addr, wait_idle,
};

#[test]
fn sigkilled_client_is_torn_down_and_others_keep_being_served() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let (server, addr, client) = serve("echo", Echo);
        let steady = client.connect(addr, "echo").await.expect("connect");

        let mut child = Command::new(target_bin("client"))
            .args([
                "--addr",
                &addr.to_string(),
                "echo",
                "--connections",
                "3",
                "--forever",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the client binary (scripts/test builds it)");
        // Read the child's first line on a thread: this thread runs the server's actors,
        // which must keep going for the child to connect at all.
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = tx.send(line);
            // Keep draining so the child never blocks or fails on a full or closed pipe.
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        });
        let line = rx.await.expect("child output");
        assert_eq!(line.trim(), "connected 3");
        eventually("4 connections", Duration::from_secs(10), || async {
            server.stats().await.connections == 4
        })
        .await;
        for i in 0..20 {
            echo_ok(&steady, pattern(5000, i)).await; // traffic while the other streams
        }
        child.kill().expect("SIGKILL");
        let status = child.wait().unwrap();
        assert!(!status.success());

        eventually(
            "the killed client's connections to be torn down",
            Duration::from_secs(30),
            || async { server.stats().await.connections == 1 },
        )
        .await;
        for i in 0..20 {
            echo_ok(&steady, pattern(9000, 100 + i)).await;
        }
        steady.close().await;
        wait_idle(&server, "all closed", Duration::from_secs(10)).await;
        rdmactor_tests::assert_leases_returned(&server).await;
        client.shutdown().await;
        server.shutdown().await;
    });
    assert_released(&base);
}

#[test]
fn flooding_a_slow_service_causes_no_rnr_and_loses_nothing() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    // With zero RNR retries, a single SEND that met an empty receive queue would fail
    // the connection; credits must prevent that entirely.
    let no_rnr = NodeConfig {
        connection: ConnectionConfig {
            rnr_retry_count: 0,
            ..ConnectionConfig::default()
        },
        receives: ReceiveConfig {
            depth: 4,
            ..ReceiveConfig::default()
        },
        ..NodeConfig::default()
    };
    actix_run(async move {
        let server = Server::builder()
            .config(no_rnr.clone())
            .listen(test_addr(), None)
            .service("slow", rdmactor_tests::Slow)
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let client = Client::start(no_rnr).expect("client");
        let conn = client.connect(addr, "slow").await.expect("connect");
        let requests = (0..600u64).map(|i| {
            let conn = conn.clone();
            async move {
                let data = pattern(16 + (i as usize * 37) % 3000, i);
                let back = conn
                    .request(data.clone())
                    .await
                    .unwrap_or_else(|e| panic!("request {i}: {e}"));
                assert!(back == data, "request {i} answered with other bytes");
            }
        });
        futures::future::join_all(requests).await;
        conn.close().await;
        client.shutdown().await;
        server.shutdown().await;
    });
    assert_released(&base);
}

#[test]
fn server_binary_shuts_down_cleanly_on_sigterm() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    let listen = format!("{}:0", test_addr().ip());
    let mut server = Command::new(target_bin("server"))
        .args(["--listen", &listen])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the server binary (scripts/test builds it)");
    let mut out = BufReader::new(server.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let addr: std::net::SocketAddr = line
        .trim()
        .strip_prefix("listening on ")
        .expect("address line")
        .parse()
        .unwrap();
    actix_run(async {
        let client = Client::start(NodeConfig::default()).expect("client");
        let conn = client.connect(addr, "echo").await.expect("connect");
        echo_ok(&conn, b"before".to_vec()).await;
        // SIGTERM: the server disconnects us, releases everything and exits 0.
        let ok = Command::new("kill")
            .args(["-TERM", &server.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        let status = server.wait().unwrap();
        assert!(status.success(), "server exited with {status:?}");
        let err = conn
            .request(b"after".to_vec())
            .await
            .expect_err("the server is gone");
        assert!(err.to_string().contains("closed"), "{err}");
        client.shutdown().await;
    });
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(rest.contains("shut down cleanly: 1 accepted"), "{rest}");
    assert_released(&base);
}
