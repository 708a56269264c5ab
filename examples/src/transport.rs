//! The transport options the example binaries share: how long a lost packet or a dead
//! peer is retried, and when a silent connection is probed (see `ConnectionConfig`).

use std::time::Duration;

use rdmactor::runtime::{ConnectionConfig, NodeConfig, PollMode};

/// How pollers wait for completions (`--poll-mode`); the spin is `--spin-us`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollChoice {
    /// Spin `--spin-us` after the last completion, then sleep (0: sleep at once).
    Event,
    /// Spin after the last completion while it pays and the host has a core to spare
    /// (`--spin-us` at most), then sleep.
    Adaptive,
    /// Spin always: a core per poller.
    Busy,
}

impl PollChoice {
    /// The mode, with the default spin ([`TransportFlags::apply`] sets `--spin-us`).
    pub fn mode(self) -> PollMode {
        match self {
            PollChoice::Event => PollMode::EVENT,
            PollChoice::Adaptive => PollMode::ADAPTIVE,
            PollChoice::Busy => PollMode::Busy,
        }
    }
}

/// `--retry-count`, `--ack-timeout`, `--keepalive`, the handshake and idle timeouts,
/// where framed connections' receives come from, how large messages are READ, and how
/// long an event-mode poller spins.
#[derive(clap::Args, Debug, Clone)]
pub struct TransportFlags {
    /// Transport retries before a request to a silent peer fails (0..=6; Soft-RoCE reads
    /// 7 as forever).
    #[arg(long, default_value_t = ConnectionConfig::default().retry_count)]
    pub retry_count: u8,
    /// Local ACK timeout exponent: wait 4.096 µs × 2^N for an ACK before retransmitting
    /// (18: 1.07 s; 20: 4.3 s).
    #[arg(long, default_value_t = ConnectionConfig::default().ack_timeout)]
    pub ack_timeout: u8,
    /// Probe a connection that has been silent this many seconds, to notice a peer that
    /// died without a word (0: never).
    #[arg(long, default_value_t = ConnectionConfig::default().keepalive.map_or(0.0, |d| d.as_secs_f64()))]
    pub keepalive: f64,
    /// Close a connection not established within this many seconds.
    #[arg(long, default_value_t = ConnectionConfig::default().handshake_timeout.as_secs_f64())]
    pub handshake_timeout: f64,
    /// Close a connection on which no message arrived for this many seconds (0: never).
    #[arg(long, default_value_t = ConnectionConfig::default().idle_timeout.map_or(0.0, |d| d.as_secs_f64()))]
    pub idle_timeout: f64,
    /// Give each framed connection a receive queue of its own (16 buffers) instead of a
    /// share of a shared receive queue.
    #[arg(long)]
    pub per_connection_receives: bool,
    /// KiB of a peer's large message fetched per RDMA READ (at most the pool's largest
    /// class, 1 MiB).
    #[arg(long, default_value_t = ConnectionConfig::default().rendezvous_chunk >> 10)]
    pub rendezvous_chunk_kib: usize,
    /// Chunk READs one connection keeps in flight.
    #[arg(long, default_value_t = ConnectionConfig::default().rendezvous_chunks)]
    pub rendezvous_chunks: u32,
    /// Send-queue depth per connection: 2^n − 1 wastes no ring slot. Each slot is
    /// memory every idle connection holds (256 bytes under Soft-RoCE, and its share
    /// of a CQ); raise it for one-sided work with many requests in flight.
    #[arg(long, default_value_t = ConnectionConfig::default().send_depth)]
    pub send_depth: u32,
    /// Microseconds a poller keeps spinning after its last completion before it sleeps on
    /// the completion channel (0: sleep at once): in event mode (the default), always; in
    /// adaptive mode, at most. Spinning saves a wake-up per round trip but takes a core
    /// while traffic flows.
    #[arg(long, default_value_t = 1000)]
    pub spin_us: u64,
}

impl TransportFlags {
    /// `config` with these options. Zero on the command line means off, which the
    /// configuration writes as `None`; the rest is checked by `NodeConfig::validate`
    /// when the server or client starts.
    pub fn apply(&self, mut config: NodeConfig) -> NodeConfig {
        let secs = |s: f64| (s > 0.0).then(|| Duration::from_secs_f64(s));
        config.connection = ConnectionConfig {
            retry_count: self.retry_count,
            ack_timeout: self.ack_timeout,
            keepalive: secs(self.keepalive),
            handshake_timeout: Duration::from_secs_f64(self.handshake_timeout.max(0.001)),
            idle_timeout: secs(self.idle_timeout),
            rendezvous_chunk: self.rendezvous_chunk_kib << 10,
            rendezvous_chunks: self.rendezvous_chunks,
            send_depth: self.send_depth,
            ..config.connection
        };
        if self.per_connection_receives {
            config.receives.shared = None;
        }
        let spin = Duration::from_micros(self.spin_us);
        config.transport.poll_mode = match config.transport.poll_mode {
            PollMode::Event { .. } => PollMode::Event { spin },
            PollMode::Adaptive { .. } => PollMode::Adaptive { max_spin: spin },
            PollMode::Busy => PollMode::Busy,
        };
        config
    }
}
