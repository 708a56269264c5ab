//! `bench_native` (issue 30): what rdmactor itself costs, measured in one process over
//! the in-memory loopback transport, each figure next to a floor measured in the same
//! run on the same transport without rdmactor's runtime.
//!
//! One module per group of figures:
//!
//! - [`floors`]: the bare loopback transport (SEND ping-pong, SEND rate, an 8 MiB READ):
//!   what a runtime over it could at best do.
//! - [`latency`]: 64 B echo round trips through the client-side session and the async
//!   request API.
//! - [`rate`]: the server's CPU per request and the requests one poller serves (16 and
//!   1,000 connections), and one-way messages into `discard`.
//! - [`bulk`]: 8 MiB echoes, and what they do to a small client's p99.
//! - [`setup`]: connection setup, and the heap an idle connection holds (in a process of
//!   its own, `bench_native_heap`, whose counting allocator would tax the other figures).
//! - [`auth`]: what proving an identity costs a connect and a round trip.
//!
//! Around them: [`host`] runs a server in an actix System on a thread of its own and
//! knows that server's threads; [`cpu`] reads a thread's CPU time; [`stats`] holds a
//! figure's repetitions and prints its `RESULT` line and table row.

pub mod auth;
pub mod bulk;
pub mod cpu;
pub mod floors;
pub mod host;
pub mod latency;
pub mod rate;
pub mod setup;
pub mod stats;

use std::net::SocketAddr;
use std::time::Duration;

use rdmactor::runtime::{NodeConfig, PollMode};

/// How long and how often each figure is measured.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Repetitions of each figure (the value is their median, the spread their range).
    pub reps: usize,
    /// Length of one timed window of a rate figure.
    pub window: Duration,
    /// Round trips of one latency repetition (fewer if `window` runs out first).
    pub round_trips: usize,
}

impl Plan {
    /// A timed window's round trips: at most [`round_trips`](Self::round_trips), and as
    /// many as fit in twice the window.
    pub fn latency_budget(&self) -> (usize, Duration) {
        (self.round_trips, self.window * 2)
    }
}

/// The listen address of server number `n` of the fabric (port 0: picked).
pub fn listen_addr(n: u8) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, n], 0))
}

/// The configuration every server and client of the bench uses: the defaults (one
/// poller per node, event mode with its 1 ms spin, shared receive queues), so that the
/// figures are what an application gets without tuning. For experiments only,
/// `BENCH_NATIVE_POLL=busy` makes every poller spin for ever, `BENCH_NATIVE_POLL=adaptive`
/// adapt its spin (`PollMode::ADAPTIVE`), and `BENCH_NATIVE_POLL=0` sleep as soon as its
/// CQs are empty; `BENCH_NATIVE_CHUNKS=N` lets each connection
/// have N rendezvous READs in flight instead of 4 (how much bulk work one poller turn
/// can hold, for the fairness figures), and `BENCH_NATIVE_CHUNK_KIB=K` makes each of
/// them K KiB instead of 64 (a poller's step of bulk work is one chunk at least).
pub fn config() -> NodeConfig {
    let mut config = NodeConfig::default();
    if let Some(n) = env_number("BENCH_NATIVE_CHUNKS") {
        config.connection.rendezvous_chunks = n;
    }
    if let Some(kib) = env_number::<usize>("BENCH_NATIVE_CHUNK_KIB") {
        config.connection.rendezvous_chunk = kib << 10;
    }
    match std::env::var("BENCH_NATIVE_POLL").as_deref() {
        Ok("busy") => config.transport.poll_mode = PollMode::Busy,
        Ok("adaptive") => config.transport.poll_mode = PollMode::ADAPTIVE,
        Ok("0") => {
            config.transport.poll_mode = PollMode::Event {
                spin: Duration::ZERO,
            }
        }
        _ => {}
    }
    config
}

/// The number in environment variable `name`, if it is set and parses.
fn env_number<N: std::str::FromStr>(name: &str) -> Option<N> {
    std::env::var(name).ok()?.parse().ok()
}

/// The encoded `EchoRequest` of `size` bytes (and, byte for byte, the `EchoResponse`
/// that answers it: both are one `serde_bytes` field, so postcard writes the same bytes).
pub fn echo_request(size: usize) -> Vec<u8> {
    let payload: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    postcard::to_allocvec(&rdmactor_services::echo::EchoRequest { payload })
        .expect("an echo request encodes")
}
