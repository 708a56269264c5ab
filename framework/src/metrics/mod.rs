//! Operational metrics: what the runtime and the services count, under fixed names,
//! through the [`metrics`] facade.
//!
//! Nothing is recorded until the application installs a recorder, for example
//! `metrics-exporter-prometheus` (the server example does with `--metrics ADDR:PORT`).
//! Without one, every call here costs a load of the facade's global and nothing else.
//! Install the recorder **before** starting servers and clients: connections register
//! their labelled handles when they are set up, each thread the handles of the
//! per-poll and per-message metrics on its first use, and a handle registered without a
//! recorder stays a no-op. Then call [`set_timing`]`(true)` for the histograms that
//! need a clock read per message (`rdmactor_echo_handling_seconds`): they stay off
//! otherwise, since the facade cannot tell whether a recorder is there.
//!
//! # The metrics
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `rdmactor_connections_open` | gauge | side, service | connections with a QP, set up and not yet torn down |
//! | `rdmactor_connections_accepted_total` | counter | service | connect requests the server accepted |
//! | `rdmactor_connections_rejected_total` | counter | reason (`unknown_service`, `version_mismatch`, `server_full`, `bad_hello`, `shutting_down`, `internal`) | connect requests the server refused |
//! | `rdmactor_connection_lifetime_seconds` | histogram | side, service | from QP creation to teardown |
//! | `rdmactor_messages_in_total`, `rdmactor_messages_out_total` | counter | side, service | whole messages delivered to / sent by sessions; each connection adds its count every 64 messages, on its keepalive timer and when it closes |
//! | `rdmactor_bytes_in_total`, `rdmactor_bytes_out_total` | counter | side, service | their payload bytes |
//! | `rdmactor_completion_errors_total` | counter | status | work completions with an error status (flushes included) |
//! | `rdmactor_send_stalls_total` | counter | | times a connection's queued sends had to wait for credits, send-queue slots or rendezvous budget; each poller thread adds its count every 64 and before it sleeps |
//! | `rdmactor_completions_unrouted_total` | counter | | completions for a QP with no registered connection, dropped (late flushes of a released connection; anything else is a bug) |
//! | `rdmactor_cq_poll_batch` | histogram | | completions returned by a non-empty CQ poll, one poll in [`TIMING_SAMPLE`] per thread |
//! | `rdmactor_pool_registered_bytes`, `rdmactor_pool_leased_chunks` | gauge | | the memory pool, sampled by [`record_pool`] |
//! | `rdmactor_pool_exhausted_total` | counter | | leases refused because the pool reached its cap, sampled by [`record_pool`] (the pool counts them itself, so `memory` does not depend on this module) |
//! | `rdmactor_pool_waits_total` | counter | | times a connection refused at one of the pool's limits took a place in its line (a rendezvous offer, an incoming message's heap share, a READ chunk) instead of closing |
//! | `rdmactor_pool_waiting` | gauge | `line` (`smallest`, `bulk`, `heap`) | places in the pool's lines now, sampled by [`record_pool`] |
//! | `rdmactor_pool_heap_bytes` | gauge | | heap counted against `PoolConfig::heap_bytes` (incoming messages, handler calls and transfers, lambda inputs), sampled by [`record_pool`] |
//! | `rdmactor_blocking_started` | gauge | | closures of sessions and handlers started on the blocking pool and not finished (running or waiting for their connection's or service's turn) |
//! | `rdmactor_handler_calls` | gauge | service | handler calls running or waiting, across the service's connections (bounded by `HandlerService::max_calls`) |
//! | `rdmactor_file_transfers_total` | counter | result (`good`, `bad`) | finished uploads, by hash verdict |
//! | `rdmactor_file_transfer_bytes_total` | counter | result | their bytes |
//! | `rdmactor_file_fetch_digests_total` | counter | source (`cached`, `hashed`) | fetches whose file's digest was known (stored or served before, unchanged since), or had to be read whole |
//! | `rdmactor_lambda_runs_total` | counter | kind (`module`, `native`), outcome | lambda invocations by result (`ok`, `trap`, `out_of_fuel`, `timeout`, `memory_limit`, `error`) |
//! | `rdmactor_lambda_module_loads_total` | counter | result (`cached`, `compiled`, `refused`) | lambda module uploads: already compiled (now held for the client too), compiled, or refused (invalid, too large, no room) |
//! | `rdmactor_lambda_module_evictions_total` | counter | | compiled modules that left the lambda cache: evicted for a client's quota or the cache's bounds, or let go by their last holder (its connection closed) |
//! | `rdmactor_echo_handling_seconds` | histogram | | echo service: the server's handling time only, from a request's delivery to its reply being queued (not the client's round trip, which the server cannot see); one request in [`TIMING_SAMPLE`] per poller thread, only after [`set_timing`]`(true)` |
//! | `rdmactor_device_events_total` | counter | event (`IBV_EVENT_PORT_ERR`, ...) | the device's asynchronous events |
//!
//! `side` is `server` or `client`: one process may be both (the integration tests are).

