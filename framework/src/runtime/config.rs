//! Configuration shared by servers and clients, in parts: the transport (device and
//! pollers), the registered-memory pool, the receive queues, and each connection's
//! limits and timers. Each part is handed whole to what it configures, and the whole is
//! checked once, by [`NodeConfig::validate`], when a server or client starts. "Off" is
//! always `None`; a zero duration where `None` is meant is an error, not a second
//! spelling of off.

use std::time::Duration;

use crate::memory::PoolConfig;
use crate::proto::credits::MIN_DEPTH;
use crate::proto::frame::HEADER_LEN;

use super::poller::PollMode;

/// Largest message a framed connection can carry (the frame's length field allows up to
/// 4 GiB); each connection's limit is [`ConnectionConfig::max_message`], 16 MiB by
/// default.
pub const MAX_MESSAGE: usize = 1 << 30;

/// Everything a server or client sizes: its parts, each with its own defaults.
///
/// ```
/// use std::time::Duration;
/// use rdmactor::runtime::{ConnectionConfig, NodeConfig};
///
/// let config = NodeConfig {
///     connection: ConnectionConfig {
///         keepalive: None,
///         idle_timeout: Some(Duration::from_secs(60)),
///         ..ConnectionConfig::default()
///     },
///     ..NodeConfig::default()
/// };
/// config.validate().expect("consistent");
/// ```
#[derive(Debug, Clone, Default)]
pub struct NodeConfig {
    /// The device and the threads that poll it.
    pub transport: TransportConfig,
    /// Registered-memory pool.
    pub pool: PoolConfig,
    /// Receive buffers of framed and raw connections.
    pub receives: ReceiveConfig,
    /// Each connection's limits and timers.
    pub connection: ConnectionConfig,
}

/// The device, and the threads polling its completion queues.
#[derive(Debug, Clone)]
pub struct TransportConfig {
    /// RDMA device name (`None`: the one rdma_cm routes to, opened on first use).
    pub device: Option<String>,
    /// CQ-polling threads; each also runs the actors of the connections it polls for.
    pub pollers: usize,
    /// How pollers wait.
    pub poll_mode: PollMode,
    /// Most completion queues the pollers create, over all of them. Connections share
    /// CQs (16,383 entries each, filled by reservation), so a server needs few; the
    /// cap keeps a pattern of reservations that fits no existing CQ from making the
    /// kernel allocate CQs without end. A connection that would need one more is
    /// refused with the reason.
    pub max_cqs: usize,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            device: None,
            pollers: 1,
            poll_mode: PollMode::EVENT,
            max_cqs: 256,
        }
    }
}

/// Receive buffers: how many each connection has posted, their size, and whether
/// framed connections share them.
#[derive(Debug, Clone)]
pub struct ReceiveConfig {
    /// Receives pre-posted per framed connection (the peer's send credits) when
    /// `shared` is `None`.
    pub depth: u16,
    /// Receives of framed connections come from shared receive queues, with credits
    /// split into a share per connection and a reserve lent to busy ones; `None`: a
    /// receive queue of `depth` buffers per connection.
    pub shared: Option<SharedRecvConfig>,
    /// Size of each framed receive buffer; larger messages use rendezvous. 2 KiB: with
    /// shared receive queues each connection's share of buffers is 4 of these plus a
    /// slice of the reserve (9 KiB at 2 KiB, 18 KiB at 4 KiB); messages above it go by
    /// rendezvous (one RDMA READ more). A sender's limit is the smaller of its own and
    /// its peer's size (hello and welcome carry it).
    pub size: u32,
    /// Receives pre-posted per raw connection.
    pub raw_depth: u16,
}

impl Default for ReceiveConfig {
    fn default() -> Self {
        ReceiveConfig {
            depth: 16,
            shared: Some(SharedRecvConfig::default()),
            size: 2048,
            raw_depth: 8,
        }
    }
}

