//! Prometheus metrics under real verbs: the test installs the exporter (as
//! `server --metrics` does), drives echo and lambda load plus a refused connect, scrapes
//! `/metrics` with curl while the load runs and once it is over, and checks the counters
//! against what it did (the lambda module cache's loads and evictions too). Then it
//! provokes what the error and stall counters count: a burst of one-way messages
//! outrunning a slow service (the sender waits for credits), and a lambda whose input
//! region lacks remote read access (the server's READ fails with a remote access error
//! and its connection's receives are flushed).

use std::net::{SocketAddr, TcpListener};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rdmactor::runtime::{Client, NodeConfig, Server};
use rdmactor::verbs::Access;
use rdmactor_services::echo::Echo;
use rdmactor_services::lambda::{
    self, checksum_native, FailureKind, Invocation, LambdaConfig, LambdaRef, LambdaService, Limits,
    NativeLambdas, Sandbox,
};
use rdmactor_tests::{
    actix_run, assert_released, echo_ok, eventually, rdma_context, resource_counts, test_addr,
    wait_idle,
};

/// Connections of echo load.
const CONNECTIONS: usize = 4;
/// Echo requests per connection, at least.
const MIN_REQUESTS: usize = 200;
/// Echo payload bytes; the request's postcard encoding adds one length byte.
const PAYLOAD: usize = 100;

fn module(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../examples/lambdas/{name}.wat",
        env!("CARGO_MANIFEST_DIR")
    );
    wat::parse_file(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A free loopback port for the exporter.
fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
}

/// `/metrics` fetched with curl, as an operator's scraper would.
fn scrape(addr: SocketAddr) -> String {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "5", &format!("http://{addr}/metrics")])
        .output()
        .expect("running curl");
    assert!(
        out.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 metrics")
}

/// The value of `name` whose labels include every one of `labels`, from Prometheus's
/// text format; `None` if no such series.
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (series, v) = line.rsplit_once(' ')?;
            let (n, rest) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let has = |(k, want): &(&str, &str)| {
                rest.split(',')
                    .any(|kv| kv.split_once('=') == Some((k, &format!("\"{want}\""))))
            };
            (n == name && labels.iter().all(has)).then(|| v.parse().ok())?
        })
}

/// One-way messages in the burst sent to the slow service: several times the
/// connection's credits (`ReceiveConfig::depth`, 16), fewer than its send queue (64),
/// so only credits hold the sender back.
const BURST: usize = 48;

fn server_echo(text: &str, name: &str) -> f64 {
    value(text, name, &[("side", "server"), ("service", "echo")]).unwrap_or(0.0)
}

/// Scrapes until `done` holds of the text (at most 15 s), and returns the last scrape.
/// A connection adds its message counts to the shared counters every 64 messages and on
/// its keepalive timer (5 s by default), so the last few show up that late at most.
async fn settled(addr: SocketAddr, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let text = scrape(addr);
        if done(&text) || Instant::now() >= deadline {
            return text;
        }
        actix_rt::time::sleep(Duration::from_millis(250)).await;
    }
}

