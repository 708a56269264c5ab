//! Size-class pool. Registering memory costs a system call and pins pages, so the pool
//! registers large arenas on demand, splits each into equal chunks of one class, and
//! recycles chunks through free lists. The total is capped by configuration: when the cap
//! is reached a lease fails with [`PoolError::Exhausted`] instead of registering more.
//!
//! The bookkeeping is generic over where chunks come from ([`ChunkSource`]), so it is
//! tested without RDMA; [`MrPool`] is the pool over registered memory.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

use crate::verbs::{Access, MemoryRegion, ProtectionDomain, VerbsError};

/// Pool sizing.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Chunk sizes, ascending (for example 4 KiB, 64 KiB, 1 MiB).
    pub classes: Vec<usize>,
    /// Bytes registered at a time when a class runs dry (at least one chunk).
    pub arena_bytes: usize,
    /// Cap on bytes registered by the pool in all.
    pub max_bytes: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            classes: vec![4 << 10, 64 << 10, 1 << 20],
            arena_bytes: 4 << 20,
            max_bytes: 1 << 30,
        }
    }
}

/// Why a lease could not be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// Larger than the largest class.
    #[error("{len} bytes requested, the largest pool class is {largest}")]
    TooLarge {
        /// Bytes asked for.
        len: usize,
        /// Largest chunk size.
        largest: usize,
    },
    /// Registering another arena would pass the configured cap.
    #[error("memory pool exhausted: {class} B chunks all leased and {limit} B already registered")]
    Exhausted {
        /// The class that ran dry.
        class: usize,
        /// The configured cap.
        limit: usize,
    },
    /// Registering an arena failed.
    #[error("registering a pool arena failed: {0}")]
    Register(#[from] VerbsError),
}

/// Where a pool's chunks come from.
pub trait ChunkSource: Send + Sync + 'static {
    /// A chunk of memory.
    type Chunk: Send;
    /// Produces `count` chunks of `size` bytes (one arena's worth).
    fn grow(&self, size: usize, count: usize) -> Result<Vec<Self::Chunk>, PoolError>;
}

/// Registers arenas on a PD with local access only: remote access is granted per
/// operation, never to pooled memory.
#[derive(Debug, Clone)]
pub struct RegisteredChunks {
    pd: ProtectionDomain,
}

impl ChunkSource for RegisteredChunks {
    type Chunk = MemoryRegion;
    fn grow(&self, size: usize, count: usize) -> Result<Vec<MemoryRegion>, PoolError> {
        let arena = MemoryRegion::register(&self.pd, size * count, Access::LOCAL_WRITE)?;
        Ok(arena.split(size))
    }
}

/// The pool of registered memory.
pub type MrPool = Pool<RegisteredChunks>;

/// Counters for metrics and leak checks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes registered so far.
    pub registered_bytes: usize,
    /// Chunks leased right now, per class.
    pub leased: Vec<usize>,
}

struct Class<C> {
    size: usize,
    free: Vec<C>,
    leased: usize,
}

struct Shared<S: ChunkSource> {
    source: S,
    config: PoolConfig,
    state: Mutex<State<S::Chunk>>,
}

struct State<C> {
    classes: Vec<Class<C>>,
    registered: usize,
}

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

impl MrPool {
    /// A pool registering on `pd`.
    pub fn registered(pd: &ProtectionDomain, config: PoolConfig) -> MrPool {
        Pool::new(RegisteredChunks { pd: pd.clone() }, config)
    }
}