/// One connection's queues, transport retries, timers and message limits.
#[derive(Debug, Clone)]
pub struct ConnectionConfig {
    /// Send-queue depth per connection. Providers round a queue up to a power of two
    /// slots including one spare, so 2^n − 1 costs the least: under Soft-RoCE a send
    /// queue of 15 is 16 slots of 256 bytes (8 KiB with its header page), one of 31 is
    /// 32 slots (12 KiB), one of 32 is 64 (20 KiB): the largest part of an idle
    /// connection, and every member's depth is also reserved in its poller's CQ. 15 by
    /// default: a framed connection's SENDs are bounded by its credits and its READs by
    /// `rendezvous_chunks` anyway (see `bench/notes/2026-11-29-idle-connections.md`);
    /// raise it for one-sided work with many requests in flight per connection.
    pub send_depth: u32,
    /// RNR retries this side's sends make (7: forever). Credits keep rdmactor peers from
    /// ever needing them; plain clients may.
    pub rnr_retry_count: u8,
    /// Transport retries (0..=6) a request makes before it fails with `RetryExceeded`:
    /// with [`ack_timeout`](Self::ack_timeout), how long a lost packet or a dead peer is
    /// retried. Given to rdma_cm for both directions of the connection. Not 7: Soft-RoCE
    /// reads 7 as "retry forever" (as the RNR count does), so a request to a dead host
    /// would never fail there (seen: `ib_write_bw`, whose retry count is 7, still
    /// retrying 90 s after its peer's host was killed).
    pub retry_count: u8,
    /// Local ACK timeout exponent: 4.096 µs × 2^`ack_timeout` before a request is
    /// retransmitted (18: 1.07 s, about what rdma_cm derives on RoCE). Short enough that
    /// a dead peer is noticed within seconds; not much shorter, because a retransmission
    /// resends everything after the lost packet (go-back-N): across a wire to a slow
    /// receiver, 268 ms (16) turned queueing delay into retransmission storms (see the
    /// README's known gaps).
    pub ack_timeout: u8,
    /// Probe a connection that has been silent this long (no completion of any kind)
    /// with a zero-length RDMA WRITE: a live peer's RC transport ACKs it without its
    /// application doing anything (plain verbs clients included); a dead one makes it
    /// fail with `RetryExceeded`, and the connection closes with
    /// [`CloseReason::PeerUnreachable`](super::CloseReason::PeerUnreachable). `None`:
    /// never probe (a peer that dies while both sides wait would hold its connection
    /// until the CM notices, which for a host that vanished is never).
    pub keepalive: Option<Duration>,
    /// A connection accepted but not established within this closes with
    /// [`CloseReason::HandshakeTimeout`](super::CloseReason::HandshakeTimeout),
    /// releasing its QP and buffers and its place under `max_connections`: a client
    /// that sends a connect request and never the final handshake message would
    /// otherwise hold them forever. The CM actor checks once a second, in order with the
    /// events (a connection is never closed while its ESTABLISHED waits in the actor's
    /// mailbox); the active side waits for rdma_cm's own verdict instead.
    pub handshake_timeout: Duration,
    /// Close a connection on which no message arrived for this long
    /// ([`CloseReason::IdleTimeout`](super::CloseReason::IdleTimeout)); `None`: never.
    /// Keepalive probes do not count as messages: they prove the peer is alive, not
    /// that it uses the connection. Ten minutes by default: far longer than a client
    /// that uses its connection stays silent, and without a limit a live peer that
    /// opens connections and says nothing holds its slots (and their QPs and
    /// receive buffers) for as long as it likes, since the kernel answers keepalive
    /// probes even for a stopped process.
    pub idle_timeout: Option<Duration>,
    /// Largest framed message a connection sends or accepts (at most
    /// [`MAX_MESSAGE`](MAX_MESSAGE)). A peer's rendezvous offer names its length
    /// and the receiver registers that much, so the peer must not choose it freely.
    pub max_message: usize,
    /// Bytes one connection may have registered for rendezvous messages at once, in each
    /// direction: offers received are READ into at most this much (more wait), offers
    /// sent keep at most this much exposed until the peer says Done. Counted against the
    /// pool's cap as well.
    pub rendezvous_budget: usize,
    /// How long a rendezvous offer we sent may wait for the peer's Done. A peer that
    /// never says it would keep the registration (and its window) forever; at the
    /// deadline the window is revoked, the memory freed and the connection closed.
    pub rendezvous_deadline: Duration,
    /// How long a message may wait for the memory pool before it fails: a large message
    /// of ours waiting to be registered for its offer, or a peer's offer waiting for its
    /// share of the heap budget. Waits are served first in, first out (see
    /// `memory/line.rs`); past this, the message fails with
    /// [`BudgetError::NoRoom`](crate::proto::budget::BudgetError::NoRoom) (ours is handed
    /// back to the session's `on_refused`, the peer's is refused to it) and the connection
    /// goes on. The pool stays full that long only when many offers are held by peers
    /// that do not READ them, each for up to `rendezvous_deadline`.
    pub pool_wait: Duration,
    /// Bytes of a peer's rendezvous offer fetched by one RDMA READ (at most the pool's
    /// largest class; the chunk is a pool buffer). Large messages are READ in chunks so
    /// that they never hold the poller thread for long and never reach the provider as
    /// one burst: Soft-RoCE answers a READ request in one go, and every other
    /// connection's packets wait behind it.
    pub rendezvous_chunk: usize,
    /// Most chunk READs one connection has in flight: what one large message may pin
    /// of the pool, and how far it runs ahead of other connections' traffic.
    pub rendezvous_chunks: u32,
    /// Most bytes of messages a connection may hold queued for sending (waiting for
    /// credits or for room in the send queue). A peer that stops receiving (a raw peer
    /// that posts no receives, a framed one that returns no credits) would otherwise make
    /// every answer to its requests pile up here; past this bound the connection closes
    /// with [`CloseReason::Backlog`](super::CloseReason::Backlog). One message is always
    /// accepted into an empty queue, however large (up to `MAX_MESSAGE`).
    pub max_queued_bytes: usize,
    /// Most work items (messages, one-sided operations) a connection may hold queued;
    /// bounds the per-item overhead of many small messages the same way.
    pub max_queued_sends: usize,
    /// Most closures of one connection running on the blocking pool at once
    /// ([`SessionCx::spawn_blocking`](crate::runtime::SessionCx::spawn_blocking),
    /// [`RequestCx::spawn_blocking`](crate::runtime::RequestCx::spawn_blocking)); the
    /// next ones wait in order. tokio's blocking pool is one for the whole process, so
    /// without this one client's requests could take every thread of it.
    pub blocking_per_connection: usize,
    /// Most closures one connection may have started and not finished (running and
    /// waiting); past it `spawn_blocking` answers [`BlockingError::Busy`](crate::runtime::BlockingError::Busy)
    /// at once, so waiting closures (and what they captured) are bounded too.
    pub blocking_queued_per_connection: usize,
    /// Most closures of all connections of one service running at once.
    pub blocking_per_service: usize,
}

