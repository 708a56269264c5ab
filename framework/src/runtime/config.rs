//! Configuration shared by servers and clients.

use std::time::Duration;

use crate::memory::PoolConfig;

use super::poller::PollMode;

/// Sizing of a server's or client's device-level resources and of each connection.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// RDMA device name (`None`: the one rdma_cm routes to, opened on first use).
    pub device: Option<String>,
    /// CQ-polling threads; each also runs the actors of the connections it polls for.
    pub pollers: usize,
    /// How pollers wait.
    pub poll_mode: PollMode,
    /// Registered-memory pool.
    pub pool: PoolConfig,
    /// Receives pre-posted per framed connection (the peer's send credits) when
    /// `shared_recv` is `None`.
    pub recv_depth: u16,
    /// Receives of framed connections come from shared receive queues, with credits
    /// split into a share per connection and a reserve lent to busy ones; `None`: a
    /// receive queue of `recv_depth` buffers per connection.
    pub shared_recv: Option<SharedRecvConfig>,
    /// Size of each framed receive buffer; larger messages use rendezvous. 2 KiB: with
    /// shared receive queues each connection's share of buffers is 4 of these plus a
    /// slice of the reserve (9 KiB at 2 KiB, 18 KiB at 4 KiB); messages above it go by
    /// rendezvous (one RDMA READ more). A sender's limit is the smaller of its own and
    /// its peer's size (hello and welcome carry it).
    pub recv_size: u32,
    /// Receives pre-posted per raw connection.
    pub raw_recv_depth: u16,
    /// Send-queue depth per connection. Providers round a queue up to a power of two
    /// slots including one spare, so 2^n − 1 costs the least: under Soft-RoCE a send
    /// queue of 31 is 32 slots of 256 bytes (12 KiB with its header page), one of 32 is
    /// 64 slots (20 KiB), the largest part of an idle connection.
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
    /// [`MAX_MESSAGE`](super::MAX_MESSAGE)). A peer's rendezvous offer names its length
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
    /// Most completion queues the pollers create, over all of them. Connections share
    /// CQs (16,383 entries each, filled by reservation), so a server needs few; the
    /// cap keeps a pattern of reservations that fits no existing CQ from making the
    /// kernel allocate CQs without end. A connection that would need one more is
    /// refused with the reason.
    pub max_cqs: usize,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            device: None,
            pollers: 1,
            poll_mode: PollMode::EVENT,
            pool: PoolConfig::default(),
            recv_depth: 16,
            shared_recv: Some(SharedRecvConfig::default()),
            recv_size: 2048,
            raw_recv_depth: 8,
            send_depth: 31,
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
            max_cqs: 256,
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
    /// for them and for every member's send queue. 230 with the defaults: 230 × (4 + 31)
    /// + 128 = 8,178 entries, so two queues fill one CQ of 16,383.
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

impl NodeConfig {
    /// How long one request may go unacknowledged before it fails: the first try plus
    /// `retry_count` retransmissions, each after the ACK timeout. (Soft-RoCE adds up to
    /// a timer tick per try.)
    pub fn retry_span(&self) -> Duration {
        let timeout = Duration::from_nanos(4096u64 << self.ack_timeout.min(31));
        timeout * (u32::from(self.retry_count.min(6)) + 1)
    }

    /// The longest a connection to a peer that died silently (host crashed, cable cut)
    /// stays open: up to two keepalive periods until a probe goes out (silence is checked
    /// once per period), then the probe's [`retry_span`](Self::retry_span), rounded up to
    /// whole periods, plus one period (the probe is given up on even if the transport
    /// never fails it). A connection with requests in flight usually notices after one
    /// retry span. `None` without keepalive. With the defaults: 2 × 5 s + 2 × 5 s + 5 s =
    /// 25 s at most; the transport's own verdict (7 × 1.07 s after the probe) comes
    /// sooner, 12 to 18 s after the peer died.
    pub fn dead_peer_bound(&self) -> Option<Duration> {
        self.keepalive.filter(|k| !k.is_zero()).map(|k| {
            let span_periods = self.retry_span().as_nanos().div_ceil(k.as_nanos()) as u32;
            k * (2 + span_periods + 1)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_peer_bound_adds_two_keepalive_periods_to_the_retry_span() {
        let cfg = NodeConfig::default();
        // 4.096 µs × 2^18 = 1.07 s, tried 7 times.
        assert_eq!(cfg.retry_span(), Duration::from_nanos(4096 << 18) * 7);
        // Two periods to the probe, 7.5 s of retries (two periods), one more period.
        assert_eq!(cfg.dead_peer_bound(), Some(Duration::from_secs(25)));
        let none = NodeConfig {
            keepalive: None,
            ..NodeConfig::default()
        };
        assert_eq!(none.dead_peer_bound(), None);
        let max = NodeConfig {
            ack_timeout: 200,
            retry_count: 200,
            ..NodeConfig::default()
        };
        assert_eq!(max.retry_span(), Duration::from_nanos(4096 << 31) * 7);
    }
}
