//! Servers for tests: one on the test address with a client beside it, a capped pool,
//! waiting for its connections to close and checking every lease came back, a service
//! wrapper that records why connections closed, and deliberately slow services.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdmactor::memory::PoolConfig;
use rdmactor::runtime::{
    Client, ClientConnection, CloseReason, Framing, Incoming, NodeConfig, OpId, PeerInfo, Server,
    Service, Session, SessionCx, SessionError,
};

use crate::{eventually, test_addr};

/// Waits until `server` has no connection left (each one released its resources).
pub async fn wait_idle(server: &Server, what: &str, timeout: Duration) {
    eventually(what, timeout, || async {
        server.stats().await.connections == 0
    })
    .await;
}

/// Closes `conns`, waits until `server` has released them, checks every pool lease came
/// back, and shuts `client` down.
pub async fn close_all(server: &Server, client: Client, conns: Vec<ClientConnection>) {
    for conn in conns {
        conn.close().await;
    }
    wait_idle(
        server,
        "server connections to close",
        Duration::from_secs(20),
    )
    .await;
    assert_leases_returned(server).await;
    client.shutdown().await;
}

/// Every lease is back in the pool, but for the receive buffers of the empty shared
/// queues the server keeps for its next connections.
pub async fn assert_leases_returned(server: &Server) {
    let stats = server.stats().await;
    assert!(
        stats.shared_queues.iter().all(|&m| m == 0),
        "no connection left in a shared queue: {stats:?}"
    );
    assert_eq!(
        stats.pool.leased.iter().sum::<usize>(),
        stats.shared_recv_buffers,
        "leases returned: {stats:?}"
    );
    // And every buffer of those queues is posted again, none lost to a closed member.
    if let Some(depth) = stats
        .shared_recv_buffers
        .checked_div(stats.shared_receives_posted.len())
    {
        assert!(
            stats.shared_receives_posted.iter().all(|&n| n == depth),
            "shared receives posted, of {depth} each: {stats:?}"
        );
    }
}

/// A server on the test address offering `service` as `name`, its address, and a client
/// (inside an actix System).
pub fn serve(name: &str, service: impl Service) -> (Server, SocketAddr, Client) {
    serve_with(NodeConfig::default(), name, service)
}

/// [`serve`] with the server's node configured by `config` (the client's stays default).
pub fn serve_with(
    config: NodeConfig,
    name: &str,
    service: impl Service,
) -> (Server, SocketAddr, Client) {
    let server = Server::builder()
        .config(config)
        .listen(test_addr(), None)
        .service(name, service)
        .start()
        .expect("server");
    let addr = server.local_addrs()[0];
    let client = Client::start(NodeConfig::default()).expect("client");
    (server, addr, client)
}

/// A node whose registered-memory pool has `room` bytes beyond the receive buffers it
/// reserves: the cap that rendezvous buffers, large leases and session registrations
/// share.
pub fn capped_pool(room: usize) -> NodeConfig {
    let pool = PoolConfig::default();
    NodeConfig {
        pool: PoolConfig {
            max_bytes: pool.reserved_smallest + room,
            ..pool
        },
        ..NodeConfig::default()
    }
}

/// Wraps a service and records why each of its connections closed (`CloseReason`'s
/// text), so tests can check the reason a misbehaving peer or session was given.
pub struct Recorded<S> {
    inner: S,
    reasons: Reasons,
}

impl<S> Recorded<S> {
    /// `inner`, and the list of reasons it records into (one entry per closed connection).
    pub fn new(inner: S) -> (Recorded<S>, Reasons) {
        let reasons = Arc::default();
        let rec = Recorded {
            inner,
            reasons: Arc::clone(&reasons),
        };
        (rec, reasons)
    }
}

impl<S: Service> Service for Recorded<S> {
    fn framing(&self) -> Framing {
        self.inner.framing()
    }

    fn session(&self, peer: &PeerInfo) -> Box<dyn Session> {
        Box::new(RecordingSession {
            inner: self.inner.session(peer),
            reasons: self.reasons.clone(),
        })
    }
}

struct RecordingSession {
    inner: Box<dyn Session>,
    reasons: Reasons,
}

impl Session for RecordingSession {
    fn on_established(&mut self, cx: &mut SessionCx<'_>) -> Result<(), SessionError> {
        self.inner.on_established(cx)
    }
    fn on_message(&mut self, cx: &mut SessionCx<'_>, msg: Incoming) -> Result<(), SessionError> {
        self.inner.on_message(cx, msg)
    }
    fn on_op(
        &mut self,
        cx: &mut SessionCx<'_>,
        op: OpId,
        result: rdmactor::verbs::Result<()>,
    ) -> Result<(), SessionError> {
        self.inner.on_op(cx, op, result)
    }
    fn on_wake(&mut self, cx: &mut SessionCx<'_>, token: u64) -> Result<(), SessionError> {
        self.inner.on_wake(cx, token)
    }
    fn on_close(&mut self, reason: &CloseReason) {
        self.reasons.lock().unwrap().push(reason.to_string());
        self.inner.on_close(reason)
    }
}

/// Close reasons a test service records (see [`Recorded`]).
pub type Reasons = Arc<Mutex<Vec<String>>>;

/// Waits until a connection recorded in `reasons` has closed, and returns the first
/// reason.
pub async fn first_close_reason(reasons: &Reasons, within: Duration) -> String {
    eventually("the connection to close", within, || {
        let reasons = reasons.clone();
        async move { !reasons.lock().unwrap().is_empty() }
    })
    .await;
    let first = reasons.lock().unwrap()[0].clone();
    first
}

/// A deliberately slow echo service: each message takes a millisecond of the poller
/// thread, so senders outrun it and only credits keep them from overrunning its
/// receives.
pub struct Slow;

impl Service for Slow {
    fn session(&self, _peer: &PeerInfo) -> Box<dyn Session> {
        Box::new(SlowSession)
    }
}

struct SlowSession;

impl Session for SlowSession {
    fn on_message(&mut self, cx: &mut SessionCx<'_>, msg: Incoming) -> Result<(), SessionError> {
        std::thread::sleep(Duration::from_millis(1));
        let data = msg.data.clone();
        cx.reply(&msg, data)
    }
}

/// A service that takes `delay` of the poller thread over each one-way message and
/// answers nothing, counting what it took: a sender's burst outruns it, so the sender
/// runs low on credits (and borrows from a shared queue's reserve, or waits).
#[derive(Clone)]
pub struct SlowSink {
    delay: Duration,
    taken: Arc<AtomicUsize>,
}

impl SlowSink {
    /// The service, and the count of messages its sessions took.
    pub fn new(delay: Duration) -> (SlowSink, Arc<AtomicUsize>) {
        let taken = Arc::new(AtomicUsize::new(0));
        let sink = SlowSink {
            delay,
            taken: taken.clone(),
        };
        (sink, taken)
    }
}

impl Service for SlowSink {
    fn session(&self, _peer: &PeerInfo) -> Box<dyn Session> {
        Box::new(self.clone())
    }
}

impl Session for SlowSink {
    fn on_message(&mut self, _cx: &mut SessionCx<'_>, _msg: Incoming) -> Result<(), SessionError> {
        std::thread::sleep(self.delay);
        self.taken.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