impl Default for ConnectionConfig {
    fn default() -> Self {
        ConnectionConfig {
            send_depth: 15,
            rnr_retry_count: 7,
            retry_count: 6,
            ack_timeout: 18,
            keepalive: Some(Duration::from_secs(5)),
            handshake_timeout: Duration::from_secs(30),
            idle_timeout: Some(Duration::from_secs(600)),
            max_message: 16 << 20,
            rendezvous_budget: 32 << 20,
            rendezvous_deadline: Duration::from_secs(30),
            pool_wait: Duration::from_secs(30),
            rendezvous_chunk: 64 << 10,
            rendezvous_chunks: 4,
            max_queued_bytes: 16 << 20,
            max_queued_sends: 4096,
            blocking_per_connection: 4,
            blocking_queued_per_connection: 64,
            blocking_per_service: 64,
        }
    }
}

/// Sizing of the shared receive queues of framed connections (see
/// `proto/credits/reserve.rs` for the credit rules and their worst case).
#[derive(Debug, Clone)]
pub struct SharedRecvConfig {
    /// Credits each connection always has (receives guaranteed to it); at least
    /// [`MIN_DEPTH`](crate::proto::credits::MIN_DEPTH).
    pub share: u16,
    /// Most credits a busy connection may hold, its share included.
    pub max_credits: u16,
    /// Connections per shared queue. A queue holds `members × share + reserve`
    /// receives (Soft-RoCE allows 16,383 per SRQ and 1,023 SRQs) and reserves CQ entries
    /// for them and for every member's send queue. 230 with the defaults: 230 × (4 + 15)
    /// + 128 = 4,498 entries, so three queues fit one CQ of 16,383.
    pub members: u32,
    /// Credits of a queue lent to busy connections beyond their share.
    pub reserve: u32,
    /// Most credits of a queue's reserve the connections of one peer address may hold
    /// borrowed at once; `None`: no cap. Half the reserve by default
    /// ([`with_reserve`](Self::with_reserve) keeps it so): one client host that floods
    /// many connections cannot take all of it, and a second busy host always finds
    /// room (see `proto/credits/reserve.rs`).
    pub reserve_per_peer: Option<u32>,
    /// Empty queues kept (with their buffers) for the next connections; more are
    /// destroyed and their buffers returned to the pool as the last member leaves.
    pub keep_empty: usize,
}