mod endpoint;

pub use endpoint::{serve, EndpointLimits};

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};

use crate::memory::PoolStats;
use crate::proto::hello::RejectCode;

/// Which end of a connection this process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Accepted by a server.
    Server,
    /// Initiated by a client.
    Client,
}

impl Side {
    fn label(self) -> &'static str {
        match self {
            Side::Server => "server",
            Side::Client => "client",
        }
    }
}

/// One connection's labelled handles, registered once when it is set up so that
/// counting is no registry lookup. Dropping it (with the connection) closes the
/// connection's account: what it still holds is counted, the open gauge goes down and
/// its lifetime is recorded.
///
/// Messages and bytes are counted here, in plain integers, and added to the shared
/// counters once per [`FLUSH_EVERY`] messages, on every [`flush`](Self::flush) (the
/// connection's timer: once per keepalive period while keepalive is on) and at the end. Four atomic adds
/// per message and side were most of what `--metrics` still cost a 64 B echo natively
/// (bench/notes/2026-11-27-metrics-ab.md); a scrape sees a connection's counts at most
/// that many messages or one keepalive period late, which Prometheus's own scrape
/// interval (15 s or so) mostly hides.
pub(crate) struct ConnectionMetrics {
    messages_in: Counter,
    bytes_in: Counter,
    messages_out: Counter,
    bytes_out: Counter,
    open: Gauge,
    lifetime: Histogram,
    since: Instant,
    /// Counted here and not yet added: messages in, bytes in, messages out, bytes out.
    held: [u64; 4],
}

/// Messages a connection counts before adding them to the shared counters.
const FLUSH_EVERY: u64 = 64;

impl ConnectionMetrics {
    /// Counts a new connection of `service` on `side`.
    pub(crate) fn new(side: Side, service: &str) -> Self {
        let labels = [
            ("side", side.label().to_string()),
            ("service", service.to_string()),
        ];
        let open = gauge!("rdmactor_connections_open", &labels);
        open.increment(1.0);
        ConnectionMetrics {
            messages_in: counter!("rdmactor_messages_in_total", &labels),
            bytes_in: counter!("rdmactor_bytes_in_total", &labels),
            messages_out: counter!("rdmactor_messages_out_total", &labels),
            bytes_out: counter!("rdmactor_bytes_out_total", &labels),
            open,
            lifetime: histogram!("rdmactor_connection_lifetime_seconds", &labels),
            since: Instant::now(),
            held: [0; 4],
        }
    }

    /// A message of `bytes` was delivered to the session.
    pub(crate) fn message_in(&mut self, bytes: usize) {
        self.held[0] += 1;
        self.held[1] += bytes as u64;
        self.maybe_flush();
    }

    /// The session sent a message of `bytes`.
    pub(crate) fn message_out(&mut self, bytes: usize) {
        self.held[2] += 1;
        self.held[3] += bytes as u64;
        self.maybe_flush();
    }

