//! Shared helpers for the real-verbs tests: device discovery, `rdma resource` counts and
//! a connected client/server pair over rdma_cm.
//!
//! The tests need an RDMA device (run them through `scripts/test`, which boots the
//! Soft-RoCE VM). Outside the VM they print that they skip, unless
//! `RDMACTOR_REQUIRE_RDMA=1` is set (the VM run sets it), in which case a missing device
//! fails the test.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rdmactor::blocking::{self, Endpoint, EndpointOptions, Listener};
use rdmactor::verbs::{CmId, Context, EventChannel, ProtectionDomain, QueuePair, Result};

pub mod framed;
pub mod wire;

/// Opens the test device, or returns `None` (test skipped) when there is none and the run
/// does not require one.
///
/// The context is opened once per process and a cm_id is bound once: librdmacm allocates
/// a PD of its own per device the first time an id binds to it and keeps it while the
/// device list is referenced, so doing that before any baseline is taken makes
/// `rdma resource` counts comparable across tests.
pub fn rdma_context() -> Option<Context> {
    static CONTEXT: OnceLock<Result<Context, String>> = OnceLock::new();
    let ctx = CONTEXT.get_or_init(|| {
        let name = std::env::var("RDMACTOR_DEVICE").ok();
        let ctx = Context::open(name.as_deref()).map_err(|e| e.to_string())?;
        let channel = EventChannel::new().map_err(|e| e.to_string())?;
        let id = CmId::new(&channel).map_err(|e| e.to_string())?;
        id.bind(test_addr())
            .map_err(|e| format!("bind {}: {e}", test_addr()))?;
        Ok(ctx)
    });
    match ctx {
        Ok(ctx) => Some(ctx.clone()),
        Err(e) if std::env::var("RDMACTOR_REQUIRE_RDMA").as_deref() == Ok("1") => {
            panic!("RDMACTOR_REQUIRE_RDMA=1 but no usable RDMA device: {e}")
        }
        Err(e) => {
            eprintln!("skipping: no RDMA device ({e}); run scripts/test to use the Soft-RoCE VM");
            None
        }
    }
}

/// The address of the RDMA interface (192.0.2.1 in the Soft-RoCE VM), port 0.
pub fn test_addr() -> SocketAddr {
    let ip: IpAddr = std::env::var("RDMACTOR_TEST_IP")
        .unwrap_or_else(|_| "192.0.2.1".into())
        .parse()
        .expect("RDMACTOR_TEST_IP is an IP address");
    SocketAddr::new(ip, 0)
}

/// A second address of this host on the RDMA interface (the VM gives it the test
/// address + 100, 192.0.2.101): connecting from it makes a second peer to a server that
/// counts connections per peer address.
pub fn second_peer_ip() -> IpAddr {
    match test_addr().ip() {
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            IpAddr::V4(std::net::Ipv4Addr::new(a, b, c, d.wrapping_add(100)))
        }
        other => panic!("no second peer address for {other}"),
    }
}

/// Per-kind object counts of one device, as `rdma resource show` prints them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceCounts(pub BTreeMap<String, u64>);

/// The kinds every test must give back.
pub const TRACKED: [&str; 5] = ["pd", "cq", "qp", "mr", "cm_id"];

impl ResourceCounts {
    /// Count of one kind (0 when absent).
    pub fn get(&self, kind: &str) -> u64 {
        self.0.get(kind).copied().unwrap_or(0)
    }
}

/// Reads `rdma resource show` for the test device.
pub fn resource_counts() -> ResourceCounts {
    let out = Command::new("rdma")
        .args(["resource", "show"])
        .output()
        .expect("run `rdma resource show` (iproute2)");
    assert!(out.status.success(), "rdma resource show failed: {out:?}");
    ResourceCounts::parse(&String::from_utf8_lossy(&out.stdout))
}

impl ResourceCounts {
    /// Parses `rdma resource show` output (its first device).
    pub fn parse(text: &str) -> ResourceCounts {
        // "0: rxe0: pd 1 cq 2 qp 1 cm_id 0 mr 0 ctx 0 srq 0": key/value pairs after the name.
        let line = text.lines().next().unwrap_or_default();
        let mut counts = BTreeMap::new();
        let fields: Vec<&str> = line.split_whitespace().skip(2).collect();
        for pair in fields.chunks(2) {
            if let [k, v] = pair {
                if let Ok(v) = v.parse() {
                    counts.insert((*k).to_owned(), v);
                }
            }
        }
        ResourceCounts(counts)
    }
}

/// Asserts every tracked count returns to `baseline` (allowing the kernel a few seconds
/// to finish releasing cm_ids after TIMEWAIT).
pub fn assert_released(baseline: &ResourceCounts) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = resource_counts();
        let leaked: Vec<String> = TRACKED
            .iter()
            .filter(|k| now.get(k) != baseline.get(k))
            .map(|k| format!("{k}: {} -> {}", baseline.get(k), now.get(k)))
            .collect();
        if leaked.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "resources not released: {leaked:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A connected client/server pair on one PD.