impl Default for SharedRecvConfig {
    fn default() -> Self {
        SharedRecvConfig {
            share: 4,
            max_credits: 16,
            members: 230,
            reserve: 128,
            reserve_per_peer: Some(64),
            keep_empty: 1,
        }
    }
}

impl SharedRecvConfig {
    /// A reserve of `credits`, half of which one peer may borrow.
    pub fn with_reserve(self, credits: u32) -> Self {
        SharedRecvConfig {
            reserve: credits,
            reserve_per_peer: Some(credits / 2),
            ..self
        }
    }

    /// Receives posted to each queue.
    pub fn depth(&self) -> u32 {
        self.members * u32::from(self.share) + self.reserve
    }
}

impl ConnectionConfig {
    /// How long one request may go unacknowledged before it fails: the first try plus
    /// `retry_count` retransmissions, each after the ACK timeout. (Soft-RoCE adds up to
    /// a timer tick per try.)
    pub fn retry_span(&self) -> Duration {
        let timeout = Duration::from_nanos(4096u64 << self.ack_timeout.min(31));
        timeout * (u32::from(self.retry_count.min(6)) + 1)
    }

    /// Keepalive checks a probe may stay unanswered, with nothing heard, before the
    /// peer is declared unreachable: the retry span rounded up to whole periods, plus
    /// one (the probe is given up on even if the transport never fails it; see
    /// `connection/liveness.rs`). `None` without keepalive.
    pub(crate) fn keepalive_patience(&self) -> Option<(Duration, u32)> {
        self.keepalive.map(|period| {
            let period_ns = period.as_nanos().max(1);
            let span_periods = self.retry_span().as_nanos().div_ceil(period_ns);
            (period, (span_periods + 1).min(u128::from(u32::MAX)) as u32)
        })
    }

    /// The longest a connection to a peer that died silently (host crashed, cable cut)
    /// stays open: up to two keepalive periods until a probe goes out (silence is checked
    /// once per period), then the probe's patience (see `keepalive_patience`). `None`
    /// without keepalive. With the defaults: 2 × 5 s + 2 × 5 s + 5 s = 25 s at most; the
    /// transport's own verdict (7 × 1.07 s after the probe) comes sooner, 12 to 18 s
    /// after the peer died. A connection with requests in flight usually notices after
    /// one retry span.
    pub fn dead_peer_bound(&self) -> Option<Duration> {
        self.keepalive_patience()
            .map(|(period, patience)| period.saturating_mul(2 + patience))
    }
}

