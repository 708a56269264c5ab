//! Where chunks come from, behind a trait: the pool's bookkeeping is the same over
//! registered memory of any transport and over plain heap chunks, which is how it is
//! tested without RDMA.

use super::PoolError;
use crate::transport::{Domain, Region, Transport, Verbs};
use crate::verbs::Access;

/// Where a pool's chunks come from.
pub trait ChunkSource: Send + Sync + 'static {
    /// A chunk of memory.
    type Chunk: Send;
    /// Produces `count` chunks of `size` bytes (one arena's worth). The arena is released
    /// when the last of its chunks is dropped.
    fn grow(&self, size: usize, count: usize) -> Result<Vec<Self::Chunk>, PoolError>;
}

/// Registers arenas on a transport's protection domain (verbs by default) with local
/// access only: remote access is granted per operation, never to pooled memory.
#[derive(Debug, Clone)]
pub struct RegisteredChunks<T: Transport = Verbs> {
    pub(super) domain: T::Domain,
}

impl<T: Transport> ChunkSource for RegisteredChunks<T> {
    type Chunk = T::Region;
    fn grow(&self, size: usize, count: usize) -> Result<Vec<T::Region>, PoolError> {
        let arena = self
            .domain
            .register(size * count, Access::LOCAL_WRITE)
            .map_err(|e| PoolError::Register(Box::new(e)))?;
        Ok(arena.split(size))
    }
}
