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
    /// Receives pre-posted per framed connection (the peer's send credits).
    pub recv_depth: u16,
    /// Size of each framed receive buffer; larger messages use rendezvous.
    pub recv_size: u32,
    /// Receives pre-posted per raw connection.
    pub raw_recv_depth: u16,
    /// Send-queue depth per connection.
    pub send_depth: u32,
    /// RNR retries this side's sends make (7: forever). Credits keep rdmactor peers from
    /// ever needing them; plain clients may.
    pub rnr_retry_count: u8,
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
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            device: None,
            pollers: 1,
            poll_mode: PollMode::EVENT,
            pool: PoolConfig::default(),
            recv_depth: 16,
            recv_size: 4096,
            raw_recv_depth: 8,
            send_depth: 64,
            rnr_retry_count: 7,
            max_message: 16 << 20,
            rendezvous_budget: 32 << 20,
            rendezvous_deadline: Duration::from_secs(30),
            max_queued_bytes: 16 << 20,
            max_queued_sends: 4096,
        }
    }
}