#[test]
fn counters_match_what_the_test_did() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    let metrics = free_port();
    // The recorder must be in place before any connection registers its handles.
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("installing the exporter");
    // As `server --metrics` does: the echo handling histogram is timed only when asked.
    rdmactor::metrics::set_timing(true);
    rdmactor::metrics::serve(metrics, Default::default(), move || handle.render())
        .expect("serving /metrics");

    let stop = Arc::new(AtomicBool::new(false));
    let during = Arc::new(Mutex::new(Vec::new()));
    actix_run(async {
        let sandbox = Arc::new(Sandbox::new());
        let natives = Arc::new(NativeLambdas::new());
        let config = LambdaConfig {
            cap: Limits {
                fuel: 10_000_000,
                ..Limits::default()
            },
            ..LambdaConfig::default()
        };
        let (sink, sunk) = rdmactor_tests::SlowSink::new(Duration::from_millis(1));
        let server = Server::builder()
            .listen(test_addr(), None)
            .service("echo", Echo)
            .service("slow", sink)
            .service("lambda", LambdaService::new(sandbox, natives, config))
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");

        // Refused: no such service.
        assert!(client.connect(addr, "no-such-service").await.is_err());

        // Lambda: one good run, one trap, one out of fuel.
        let lambdas = client.connect(addr, "lambda").await.expect("connect");
        let mut input = client.register(64, Access::REMOTE_READ).unwrap();
        input.as_mut_slice().fill(7);
        let output = client.register(64, Access::REMOTE_WRITE).unwrap();
        let invocation = |lambda| Invocation {
            lambda,
            input: input.remote(),
            input_len: 64,
            output: output.remote(),
            limits: None,
        };
        let checksum = lambda::upload(&lambdas, &module("checksum")).await.unwrap();
        let trap = lambda::upload(&lambdas, &module("trap")).await.unwrap();
        let looping = lambda::upload(&lambdas, &module("infinite_loop"))
            .await
            .unwrap();
        let len = lambda::invoke(&lambdas, &invocation(LambdaRef::Module(checksum)))
            .await
            .unwrap();
        assert_eq!(
            &output.as_slice()[..len as usize],
            checksum_native(&[7; 64])
        );
        for (hash, kind) in [(trap, FailureKind::Trap), (looping, FailureKind::OutOfFuel)] {
            let e = lambda::invoke(&lambdas, &invocation(LambdaRef::Module(hash)))
                .await
                .unwrap_err();
            assert_eq!(e.kind(), Some(kind), "{e}");
        }

        // Echo load, scraped with curl from another thread while it runs.
        let conns =
            futures::future::join_all((0..CONNECTIONS).map(|_| client.connect(addr, "echo")))
                .await
                .into_iter()
                .collect::<Result<Vec<_>, _>>()
                .expect("connect");
        // The load goes on until the scraper has taken a few scrapes while it ran
        // (curl is slow to start under emulation), then stops; `sent` is what it did.
        let sent = Arc::new(AtomicUsize::new(0));
        let scraper = {
            let (stop, during) = (stop.clone(), during.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    let text = scrape(metrics);
                    during.lock().unwrap().push(text);
                    thread::sleep(Duration::from_millis(20));
                }
            })
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        futures::future::join_all(conns.iter().map(|conn| {
            let (sent, during) = (sent.clone(), during.clone());
            async move {
                let mut i = 0usize;
                while i < MIN_REQUESTS
                    || (during.lock().unwrap().len() < 3 && Instant::now() < deadline)
                {
                    echo_ok(conn, vec![i as u8; PAYLOAD]).await;
                    sent.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            }
        }))
        .await;
        stop.store(true, Ordering::Release);
        scraper.join().expect("scraper");

        let requests = sent.load(Ordering::Relaxed) as f64;
        let text = settled(metrics, |t| {
            server_echo(t, "rdmactor_messages_out_total") >= requests
                && value(
                    t,
                    "rdmactor_messages_in_total",
                    &[("side", "client"), ("service", "echo")],
                ) >= Some(requests)
        })
        .await;
        println!(
            "{} scrapes during the load; after it: {requests} requests",
            during.lock().unwrap().len()
        );
        assert_eq!(server_echo(&text, "rdmactor_messages_in_total"), requests);
        assert_eq!(server_echo(&text, "rdmactor_messages_out_total"), requests);
        let bytes = requests * (PAYLOAD + 1) as f64;
        assert_eq!(server_echo(&text, "rdmactor_bytes_in_total"), bytes);
        assert_eq!(server_echo(&text, "rdmactor_bytes_out_total"), bytes);
        // The client side counts the same messages the other way round.
        assert_eq!(
            value(
                &text,
                "rdmactor_messages_out_total",
                &[("side", "client"), ("service", "echo")]
            ),
            Some(requests)
        );
        assert_eq!(
            server_echo(&text, "rdmactor_connections_open"),
            CONNECTIONS as f64
        );
        assert_eq!(
            value(
                &text,
                "rdmactor_connections_accepted_total",
                &[("service", "echo")]
            ),
            Some(CONNECTIONS as f64)
        );
        assert_eq!(
            value(
                &text,
                "rdmactor_connections_accepted_total",
                &[("service", "lambda")]
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &text,
                "rdmactor_connections_rejected_total",
                &[("reason", "unknown_service")]
            ),
            Some(1.0)
        );
        for (outcome, n) in [("ok", 1.0), ("trap", 1.0), ("out_of_fuel", 1.0)] {
            assert_eq!(
                value(
                    &text,
                    "rdmactor_lambda_runs_total",
                    &[("kind", "module"), ("outcome", outcome)]
                ),
                Some(n),
                "lambda runs with outcome {outcome}"
            );
        }
        // Three modules uploaded, each compiled once and held by the lambda connection.
        let loads = |text: &str, result| {
            value(
                text,
                "rdmactor_lambda_module_loads_total",
                &[("result", result)],
            )
        };
        assert_eq!(loads(&text, "compiled"), Some(3.0));
        assert_eq!(
            (loads(&text, "cached"), loads(&text, "refused")),
            (None, None)
        );
        assert_eq!(
            value(&text, "rdmactor_lambda_module_evictions_total", &[]),
            None
        );
        assert!(value(&text, "rdmactor_cq_poll_batch_count", &[]).unwrap_or(0.0) > 0.0);
        // The handling time is taken for one request in TIMING_SAMPLE on each poller
        // thread, the first of each run of that many: between requests / TIMING_SAMPLE
        // and one more per thread.
        let timed = value(&text, "rdmactor_echo_handling_seconds_count", &[]).unwrap_or(0.0);
        let sample = f64::from(rdmactor::metrics::TIMING_SAMPLE);
        let pollers = NodeConfig::default().transport.pollers as f64;
        assert!(
            timed >= (requests / sample).floor() && timed <= (requests / sample).ceil() + pollers,
            "{timed} echo handling times for {requests} requests, one in {sample} on {pollers} threads"
        );
        // No access error so far, and nothing waited: every request waited for its reply.
        // (The refused connect's receives were flushed: that is counted, see below.)
        let completion_errors = |text: &str, status| {
            value(
                text,
                "rdmactor_completion_errors_total",
                &[("status", status)],
            )
        };
        assert_eq!(completion_errors(&text, "RemoteAccessError"), None);
        assert_eq!(value(&text, "rdmactor_send_stalls_total", &[]), None);

        // While the load ran, a scrape saw the connections open and part of the work.
        let during = std::mem::take(&mut *during.lock().unwrap());
        assert!(
            during.iter().any(|t| {
                let seen = server_echo(t, "rdmactor_messages_in_total");
                server_echo(t, "rdmactor_connections_open") == CONNECTIONS as f64
                    && seen > 0.0
                    && seen < requests
            }),
            "no scrape caught the load in progress ({} scrapes)",
            during.len()
        );

        // A burst outrunning a slow service: the sender stalls on credits, and every
        // message still arrives.
        let slow = client.connect(addr, "slow").await.expect("connect slow");
        slow.send_all((0..BURST).map(|i| vec![i as u8; 32]).collect())
            .await
            .expect("the burst");
        eventually(
            "the slow service to take the burst",
            Duration::from_secs(30),
            || async { sunk.load(Ordering::Relaxed) == BURST },
        )
        .await;
        let text = settled(metrics, |t| {
            value(
                t,
                "rdmactor_messages_in_total",
                &[("side", "server"), ("service", "slow")],
            ) >= Some(BURST as f64)
        })
        .await;
        let stalls = value(&text, "rdmactor_send_stalls_total", &[]).unwrap_or(0.0);
        println!("{BURST} one-way messages to a slow service: {stalls} send stalls");
        assert!(stalls >= 1.0, "no send stall counted");
        assert_eq!(
            value(
                &text,
                "rdmactor_messages_in_total",
                &[("side", "server"), ("service", "slow")]
            ),
            Some(BURST as f64)
        );
        let flushed_before = completion_errors(&text, "WrFlushError").unwrap_or(0.0);
        println!("flushed before the access error: {flushed_before}");
        assert_eq!(completion_errors(&text, "RemoteAccessError"), None);

        // A lambda whose input the server may not READ: that READ fails with a remote
        // access error (exactly one), the server closes that connection, and the
        // receives it had posted come back flushed. The other connections are untouched.
        let careless = client.connect(addr, "lambda").await.expect("connect");
        let local_only = client.register(64, Access::LOCAL_WRITE).unwrap();
        let inv = Invocation {
            input: local_only.remote(),
            ..invocation(LambdaRef::Module(checksum))
        };
        let e = lambda::invoke(&careless, &inv).await.unwrap_err();
        println!("lambda over a region without remote read: {e}");
        assert_eq!(e.kind(), None, "expected the connection to close: {e}");
        eventually(
            "the flushed receives to be counted",
            Duration::from_secs(10),
            || async {
                value(
                    &scrape(metrics),
                    "rdmactor_completion_errors_total",
                    &[("status", "WrFlushError")],
                )
                .is_some()
            },
        )
        .await;
        let text = scrape(metrics);
        let errors = |status| {
            value(
                &text,
                "rdmactor_completion_errors_total",
                &[("status", status)],
            )
        };
        println!(
            "completion errors: RemoteAccessError {:?}, WrFlushError {:?}",
            errors("RemoteAccessError"),
            errors("WrFlushError")
        );
        assert_eq!(errors("RemoteAccessError"), Some(1.0));
        assert!(errors("WrFlushError").is_some_and(|n| n >= 1.0));
        assert_eq!(
            server_echo(&text, "rdmactor_connections_open"),
            CONNECTIONS as f64,
            "the echo connections stay open"
        );
        careless.close().await;
        slow.close().await;
        drop(local_only);

        // Closed: the gauge is back to zero and each lifetime was recorded.
        for conn in conns {
            conn.close().await;
        }
        lambdas.close().await;
        wait_idle(&server, "connections to close", Duration::from_secs(20)).await;
        eventually("the open gauge to drop", Duration::from_secs(5), || async {
            server_echo(&scrape(metrics), "rdmactor_connections_open") == 0.0
        })
        .await;
        let text = scrape(metrics);
        assert_eq!(
            server_echo(&text, "rdmactor_connection_lifetime_seconds_count"),
            CONNECTIONS as f64
        );
        // The lambda connection's modules left the cache with it (its session, and with
        // it its hold on the cache, is dropped as the connection is torn down).
        eventually(
            "the lambda modules to leave the cache",
            Duration::from_secs(10),
            || async {
                value(
                    &scrape(metrics),
                    "rdmactor_lambda_module_evictions_total",
                    &[],
                ) == Some(3.0)
            },
        )
        .await;
        drop((input, output));
        client.shutdown().await;
        server.shutdown().await;
    });
    assert_released(&base);
}
