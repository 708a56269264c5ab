//! What the CM actor counts, as `Server::stats` reads it (`GetCounters`).

/// Counters the CM actor keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CmCounters {
    pub connections: usize,
    /// QPs under the connection limit, rdma_cm and out-of-band together.
    pub qps: usize,
    pub accepted: u64,
    pub rejected: u64,
    pub closed: u64,
    /// Times the device was lost (removed or failed).
    pub device_losses: u64,
    /// Whether the device serves now.
    pub device_present: bool,
    /// Open connections proved with a key.
    pub authenticated: usize,
    /// The node's counters, while it exists.
    pub node: Option<NodeStats>,
}

/// Counters of the node's device resources.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NodeStats {
    pub pool: crate::memory::PoolStats,
    pub cqs: usize,
    pub shared_queues: Vec<u32>,
    pub shared_receives_posted: Vec<usize>,
    pub shared_reserves: Vec<super::ReserveStats>,
    pub shared_recv_buffers: usize,
}