pub struct Pair {
    /// Active side.
    pub client: Endpoint,
    /// Passive side.
    pub server: Endpoint,
}

/// Connects a client to a fresh listener; `server_prepare` and `client_prepare` run on
/// each QP before it becomes ready (post receives there).
pub fn connect_pair(
    pd: &ProtectionDomain,
    server_prepare: impl FnOnce(&QueuePair) -> Result<()> + Send,
    client_prepare: impl FnOnce(&QueuePair) -> Result<()>,
) -> Pair {
    let opts = EndpointOptions::default();
    let listener = Listener::bind(test_addr()).expect("bind listener");
    let addr = listener.local_addr().expect("listener address");
    std::thread::scope(|s| {
        let server = s.spawn(|| listener.accept(pd, &opts, b"srv", server_prepare));
        let client = blocking::connect(pd, addr, &opts, b"cli", client_prepare).expect("connect");
        let server = server.join().expect("server thread").expect("accept");
        assert_eq!(server.peer_data.get(..3), Some(&b"cli"[..]));
        Pair { client, server }
    })
}

/// Deterministic pseudo-random bytes (xorshift), so failures are reproducible.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

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

/// A path next to the test binary's `target/<profile>/` (for example the examples'
/// binaries, which `scripts/test` builds first).
pub fn target_bin(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe
        .parent()
        .and_then(|p| p.parent())
        .expect("target/<profile>");
    profile_dir.join(name)
}

/// Sends `payload` to an `echo` service and asserts it comes back unchanged.
pub async fn echo_ok(conn: &rdmactor::runtime::ClientConnection, payload: Vec<u8>) {
    use rdmactor_services::echo::{EchoRequest, EchoResponse};
    let resp: EchoResponse = conn
        .request_typed(&EchoRequest {
            payload: payload.clone(),
        })
        .await
        .expect("echo request");
    assert!(resp.payload == payload, "echo payload differs");
}

/// Waits until `server` has no connection left (each one released its resources).
pub async fn wait_idle(server: &rdmactor::runtime::Server, what: &str, timeout: Duration) {
    eventually(what, timeout, || async {
        server.stats().await.connections == 0
    })
    .await;
}

