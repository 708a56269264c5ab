//! Running clients: an actix System, connections opened one after another, polling until
//! a condition holds, a blocking client on a thread of its own; connections dropped
//! without `close`, over any transport.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rdmactor::runtime::{Client, ClientConnection, Server};
use rdmactor::transport::Transport;

/// Runs `fut` inside a fresh actix System (what servers and clients need). With
/// `RUST_LOG` set, the framework's logs go to the test's output.
pub fn actix_run<F: std::future::Future>(fut: F) -> F::Output {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
    actix::System::new().block_on(fut)
}

/// Polls `check` until it holds or `timeout` passes.
pub async fn eventually<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Opens `n` connections to `service` at `addr`, one after another.
pub async fn connect_n(
    client: &Client,
    addr: SocketAddr,
    service: &str,
    n: usize,
) -> Vec<ClientConnection> {
    let mut conns = Vec::with_capacity(n);
    for i in 0..n {
        let conn = client.connect(addr, service).await;
        conns.push(conn.unwrap_or_else(|e| panic!("connect {i} to {service}: {e}")));
    }
    conns
}

/// Runs `client` on its own thread (it blocks) while this thread keeps the server's
/// actors going, and returns its result.
pub async fn off_thread<T: Send + 'static>(client: impl FnOnce() -> T + Send + 'static) -> T {
    let handle = std::thread::spawn(client);
    while !handle.is_finished() {
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    }
    handle.join().expect("client thread")
}

/// Opens `total` connections to `service` at `addr`, `batch` at a time, sends the
/// request `probe.0` on one of each batch (the service must answer `probe.1`), and drops
/// the batch's handles without calling `close`. After every batch both sides must
/// be back to where they started within a deadline: the server's connections (so the
/// goodbye reached it: it would otherwise hold them until its idle limit), the client's,
/// and every pool lease on both (what the pools hold after each batch is what they held
/// after the first: shared receive queues kept empty for the next connections stay).
///
/// Before that, the handle rules: a dropped clone leaves the connection open,
/// `close().await` closes it for every clone, and the last clone dropped after it closes
/// nothing twice (one connection counted closed on each side).
///
/// One body for every transport: the loopback run is native
/// (`services/tests/over_loopback.rs`), the verbs run is in the VM suite.
pub async fn dropped_connections_close<T: Transport>(
    server: &Server<T>,
    client: &Client<T>,
    addr: SocketAddr,
    service: &str,
    probe: (&[u8], &[u8]),
    total: usize,
    batch: usize,
) {
    let (request, reply) = (probe.0.to_vec(), probe.1.to_vec());
    assert!(batch > 0, "a batch of at least one");
    let server_base = server.stats().await;
    let client_base = client.stats().await;
    let base = (server_base.connections, client_base.connections);
    let mut closed = 0u64;

    let conn = client.connect(addr, service).await.expect("connect");
    drop(conn.clone());
    let kept = conn.request(request.clone()).await;
    assert_eq!(kept.expect("a dropped clone closes nothing"), reply);
    let other = conn.clone();
    conn.close().await;
    assert!(
        other.request(request.clone()).await.is_err(),
        "close() closed every clone"
    );
    drop(other);
    closed += 1;
    back_to_base(server, client, base).await;

    let mut leased = None;
    let mut opened = 0;
    while opened < total {
        let n = batch.min(total - opened);
        let mut conns = Vec::with_capacity(n);
        for i in 0..n {
            let conn = client.connect(addr, service).await;
            conns.push(conn.unwrap_or_else(|e| panic!("connect {} of {total}: {e}", opened + i)));
        }
        let last = conns.last().expect("one at least");
        let answer = last.request(request.clone()).await.expect("served");
        assert_eq!(answer, reply);
        assert_eq!(
            server.stats().await.connections,
            server_base.connections + n,
            "the batch is open on the server"
        );
        drop(conns);
        opened += n;
        closed += n as u64;
        back_to_base(server, client, base).await;
        let now = (
            server.stats().await.pool.leased,
            client.stats().await.pool.leased,
        );
        match &leased {
            None => leased = Some(now),
            Some(first) => assert_eq!(
                &now, first,
                "leases after {opened} dropped connections (server, client)"
            ),
        }
    }
    let (s, c) = (server.stats().await, client.stats().await);
    assert_eq!(s.closed, server_base.closed + closed, "{s:?}");
    assert_eq!(c.closed, client_base.closed + closed, "{c:?}");
    assert_eq!(c.connections, client_base.connections, "{c:?}");
}

/// Waits until the server and the client hold `base` connections again (the server's,
/// the client's).
async fn back_to_base<T: Transport>(server: &Server<T>, client: &Client<T>, base: (usize, usize)) {
    eventually(
        "the dropped connections to be released on both sides",
        Duration::from_secs(30),
        || async {
            let s = server.stats().await.connections;
            let c = client.stats().await.connections;
            (s, c) == base
        },
    )
    .await;
}
