//! Size-class pool. Registering memory costs a system call and pins pages, so the pool
//! registers large arenas on demand, splits each into equal chunks of one class, and
//! recycles chunks through free lists. The total is capped by configuration: when the cap
//! is reached a lease fails with [`PoolError::Exhausted`] instead of registering more.
//!
//! Three rules keep one kind of use from starving another until a restart:
//!
//! - **Idle arenas go back.** An arena whose chunks have all come back is deregistered
//!   and freed as long as more than [`PoolConfig::keep_bytes`] stay registered, and any
//!   idle arena is reclaimed when a class needs room under the cap. A burst of 1 MiB
//!   leases no longer leaves the cap registered as 1 MiB chunks nobody uses.
//! - **Receive buffers keep a reservation.** Every class but the smallest (the one
//!   receives are posted in), together with memory registered outside the pool and
//!   counted against its cap ([`Pool::charge`], rendezvous buffers), may use at most
//!   `max_bytes - reserved_smallest`: bulk transfers can never take the last of the cap
//!   from the receive buffers new connections need.
//! - **A class that cannot grow borrows from a larger one.** When the cap stops a class
//!   from registering another arena, a free chunk of a larger class serves instead.
//!
//! The bookkeeping is generic over where chunks come from ([`ChunkSource`]), so it is
//! tested without RDMA; [`MrPool`] is the pool over registered memory.

mod charge;
mod class;
mod config;
mod error;
mod lease;
mod source;
mod state;
mod stats;
mod waiting;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use slab::Slab;

use super::line::Lines;
use crate::transport::{Transport, Verbs};
use class::Class;
use config::bulk_limit;
use state::{Shared, State};

pub use charge::{Charge, HeapCharge};
pub use config::PoolConfig;
pub use error::{PoolError, RegisterError};
pub use lease::Lease;
pub use source::{ChunkSource, RegisteredChunks};
pub use stats::PoolStats;
pub use waiting::PlaceInLine;

/// The pool of registered memory, on verbs unless said otherwise.
pub type MrPool<T = Verbs> = Pool<RegisteredChunks<T>>;

/// A size-class pool; cheap to clone, shareable across threads.
pub struct Pool<S: ChunkSource> {
    shared: Arc<Shared<S>>,
}

impl<S: ChunkSource> Clone for Pool<S> {
    fn clone(&self) -> Self {
        Pool {
            shared: self.shared.clone(),
        }
    }
}

impl<T: Transport> MrPool<T> {
    /// A pool registering on `domain` (a verbs `ProtectionDomain`, or another
    /// transport's).
    pub fn registered(domain: &T::Domain, config: PoolConfig) -> MrPool<T> {
        Pool::new(
            RegisteredChunks {
                domain: domain.clone(),
            },
            config,
        )
    }
}

impl<S: ChunkSource> Pool<S> {
    /// A pool drawing from `source`.
    pub fn new(source: S, mut config: PoolConfig) -> Self {
        config.classes.sort_unstable();
        config.classes.dedup();
        let arena_bytes = config.arena_bytes;
        let classes = config
            .classes
            .iter()
            .map(|&size| Class {
                size,
                count: (arena_bytes / size).max(1),
                arenas: Slab::new(),
                with_free: BTreeSet::new(),
                leased: 0,
            })
            .collect();
        Pool {
            shared: Arc::new(Shared {
                source,
                config,
                state: Mutex::new(State {
                    classes,
                    registered: 0,
                    registered_smallest: 0,
                    charged: 0,
                    heap: 0,
                    peak: 0,
                    lines: Lines::default(),
                    waits: 0,
                    exhausted: 0,
                }),
            }),
        }
    }

    /// The smallest size class.
    pub fn smallest(&self) -> usize {
        self.shared.config.classes.first().copied().unwrap_or(0)
    }

    /// The largest chunk the pool hands out.
    pub fn largest(&self) -> usize {
        self.shared.config.classes.last().copied().unwrap_or(0)
    }

    fn class_of(&self, len: usize) -> Option<usize> {
        self.shared
            .config
            .classes
            .iter()
            .position(|&size| size >= len)
    }

    /// The most [`charge_heap`](Self::charge_heap) can ever grant at once.
    pub fn heap_limit(&self) -> usize {
        self.shared.config.heap_bytes
    }

    /// The most a charge or a lease of a class other than the smallest can ever take:
    /// asks beyond it will never fit, however long they wait.
    pub fn bulk_limit(&self) -> usize {
        bulk_limit(&self.shared.config)
    }
}

#[cfg(test)]
mod tests;