/// Closes `conns`, waits until `server` has released them, checks every pool lease came
/// back, and shuts `client` down.
pub async fn close_all(
    server: &rdmactor::runtime::Server,
    client: rdmactor::runtime::Client,
    conns: Vec<rdmactor::runtime::ClientConnection>,
) {
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
pub async fn assert_leases_returned(server: &rdmactor::runtime::Server) {
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

/// Opens `n` connections to `service` at `addr`, one after another.
pub async fn connect_n(
    client: &rdmactor::runtime::Client,
    addr: std::net::SocketAddr,
    service: &str,
    n: usize,
) -> Vec<rdmactor::runtime::ClientConnection> {
    let mut conns = Vec::with_capacity(n);
    for i in 0..n {
        let conn = client.connect(addr, service).await;
        conns.push(conn.unwrap_or_else(|e| panic!("connect {i} to {service}: {e}")));
    }
    conns
}

/// A server on the test address offering `service` as `name`, its address, and a client
/// (inside an actix System).
pub fn serve(
    name: &str,
    service: impl rdmactor::runtime::Service,
) -> (
    rdmactor::runtime::Server,
    std::net::SocketAddr,
    rdmactor::runtime::Client,
) {
    serve_with(rdmactor::runtime::NodeConfig::default(), name, service)
}

/// [`serve`] with the server's node configured by `config` (the client's stays default).
pub fn serve_with(
    config: rdmactor::runtime::NodeConfig,
    name: &str,
    service: impl rdmactor::runtime::Service,
) -> (
    rdmactor::runtime::Server,
    std::net::SocketAddr,
    rdmactor::runtime::Client,
) {
    let server = rdmactor::runtime::Server::builder()
        .config(config)
        .listen(test_addr(), None)
        .service(name, service)
        .start()
        .expect("server");
    let addr = server.local_addrs()[0];
    let client =
        rdmactor::runtime::Client::start(rdmactor::runtime::NodeConfig::default()).expect("client");
    (server, addr, client)
}

/// A node whose registered-memory pool has `room` bytes beyond the receive buffers it
/// reserves: the cap that rendezvous buffers, large leases and session registrations
/// share.
pub fn capped_pool(room: usize) -> rdmactor::runtime::NodeConfig {
    let pool = rdmactor::memory::PoolConfig::default();
    rdmactor::runtime::NodeConfig {
        pool: rdmactor::memory::PoolConfig {
            max_bytes: pool.reserved_smallest + room,
            ..pool
        },
        ..rdmactor::runtime::NodeConfig::default()
    }
}

/// Wraps a service and records why each of its connections closed (`CloseReason`'s
/// text), so tests can check the reason a misbehaving peer or session was given.
pub struct Recorded<S> {
    inner: S,
    reasons: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl<S> Recorded<S> {
    /// `inner`, recording into a list the caller reads (its `reasons`).
    pub fn new(inner: S) -> (Recorded<S>, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
        let reasons = std::sync::Arc::default();
        let rec = Recorded {
            inner,
            reasons: std::sync::Arc::clone(&reasons),
        };
        (rec, reasons)
    }
}

impl<S: rdmactor::runtime::Service> rdmactor::runtime::Service for Recorded<S> {
    fn framing(&self) -> rdmactor::runtime::Framing {
        self.inner.framing()
    }

    fn session(&self, peer: &rdmactor::runtime::PeerInfo) -> Box<dyn rdmactor::runtime::Session> {
        Box::new(RecordingSession {
            inner: self.inner.session(peer),
            reasons: self.reasons.clone(),
        })
    }
}

struct RecordingSession {
    inner: Box<dyn rdmactor::runtime::Session>,
    reasons: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl rdmactor::runtime::Session for RecordingSession {
    fn on_established(
        &mut self,
        cx: &mut rdmactor::runtime::SessionCx<'_>,
    ) -> Result<(), rdmactor::runtime::SessionError> {
        self.inner.on_established(cx)
    }
    fn on_message(
        &mut self,
        cx: &mut rdmactor::runtime::SessionCx<'_>,
        msg: rdmactor::runtime::Message,
    ) -> Result<(), rdmactor::runtime::SessionError> {
        self.inner.on_message(cx, msg)
    }
    fn on_op(
        &mut self,
        cx: &mut rdmactor::runtime::SessionCx<'_>,
        op: rdmactor::runtime::OpId,
        result: rdmactor::verbs::Result<()>,
    ) -> Result<(), rdmactor::runtime::SessionError> {
        self.inner.on_op(cx, op, result)
    }
    fn on_wake(
        &mut self,
        cx: &mut rdmactor::runtime::SessionCx<'_>,
        token: u64,
    ) -> Result<(), rdmactor::runtime::SessionError> {
        self.inner.on_wake(cx, token)
    }
    fn on_close(&mut self, reason: &rdmactor::runtime::CloseReason) {
        self.reasons.lock().unwrap().push(reason.to_string());
        self.inner.on_close(reason)
    }
}

/// This process's resident set size in KiB (`VmRSS` in `/proc/self/status`). The tests
/// run their server in-process, so its growth bounds what the server kept in memory.
pub fn rss_kib() -> u64 {
    status_kib("VmRSS")
}

/// Peak resident memory of this process, in KiB (`VmHWM`; reset it by writing `5` to
/// `/proc/self/clear_refs`).
pub fn peak_rss_kib() -> u64 {
    status_kib("VmHWM")
}

/// One `KEY:   N kB` line of `/proc/self/status`.
fn status_kib(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} line in /proc/self/status"))
}

/// Posts up to `count` SENDs of `bytes` (their contents chosen per index by `fill`) on a
/// blocking endpoint, keeping at most `window` in flight and never posting a receive, as
/// fast as the QP completes them. Stops early when `stop` returns true, when a SEND
/// fails (the server closed the connection) or when none completes for the endpoint's
/// timeout. Returns how many SENDs completed successfully.
pub fn flood_sends(
    ep: &Endpoint,
    buf: &mut rdmactor::verbs::MemoryRegion,
    bytes: usize,
    count: usize,
    window: usize,
    mut fill: impl FnMut(usize, &mut [u8]),
    stop: impl Fn() -> bool,
) -> usize {
    use rdmactor::verbs::{SendOp, SendWr};
    let (mut posted, mut done, mut inflight) = (0, 0, 0);
    while done < count {
        if posted < count && inflight < window && !stop() {
            // One buffer for every SEND: a SEND's bytes are read when it is processed,
            // and the tests that care about contents post them one at a time.
            fill(posted, &mut buf.as_mut_slice()[..bytes]);
            let wr = SendWr::new(
                posted as u64,
                SendOp::Send,
                Some(buf.sge(0..bytes).unwrap()),
            );
            if ep.qp.post_send(&wr).is_err() {
                break;
            }
            posted += 1;
            inflight += 1;
            if inflight < window && !stop() {
                continue;
            }
        }
        if inflight == 0 {
            break;
        }
        match ep.wait_any(1) {
            Ok(wcs) if wcs.iter().all(|wc| wc.ok().is_ok()) => {
                done += wcs.len();
                inflight -= wcs.len();
            }
            _ => break,
        }
    }
    done
}

/// Close reasons a test service records (see [`Recorded`]).
pub type Reasons = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

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

impl rdmactor::runtime::Service for Slow {
    fn session(&self, _peer: &rdmactor::runtime::PeerInfo) -> Box<dyn rdmactor::runtime::Session> {
        Box::new(SlowSession)
    }
}

struct SlowSession;

impl rdmactor::runtime::Session for SlowSession {
    fn on_message(
        &mut self,
        cx: &mut rdmactor::runtime::SessionCx<'_>,
        msg: rdmactor::runtime::Message,
    ) -> Result<(), rdmactor::runtime::SessionError> {
        std::thread::sleep(Duration::from_millis(1));
        let data = msg.data.clone();
        cx.reply(&msg, data)
    }
}