    fn maybe_flush(&mut self) {
        if self.held[0] + self.held[2] >= FLUSH_EVERY {
            self.flush();
        }
    }

    /// Adds what this connection counted since the last flush to the shared counters.
    pub(crate) fn flush(&mut self) {
        let [m_in, b_in, m_out, b_out] = std::mem::take(&mut self.held);
        if m_in > 0 {
            self.messages_in.increment(m_in);
            self.bytes_in.increment(b_in);
        }
        if m_out > 0 {
            self.messages_out.increment(m_out);
            self.bytes_out.increment(b_out);
        }
    }
}

impl Drop for ConnectionMetrics {
    fn drop(&mut self) {
        self.flush();
        self.open.decrement(1.0);
        self.lifetime.record(self.since.elapsed().as_secs_f64());
    }
}

/// The server accepted a connection to `service`.
pub(crate) fn accepted(service: &str) {
    counter!("rdmactor_connections_accepted_total", "service" => service.to_string()).increment(1);
}

/// A connection to `service` was refused at authentication for `reason` (a fixed
/// label: no identity, whose values are unbounded).
pub(crate) fn auth_refused(service: &str, reason: &'static str) {
    counter!("rdmactor_auth_refused_total", "service" => service.to_string(), "reason" => reason)
        .increment(1);
}

/// The device reported an asynchronous event (`IBV_EVENT_*`).
pub(crate) fn device_event(event: &'static str) {
    counter!("rdmactor_device_events_total", "event" => event).increment(1);
}

/// The server refused a connect request for `code`.
pub(crate) fn rejected(code: RejectCode) {
    let reason = match code {
        RejectCode::UnknownService => "unknown_service",
        RejectCode::VersionMismatch => "version_mismatch",
        RejectCode::ServerFull => "server_full",
        RejectCode::BadHello => "bad_hello",
        RejectCode::ShuttingDown => "shutting_down",
        RejectCode::Internal => "internal",
        RejectCode::Throttled => "throttled",
    };
    counter!("rdmactor_connections_rejected_total", "reason" => reason).increment(1);
}

thread_local! {
    /// The handles of the unlabelled metrics recorded per poll or per message, taken
    /// once per thread: `histogram!` and `counter!` look their key up in the recorder's
    /// registry on every call (a hash, a map lookup, a handle made and dropped), which was
    /// a third of what recording cost in the native bench's profile with `--metrics`
    /// (bench/notes/2026-11-27-metrics-ab.md). Taken on a thread's first use: like the
    /// connections' handles, they are live only if the recorder was installed before.
    static CQ_BATCH: Histogram = histogram!("rdmactor_cq_poll_batch");
    static SEND_STALLS: Counter = counter!("rdmactor_send_stalls_total");
    static ECHO_HANDLING: Histogram = histogram!("rdmactor_echo_handling_seconds");
}

