//! Running clients: an actix System, connections opened one after another, polling until
//! a condition holds, a blocking client on a thread of its own.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rdmactor::runtime::{Client, ClientConnection};

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
