//! Counters read from outside (metrics, leak checks): kept apart so that what is
//! reported can grow without touching how memory is served.

use super::{ChunkSource, Pool};
use crate::memory::line::Line;

/// Counters for metrics and leak checks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes registered in arenas now.
    pub registered_bytes: usize,
    /// Bytes registered outside the pool and counted against its cap now
    /// ([`Pool::charge`]).
    pub charged_bytes: usize,
    /// The most `registered_bytes + charged_bytes` has been.
    pub peak_bytes: usize,
    /// Chunks leased right now, per class.
    pub leased: Vec<usize>,
    /// Arenas registered now, per class.
    pub arenas: Vec<usize>,
    /// Places taken in line since start ([`Pool::join_line`]): how often someone met a
    /// limit and waited for room.
    pub waits: u64,
    /// Waiting now, per line (smallest class, bulk, heap).
    pub waiting: [usize; 3],
    /// Leases refused at the cap since start.
    pub exhausted: u64,
    /// Heap bytes held by incoming messages now ([`Pool::charge_heap`]).
    pub heap_bytes: usize,
}

impl<S: ChunkSource> Pool<S> {
    /// Current counters.
    pub fn stats(&self) -> PoolStats {
        let state = self.shared.state.lock().expect("pool lock");
        PoolStats {
            registered_bytes: state.registered,
            charged_bytes: state.charged,
            peak_bytes: state.peak,
            leased: state.classes.iter().map(|c| c.leased).collect(),
            arenas: state.classes.iter().map(|c| c.arenas.len()).collect(),
            waits: state.waits,
            waiting: [Line::Smallest, Line::Bulk, Line::Heap].map(|l| state.lines.len(l)),
            exhausted: state.exhausted,
            heap_bytes: state.heap,
        }
    }
}

impl<S: ChunkSource> std::fmt::Debug for Pool<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("config", &self.shared.config)
            .field("stats", &self.stats())
            .finish()
    }
}
