//! Many clients on one server: framed connections share receive queues, so a flood from
//! 200 senders meets no RNR even with RNR retries off; admission stays exact under a
//! connect storm; 20,000 clients (from four client processes) each echo while all are
//! open, and everything is released afterwards.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rdmactor::runtime::{Client, ConnectionConfig, NodeConfig, Server};
use rdmactor_services::echo::Echo;
use rdmactor_tests::{
    actix_run, assert_leases_returned, assert_released, hw_counter, pattern, rdma_context,
    resource_counts, target_bin, test_addr, wait_idle,
};

#[test]
fn two_hundred_senders_flood_a_slow_service_without_rnr_through_shared_receives() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    let rnr_before = (hw_counter("send_rnr_err"), hw_counter("rcvd_rnr_err"));
    let no_rnr = NodeConfig {
        connection: ConnectionConfig {
            rnr_retry_count: 0,
            ..ConnectionConfig::default()
        },
        ..NodeConfig::default()
    };
    assert!(
        no_rnr.receives.shared.is_some(),
        "shared receives are the default"
    );
    actix_run(async move {
        let server = Server::builder()
            .config(no_rnr.clone())
            .listen(test_addr(), None)
            .max_connections(400)
            // Every client of this test shares one address.
            .max_connections_per_peer(0)
            .service("slow", rdmactor_tests::Slow)
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let client = Client::start(no_rnr).expect("client");
        let mut conns = Vec::new();
        for i in 0..200 {
            conns.push(
                client
                    .connect(addr, "slow")
                    .await
                    .unwrap_or_else(|e| panic!("connect {i}: {e}")),
            );
        }
        let stats = server.stats().await;
        assert_eq!(
            stats.shared_queues,
            vec![200],
            "one shared queue: {stats:?}"
        );
        // Every connection sends 20 requests at once: 4,000 in flight against 1,048
        // shared receives, answered 1 ms apart.
        let floods = conns.iter().enumerate().map(|(c, conn)| async move {
            let requests = (0..20u64).map(|i| {
                let data = pattern(16 + (i as usize * 37 + c) % 3000, (c as u64) << 32 | i);
                async move {
                    let back = conn
                        .request(data.clone())
                        .await
                        .unwrap_or_else(|e| panic!("connection {c}, request {i}: {e}"));
                    assert!(back == data, "connection {c}, request {i}: other bytes");
                }
            });
            futures::future::join_all(requests).await;
        });
        futures::future::join_all(floods).await;
        let stats = server.stats().await;
        assert_eq!(
            (stats.connections, stats.closed),
            (200, 0),
            "no connection lost: {stats:?}"
        );
        for conn in conns {
            conn.close().await;
        }
        wait_idle(&server, "connections to close", Duration::from_secs(60)).await;
        assert_leases_returned(&server).await;
        client.shutdown().await;
        server.shutdown().await;
    });
    let rnr_after = (hw_counter("send_rnr_err"), hw_counter("rcvd_rnr_err"));
    assert_eq!(
        rnr_after, rnr_before,
        "RNR NAKs (sent, received) during the flood"
    );
    assert_released(&base);
}