impl NodeConfig {
    /// Checks the parts against each other and against what the transport allows; a
    /// server or client refuses to start with the first inconsistency, named.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let t = &self.transport;
        let r = &self.receives;
        let c = &self.connection;
        if t.pollers == 0 {
            return Err(ConfigError::Zero("transport.pollers"));
        }
        if t.max_cqs == 0 {
            return Err(ConfigError::Zero("transport.max_cqs"));
        }
        for (field, off) in [
            ("connection.keepalive", c.keepalive),
            ("connection.idle_timeout", c.idle_timeout),
        ] {
            if off == Some(Duration::ZERO) {
                return Err(ConfigError::ZeroForOff(field));
            }
        }
        for (field, d) in [
            ("connection.handshake_timeout", c.handshake_timeout),
            ("connection.rendezvous_deadline", c.rendezvous_deadline),
            ("connection.pool_wait", c.pool_wait),
        ] {
            if d.is_zero() {
                return Err(ConfigError::Zero(field));
            }
        }
        if c.retry_count > 6 {
            return Err(ConfigError::RetryCount(c.retry_count));
        }
        if c.ack_timeout > 31 {
            return Err(ConfigError::AckTimeout(c.ack_timeout));
        }
        if c.send_depth < 2 {
            return Err(ConfigError::SendDepth(c.send_depth));
        }
        for (field, n) in [
            (
                "connection.blocking_per_connection",
                c.blocking_per_connection,
            ),
            (
                "connection.blocking_queued_per_connection",
                c.blocking_queued_per_connection,
            ),
            ("connection.blocking_per_service", c.blocking_per_service),
        ] {
            if n == 0 {
                return Err(ConfigError::Zero(field));
            }
        }
        if c.max_message == 0 || c.max_message > MAX_MESSAGE {
            return Err(ConfigError::MaxMessage(c.max_message));
        }
        let largest = self.pool.classes.last().copied().unwrap_or(0);
        if c.rendezvous_chunk == 0 || c.rendezvous_chunk > largest {
            return Err(ConfigError::RendezvousChunk {
                chunk: c.rendezvous_chunk,
                largest,
            });
        }
        if c.rendezvous_chunks == 0 {
            return Err(ConfigError::Zero("connection.rendezvous_chunks"));
        }
        if (r.size as usize) <= HEADER_LEN || r.size as usize > largest {
            return Err(ConfigError::ReceiveSize {
                size: r.size,
                largest,
            });
        }
        if u32::from(r.depth) < MIN_DEPTH {
            return Err(ConfigError::Credits("receives.depth", u32::from(r.depth)));
        }
        if r.raw_depth == 0 {
            return Err(ConfigError::Zero("receives.raw_depth"));
        }
        if let Some(shared) = &r.shared {
            if u32::from(shared.share) < MIN_DEPTH {
                return Err(ConfigError::Credits(
                    "receives.shared.share",
                    shared.share.into(),
                ));
            }
            if shared.max_credits < shared.share {
                return Err(ConfigError::MaxCredits {
                    max: shared.max_credits,
                    share: shared.share,
                });
            }
            if shared.members == 0 {
                return Err(ConfigError::Zero("receives.shared.members"));
            }
            if shared.reserve_per_peer == Some(0) {
                return Err(ConfigError::ZeroForOff("receives.shared.reserve_per_peer"));
            }
        }
        Ok(())
    }
}

