//! How big the pool may grow and what it keeps: the numbers every other part of the
//! pool reads, and the one limit derived from them, in one place so they agree.

/// Pool sizing.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Chunk sizes, ascending (for example 4 KiB, 64 KiB, 1 MiB).
    pub classes: Vec<usize>,
    /// Bytes registered at a time when a class runs dry (at least one chunk).
    pub arena_bytes: usize,
    /// Cap on bytes registered by the pool in all, including what [`Pool::charge`](super::Pool::charge)
    /// counts.
    pub max_bytes: usize,
    /// Bytes of the cap only the smallest class may use: the receive buffers every new
    /// connection needs stay available however much bulk memory is in use.
    pub reserved_smallest: usize,
    /// Idle arenas are kept (not deregistered) while no more than this many bytes are
    /// registered: re-registering costs a system call and page pinning, so a steady load
    /// should not pay it per lease.
    pub keep_bytes: usize,
    /// Bytes of incoming messages all connections together may hold in the heap while
    /// they arrive ([`Pool::charge_heap`](super::Pool::charge_heap): rendezvous messages being READ and
    /// assembled, which live in plain heap memory, not in the pool). Each connection is
    /// held to its own `rendezvous_budget` as well; without this bound, 1,024
    /// connections at 32 MiB each could make the server hold 32 GiB and meet the OOM
    /// killer. A message that does not fit waits its turn, like a lease at the cap.
    pub heap_bytes: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            // 2 KiB: framed receive buffers and small sends; 4 KiB: raw connections'
            // receives (plain verbs clients' usual size).
            classes: vec![2 << 10, 4 << 10, 64 << 10, 1 << 20],
            arena_bytes: 4 << 20,
            max_bytes: 1 << 30,
            // 8192 receive buffers of 2 KiB: seven shared receive queues (1,792
            // connections), or 512 connections of 16 receives each.
            reserved_smallest: 16 << 20,
            keep_bytes: 64 << 20,
            heap_bytes: 512 << 20,
        }
    }
}

pub(super) fn bulk_limit(config: &PoolConfig) -> usize {
    config.max_bytes.saturating_sub(config.reserved_smallest)
}