thread_local! {
    /// Polls this thread has made since its last sampled one, modulo [`TIMING_SAMPLE`].
    static POLLS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// Send stalls counted on this thread and not yet added to the shared counter.
    static STALLS_HELD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Send stalls a thread counts before adding them to the shared counter (it also adds
/// them whenever its poller goes to sleep: [`flush_thread`]).
const STALLS_FLUSH_EVERY: u64 = 64;

/// A CQ poll returned `wcs` (not empty): counts error statuses, and records the batch
/// size of one poll in [`TIMING_SAMPLE`] per thread. Every poller thread pushing every
/// batch size into the one shared histogram made its buckets a cache line the cores
/// passed back and forth on each poll; a sample keeps the distribution's shape.
pub(crate) fn cq_batch(wcs: &[crate::verbs::WorkCompletion]) {
    if first_of_sample(&POLLS) {
        CQ_BATCH.with(|h| h.record(wcs.len() as f64));
    }
    for wc in wcs.iter().filter(|wc| !wc.is_ok()) {
        counter!("rdmactor_completion_errors_total", "status" => format!("{:?}", wc.status))
            .increment(1);
    }
}

/// A connection's send pump stopped with work still queued. Counted per thread and
/// added to the shared counter every [`STALLS_FLUSH_EVERY`] and whenever the thread's
/// poller goes to sleep: a windowed load stalls on most turns, and one shared atomic
/// incremented from every poller thread was the largest part of what `--metrics` still
/// cost it (bench/notes/2026-11-27-metrics-ab.md).
pub(crate) fn send_stalled() {
    let full = STALLS_HELD.with(|n| {
        n.set(n.get() + 1);
        n.get() >= STALLS_FLUSH_EVERY
    });
    if full {
        flush_thread();
    }
}

/// Adds what this thread counted and has not added yet to the shared metrics: the
/// pollers call it before they sleep.
pub(crate) fn flush_thread() {
    let held = STALLS_HELD.with(std::cell::Cell::take);
    if held > 0 {
        SEND_STALLS.with(|c| c.increment(held));
    }
}

/// `n` completions named a QP no connection is registered for (see `poller::route`).
pub(crate) fn completions_unrouted(n: usize) {
    counter!("rdmactor_completions_unrouted_total").increment(n as u64);
}

/// A connection refused at one of the pool's limits took a place in its line.
pub(crate) fn pool_wait() {
    counter!("rdmactor_pool_waits_total").increment(1);
}

/// Sets the pool gauges from `stats` (the server example samples
/// `Server::stats` once a second).
pub fn record_pool(stats: &PoolStats) {
    gauge!("rdmactor_pool_registered_bytes").set(stats.registered_bytes as f64);
    gauge!("rdmactor_pool_charged_bytes").set(stats.charged_bytes as f64);
    gauge!("rdmactor_pool_leased_chunks").set(stats.leased.iter().sum::<usize>() as f64);
    gauge!("rdmactor_pool_heap_bytes").set(stats.heap_bytes as f64);
    counter!("rdmactor_pool_exhausted_total").absolute(stats.exhausted);
    for (line, n) in ["smallest", "bulk", "heap"].iter().zip(stats.waiting) {
        gauge!("rdmactor_pool_waiting", "line" => *line).set(n as f64);
    }
}

/// The receives posted in each shared receive queue (`queue` is its index in
/// `ServerStats::shared_queues`), from `ServerStats::shared_receives_posted`.
pub fn record_shared_receives(posted: &[usize]) {
    for (i, n) in posted.iter().enumerate() {
        gauge!("rdmactor_shared_receives_posted", "queue" => i.to_string()).set(*n as f64);
    }
}

/// Shared queue `queue`'s credit reserve: credits free now, and the fewest ever free
/// (from `ServerStats::shared_reserves`).
pub fn record_shared_reserve(queue: usize, free: u32, lowest: u32) {
    let queue = queue.to_string();
    gauge!("rdmactor_shared_reserve_free", "queue" => queue.clone()).set(f64::from(free));
    gauge!("rdmactor_shared_reserve_lowest", "queue" => queue).set(f64::from(lowest));
}

/// A blocking closure started (`+1.0`) or finished (`-1.0`).
pub(crate) fn blocking_started(delta: f64) {
    gauge!("rdmactor_blocking_started").increment(delta);
}

/// Handler calls of `service` running or waiting, as a gauge.
pub(crate) fn handler_calls(service: &str, now: usize) {
    gauge!("rdmactor_handler_calls", "service" => service.to_owned()).set(now as f64);
}

/// A file upload finished with the hash verdict `good` (or not) after `bytes`.
pub fn file_transfer(good: bool, bytes: u64) {
    let result = if good { "good" } else { "bad" };
    counter!("rdmactor_file_transfers_total", "result" => result).increment(1);
    counter!("rdmactor_file_transfer_bytes_total", "result" => result).increment(bytes);
}

/// A file to fetch got its digest from the service's store of known digests
/// (`cached`) or by reading it whole.
pub fn file_fetch_digest(cached: bool) {
    let source = if cached { "cached" } else { "hashed" };
    counter!("rdmactor_file_fetch_digests_total", "source" => source).increment(1);
}

/// A lambda invocation ended: `kind` is `module` or `native`, `outcome` one of `ok`,
/// `trap`, `out_of_fuel`, `timeout`, `memory_limit`, `error`.
pub fn lambda_run(kind: &'static str, outcome: &'static str) {
    counter!("rdmactor_lambda_runs_total", "kind" => kind, "outcome" => outcome).increment(1);
}

/// Whether the metrics that need a clock read per message (the echo service's
/// handling time) are taken. Off until [`set_timing`] turns it on.
static TIMING: AtomicBool = AtomicBool::new(false);

/// Turns on (or off) the metrics that cost a clock read per message: the echo
/// service's handling time. Call it when installing a recorder, as the server example
/// does with `--metrics`. Why a switch: the `metrics` facade cannot say whether a
/// recorder is installed, so without one the echo service read the clock twice per
/// request for a histogram nobody kept, a visible share of its CPU per request in the
/// native bench's profile (bench/notes/2026-11-27-hot-path.md). Counters and gauges
/// need no switch: without a recorder they cost a load of the facade's global.
pub fn set_timing(on: bool) {
    TIMING.store(on, Ordering::Relaxed);
}

/// True when [`set_timing`] turned the per-message timings on: a service reads the
/// clock for them only then.
pub fn timing() -> bool {
    TIMING.load(Ordering::Relaxed)
}

/// One message in this many is timed by [`sample_timing`] (and one CQ poll in this many
/// sizes the batch histogram). Under 1% of requests: a timed request pays two clock
/// reads and a histogram push, and at 1 in 8 those requests made the native echo's p99
/// 10 to 15% longer with metrics on (bench/notes/2026-11-27-metrics-ab.md); at 1 in
/// 128 they are beyond the p99, and a server busy enough to care still records
/// hundreds a second.
pub const TIMING_SAMPLE: u32 = 128;

thread_local! {
    /// Messages this thread asked [`sample_timing`] about, modulo [`TIMING_SAMPLE`].
    static SAMPLED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Counts one more call on `calls` (a thread's count, modulo [`TIMING_SAMPLE`]) and
/// says whether it is the first of its run of [`TIMING_SAMPLE`]: the one sampled.
fn first_of_sample(calls: &'static std::thread::LocalKey<std::cell::Cell<u32>>) -> bool {
    calls.with(|n| {
        let i = n.get();
        n.set(if i + 1 >= TIMING_SAMPLE { 0 } else { i + 1 });
        i == 0
    })
}

/// True for one call in [`TIMING_SAMPLE`] on each thread while [`timing`] is on: a
/// service times that message only. Two clock reads per message were the largest part
/// of what `--metrics` cost an echo round trip in the native A/B (about 10% of the 64 B
/// echo's p50, bench/notes/2026-11-27-metrics-ab.md); a histogram of handling times
/// keeps its shape with a sample, and the number of messages is in the message
/// counters.
pub fn sample_timing() -> bool {
    timing() && first_of_sample(&SAMPLED)
}

/// The echo service answered a request `since` it was delivered: its handling time on
/// the server, not a round trip. Taken only while [`timing`] is on, for one request in
/// [`TIMING_SAMPLE`] ([`sample_timing`]).
pub fn echo_handled(since: Instant) {
    let secs = since.elapsed().as_secs_f64();
    ECHO_HANDLING.with(|h| h.record(secs));
}

/// A lambda module upload ended: `result` is `cached` (compiled before: now held for
/// this client too), `compiled` or `refused`.
pub fn lambda_module_load(result: &'static str) {
    counter!("rdmactor_lambda_module_loads_total", "result" => result).increment(1);
}

/// `n` compiled modules left the lambda module cache.
pub fn lambda_modules_evicted(n: u64) {
    if n > 0 {
        counter!("rdmactor_lambda_module_evictions_total").increment(n);
    }
}