/// What [`NodeConfig::validate`] found inconsistent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A count or duration that must not be zero is.
    #[error("{0} must not be zero")]
    Zero(&'static str),
    /// A limit that is off when `None` was given as zero.
    #[error("{0} is zero: write None to turn it off")]
    ZeroForOff(&'static str),
    /// More transport retries than the transport can count (7 means "forever" to
    /// Soft-RoCE; see `ConnectionConfig::retry_count`).
    #[error("connection.retry_count {0} is above 6")]
    RetryCount(u8),
    /// A send queue too shallow to carry data: one slot is always kept for the frames
    /// that grant credits or say goodbye.
    #[error("connection.send_depth {0} is below 2 (one slot is kept for credit and close frames)")]
    SendDepth(u32),
    /// An ACK timeout exponent past what the QP attribute holds.
    #[error("connection.ack_timeout {0} is above 31")]
    AckTimeout(u8),
    /// A message limit of zero or above what a frame can carry.
    #[error("connection.max_message {0} is not within 1..={max}", max = MAX_MESSAGE)]
    MaxMessage(usize),
    /// Rendezvous chunks are pool buffers: none may exceed the pool's largest class.
    #[error("connection.rendezvous_chunk {chunk} is not within 1..={largest} (the pool's largest class)")]
    RendezvousChunk {
        /// The chunk asked for.
        chunk: usize,
        /// The pool's largest class.
        largest: usize,
    },
    /// Receive buffers must hold a frame header and come from the pool.
    #[error("receives.size {size} must exceed a frame header and fit the pool's largest class ({largest})")]
    ReceiveSize {
        /// The size asked for.
        size: u32,
        /// The pool's largest class.
        largest: usize,
    },
    /// Too few credits for the window (one is kept for frames that grant credits).
    #[error("{0} is {1}: the credit window needs at least {MIN_DEPTH}")]
    Credits(&'static str, u32),
    /// A shared queue's most credits per connection below its share.
    #[error("receives.shared.max_credits {max} is below the share {share}")]
    MaxCredits {
        /// `max_credits`.
        max: u16,
        /// `share`.
        share: u16,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_peer_bound_adds_two_keepalive_periods_to_the_probes_patience() {
        let cfg = ConnectionConfig::default();
        // 4.096 µs × 2^18 = 1.07 s, tried 7 times.
        assert_eq!(cfg.retry_span(), Duration::from_nanos(4096 << 18) * 7);
        // 7.5 s of retries is two periods, plus one: a patience of three checks.
        assert_eq!(cfg.keepalive_patience(), Some((Duration::from_secs(5), 3)));
        // Two periods to the probe, then the patience.
        assert_eq!(cfg.dead_peer_bound(), Some(Duration::from_secs(25)));
        let none = ConnectionConfig {
            keepalive: None,
            ..ConnectionConfig::default()
        };
        assert_eq!(none.dead_peer_bound(), None);
        let max = ConnectionConfig {
            ack_timeout: 200,
            retry_count: 200,
            ..ConnectionConfig::default()
        };
        assert_eq!(max.retry_span(), Duration::from_nanos(4096 << 31) * 7);
    }

    #[test]
    fn the_defaults_are_valid() {
        NodeConfig::default().validate().expect("defaults");
    }

    #[test]
    fn off_is_none_and_zero_is_refused_with_the_field_named() {
        let mut cfg = NodeConfig::default();
        cfg.connection.keepalive = Some(Duration::ZERO);
        let e = cfg.validate().unwrap_err();
        assert_eq!(e, ConfigError::ZeroForOff("connection.keepalive"));
        assert!(e.to_string().contains("write None"), "{e}");
        cfg.connection.keepalive = None;
        cfg.connection.idle_timeout = None;
        cfg.validate().expect("None is off");
    }

    #[test]
    fn inconsistent_parts_are_named() {
        let bad = |f: fn(&mut NodeConfig)| {
            let mut cfg = NodeConfig::default();
            f(&mut cfg);
            cfg.validate().unwrap_err()
        };
        assert_eq!(
            bad(|c| c.connection.retry_count = 7),
            ConfigError::RetryCount(7)
        );
        assert_eq!(
            bad(|c| c.connection.send_depth = 1),
            ConfigError::SendDepth(1)
        );
        assert!(matches!(
            bad(|c| c.connection.rendezvous_chunk = 1 << 30),
            ConfigError::RendezvousChunk { .. }
        ));
        assert!(matches!(
            bad(|c| c.receives.size = 8),
            ConfigError::ReceiveSize { size: 8, .. }
        ));
        assert_eq!(
            bad(|c| c.receives.depth = 1),
            ConfigError::Credits("receives.depth", 1)
        );
        assert_eq!(
            bad(|c| c.connection.max_message = 0),
            ConfigError::MaxMessage(0)
        );
        assert_eq!(
            bad(|c| c.transport.pollers = 0),
            ConfigError::Zero("transport.pollers")
        );
        assert!(matches!(
            bad(|c| {
                if let Some(s) = c.receives.shared.as_mut() {
                    s.max_credits = 2;
                }
            }),
            ConfigError::MaxCredits { .. }
        ));
    }
}
