//! Where chunks come from, behind a trait: the pool's bookkeeping is the same over
//! registered memory and over plain heap chunks, which is how it is tested without RDMA.

use super::PoolError;
use crate::verbs::{Access, MemoryRegion, ProtectionDomain};

/// Where a pool's chunks come from.
pub trait ChunkSource: Send + Sync + 'static {
    /// A chunk of memory.
    type Chunk: Send;
    /// Produces `count` chunks of `size` bytes (one arena's worth). The arena is released
    /// when the last of its chunks is dropped.
    fn grow(&self, size: usize, count: usize) -> Result<Vec<Self::Chunk>, PoolError>;
}

/// Registers arenas on a PD with local access only: remote access is granted per
/// operation, never to pooled memory.
#[derive(Debug, Clone)]
pub struct RegisteredChunks {
    pub(super) pd: ProtectionDomain,
}

impl ChunkSource for RegisteredChunks {
    type Chunk = MemoryRegion;
    fn grow(&self, size: usize, count: usize) -> Result<Vec<MemoryRegion>, PoolError> {
        let arena = MemoryRegion::register(&self.pd, size * count, Access::LOCAL_WRITE)?;
        Ok(arena.split(size))
    }
}