impl<S: ChunkSource> Pool<S> {
    /// A pool drawing from `source`.
    pub fn new(source: S, mut config: PoolConfig) -> Self {
        config.classes.sort_unstable();
        config.classes.dedup();
        let classes = config
            .classes
            .iter()
            .map(|&size| Class {
                size,
                free: Vec::new(),
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
                }),
            }),
        }
    }

    /// The largest chunk the pool hands out.
    pub fn largest(&self) -> usize {
        self.shared.config.classes.last().copied().unwrap_or(0)
    }

    /// Leases a chunk of at least `len` bytes (the smallest class that fits).
    pub fn lease(&self, len: usize) -> Result<Lease<S>, PoolError> {
        let cfg = &self.shared.config;
        let class =
            cfg.classes
                .iter()
                .position(|&size| size >= len)
                .ok_or(PoolError::TooLarge {
                    len,
                    largest: self.largest(),
                })?;
        let mut state = self.shared.state.lock().expect("pool lock");
        if state.classes[class].free.is_empty() {
            let size = state.classes[class].size;
            let count = (cfg.arena_bytes / size).max(1);
            let bytes = size * count;
            if state.registered + bytes > cfg.max_bytes {
                return Err(PoolError::Exhausted {
                    class: size,
                    limit: cfg.max_bytes,
                });
            }
            let chunks = self.shared.source.grow(size, count)?;
            state.registered += bytes;
            state.classes[class].free.extend(chunks);
        }
        let chunk = state.classes[class].free.pop().expect("refilled above");
        state.classes[class].leased += 1;
        Ok(Lease {
            chunk: Some(chunk),
            class,
            pool: self.shared.clone(),
        })
    }

    /// Current counters.
    pub fn stats(&self) -> PoolStats {
        let state = self.shared.state.lock().expect("pool lock");
        PoolStats {
            registered_bytes: state.registered,
            leased: state.classes.iter().map(|c| c.leased).collect(),
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

/// A chunk on loan from a pool; goes back to its free list when dropped.
pub struct Lease<S: ChunkSource = RegisteredChunks> {
    chunk: Option<S::Chunk>,
    class: usize,
    pool: Arc<Shared<S>>,
}

impl<S: ChunkSource> Deref for Lease<S> {
    type Target = S::Chunk;
    fn deref(&self) -> &S::Chunk {
        self.chunk.as_ref().expect("present until drop")
    }
}

impl<S: ChunkSource> DerefMut for Lease<S> {
    fn deref_mut(&mut self) -> &mut S::Chunk {
        self.chunk.as_mut().expect("present until drop")
    }
}

impl<S: ChunkSource> Drop for Lease<S> {
    fn drop(&mut self) {
        if let Some(chunk) = self.chunk.take() {
            let mut state = self.pool.state.lock().expect("pool lock");
            let class = &mut state.classes[self.class];
            class.leased -= 1;
            class.free.push(chunk);
        }
    }
}

impl<S: ChunkSource> std::fmt::Debug for Lease<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("class", &self.class).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Plain heap chunks, counting arenas, so the bookkeeping is tested without RDMA.
    #[derive(Default)]
    struct Heap {
        arenas: AtomicUsize,
    }

    impl ChunkSource for Heap {
        type Chunk = Vec<u8>;
        fn grow(&self, size: usize, count: usize) -> Result<Vec<Vec<u8>>, PoolError> {
            self.arenas.fetch_add(1, Ordering::Relaxed);
            Ok((0..count).map(|_| vec![0; size]).collect())
        }
    }

    fn pool(max: usize) -> Pool<Heap> {
        Pool::new(
            Heap::default(),
            PoolConfig {
                classes: vec![1024, 64, 256],
                arena_bytes: 1024,
                max_bytes: max,
            },
        )
    }

    #[test]
    fn smallest_fitting_class_is_used() {
        let p = pool(1 << 20);
        assert_eq!(p.lease(1).unwrap().len(), 64);
        assert_eq!(p.lease(65).unwrap().len(), 256);
        assert_eq!(p.lease(1024).unwrap().len(), 1024);
        assert!(matches!(
            p.lease(1025),
            Err(PoolError::TooLarge {
                len: 1025,
                largest: 1024
            })
        ));
    }

    #[test]
    fn leases_return_on_drop_and_are_reused() {
        let p = pool(1 << 20);
        let a = p.lease(64).unwrap();
        let b = p.lease(64).unwrap();
        assert_eq!(p.stats().leased, vec![2, 0, 0]);
        drop((a, b));
        assert_eq!(p.stats().leased, vec![0, 0, 0]);
        let held: Vec<_> = (0..16).map(|_| p.lease(64).unwrap()).collect();
        assert_eq!(
            p.shared.source.arenas.load(Ordering::Relaxed),
            1,
            "one arena of 16"
        );
        drop(held);
        assert_eq!(p.stats().registered_bytes, 1024);
    }

    #[test]
    fn exhaustion_is_an_error_not_a_panic() {
        let p = pool(2048);
        let held: Vec<_> = (0..2).map(|_| p.lease(1024).unwrap()).collect();
        let err = p.lease(1000).unwrap_err();
        assert!(
            matches!(
                err,
                PoolError::Exhausted {
                    class: 1024,
                    limit: 2048
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("exhausted"));
        drop(held);
        assert!(p.lease(1000).is_ok(), "freed chunks serve again");
    }

    #[test]
    fn leases_move_across_threads() {
        let p = pool(1 << 20);
        let leases: Vec<_> = (0..8).map(|_| p.lease(200).unwrap()).collect();
        std::thread::spawn(move || drop(leases)).join().unwrap();
        assert_eq!(p.stats().leased, vec![0, 0, 0]);
    }
}