/// One `client connect` process, driven through its stdin and stdout.
struct ClientProc {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl ClientProc {
    fn start(addr: std::net::SocketAddr, args: &[&str]) -> ClientProc {
        let mut child = Command::new(target_bin("client"))
            .args(["--addr", &addr.to_string(), "--keepalive", "60", "connect"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the client binary (scripts/test builds it)");
        let stdin = child.stdin.take().expect("stdin");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        ClientProc {
            child,
            stdin,
            lines,
        }
    }

    /// Waits (without blocking the actix thread) for a line starting with `prefix`.
    async fn expect(&mut self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            match self.lines.try_recv() {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(_) => {}
                Err(mpsc::TryRecvError::Empty) if Instant::now() < deadline => {
                    actix_rt::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => {
                    let status = self.child.try_wait();
                    panic!("no {prefix:?} line from the client ({e:?}, status {status:?})")
                }
            }
        }
    }

    fn go(&mut self) {
        writeln!(self.stdin, "go").expect("write to the client");
    }

    /// Waits for the client to close its connections and exit (thousands of closes take
    /// minutes under emulation).
    async fn finish(mut self) {
        for _ in 0..6000 {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(status.success(), "client exited with {status}");
                return;
            }
            actix_rt::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = self.child.kill();
        panic!("client did not exit");
    }
}

/// `key=value` of a RESULT line.
fn field(line: &str, key: &str) -> usize {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
}

#[test]
fn admission_is_exact_under_a_connect_storm() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let server = Server::builder()
            .listen(test_addr(), None)
            .service("echo", Echo)
            .max_connections(1000)
            // Every client of this test shares one address.
            .max_connections_per_peer(0)
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        // Two processes, 1,000 connects each, 250 in flight each.
        let args = [
            "--connections",
            "1000",
            "--parallel",
            "250",
            "--count-rejects",
            "--echo",
            "--stdin-steps",
        ];
        let mut procs: Vec<ClientProc> = (0..2).map(|_| ClientProc::start(addr, &args)).collect();
        let (mut admitted, mut refused) = (0, 0);
        for p in &mut procs {
            let result = p.expect("RESULT", Duration::from_secs(300)).await;
            admitted += field(&result, "connections");
            refused += field(&result, "rejected");
            if field(&result, "rejected") > 0 {
                let line = p.expect("REJECTED", Duration::from_secs(5)).await;
                assert!(line.contains("code=ServerFull"), "{line}");
            }
        }
        assert_eq!(
            (admitted, refused),
            (1000, 1000),
            "exactly the limit admitted"
        );
        let stats = server.stats().await;
        assert_eq!(
            (stats.connections, stats.accepted, stats.rejected),
            (1000, 1000, 1000),
            "{stats:?}"
        );
        for p in &mut procs {
            p.expect("OPEN", Duration::from_secs(30)).await;
            p.go();
        }
        for p in &mut procs {
            let echoed = p.expect("ECHOED", Duration::from_secs(120)).await;
            assert!(echoed.starts_with("ECHOED "), "{echoed}");
            p.go();
        }
        for p in procs {
            p.finish().await;
        }
        wait_idle(&server, "connections to close", Duration::from_secs(120)).await;
        assert_leases_returned(&server).await;
        server.shutdown().await;
    });
    assert_released(&base);
}

/// Clients for the scale test: `RDMACTOR_SCALE_CLIENTS` (20,000 by default), from four
/// processes.
fn scale_clients() -> usize {
    std::env::var("RDMACTOR_SCALE_CLIENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

#[test]
fn twenty_thousand_clients_each_echo_while_all_are_open() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    let total = scale_clients();
    let per_proc = total.div_ceil(4);
    actix_run(async move {
        let config = NodeConfig {
            connection: ConnectionConfig {
                // One probe per silent connection per period: 20,000 connections at the
                // default 5 s would cost 4,000 probes a second on each side.
                keepalive: Some(Duration::from_secs(60)),
                ..ConnectionConfig::default()
            },
            ..NodeConfig::default()
        };
        let server = Server::builder()
            .config(config)
            .listen(test_addr(), None)
            .service("echo", Echo)
            .max_connections(total + 16)
            // Every client of this test shares one address.
            .max_connections_per_peer(0)
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let n = per_proc.to_string();
        let args = [
            "--connections",
            &n,
            "--parallel",
            "100",
            "--echo",
            "--stdin-steps",
        ];
        let started = Instant::now();
        let mut procs: Vec<ClientProc> = (0..4).map(|_| ClientProc::start(addr, &args)).collect();
        for p in &mut procs {
            p.expect("OPEN", Duration::from_secs(900)).await;
        }
        let opened = started.elapsed();
        let stats = server.stats().await;
        assert_eq!(
            stats.connections,
            4 * per_proc,
            "all open at once: {stats:?}"
        );
        println!(
            "{} connections open after {opened:?}; shared queues {:?}; pool {:?}",
            stats.connections, stats.shared_queues, stats.pool
        );
        // Every connection echoes while all are open.
        for p in &mut procs {
            p.go();
        }
        for p in &mut procs {
            let line = p.expect("ECHOED", Duration::from_secs(600)).await;
            assert_eq!(line, format!("ECHOED {per_proc}"));
        }
        assert_eq!(server.stats().await.connections, 4 * per_proc);
        for p in &mut procs {
            p.go();
        }
        for p in procs {
            p.finish().await;
        }
        wait_idle(&server, "connections to close", Duration::from_secs(600)).await;
        let stats = server.stats().await;
        assert_eq!(stats.closed, 4 * per_proc as u64, "{stats:?}");
        assert_leases_returned(&server).await;
        assert!(
            stats.shared_queues.len() <= 1,
            "empty queues released down to the floor: {stats:?}"
        );
        server.shutdown().await;
    });
    assert_released(&base);
}
