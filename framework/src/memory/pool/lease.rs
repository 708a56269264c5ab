//! Leasing chunks: the order in which a lease is served (a free chunk, a new arena
//! with room made under the cap, a larger class's chunk) and the return on drop, which
//! gives idle arenas back and wakes whoever waits.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use super::class::Arena;
use super::config::bulk_limit;
use super::state::{class_line, Shared, REGISTERED};
use super::waiting::PlaceInLine;
use super::{ChunkSource, Pool, PoolError, RegisteredChunks};

impl<S: ChunkSource> Pool<S> {
    /// Leases a chunk of at least `len` bytes: the smallest class that fits, registering
    /// another arena for it if it has no free chunk (reclaiming idle arenas of other
    /// classes if the cap requires), else a free chunk of a larger class. Leaves what the
    /// head of the line waits for (see [`join_line`](Self::join_line)).
    pub fn lease(&self, len: usize) -> Result<Lease<S>, PoolError> {
        self.lease_in_turn(len, None)
    }

    /// [`lease`](Self::lease) as the waiter holding `place` (if any): ahead of everyone
    /// behind it in line.
    pub fn lease_in_turn(
        &self,
        len: usize,
        place: Option<&PlaceInLine<S>>,
    ) -> Result<Lease<S>, PoolError> {
        let who = self.who(place);
        let class = self.class_of(len).ok_or(PoolError::TooLarge {
            len,
            largest: self.largest(),
        })?;
        let mut released = Vec::new();
        let result = self.lease_class(class, who, &mut released);
        drop(released);
        result
    }

    fn lease_class(
        &self,
        class: usize,
        who: Option<u64>,
        released: &mut Vec<Vec<S::Chunk>>,
    ) -> Result<Lease<S>, PoolError> {
        let cfg = &self.shared.config;
        let line = class_line(class);
        let mut state = self.shared.state.lock().expect("pool lock");
        if let Some(id) = who {
            state.lines.retrying(line, id);
        }
        let reserved = state.lines.reserved(line, who);
        let lease = |(arena, chunk), class| Lease {
            chunk: Some(chunk),
            class,
            arena,
            pool: self.shared.clone(),
        };
        if state.classes[class].may_take(class, reserved) {
            let taken = state.classes[class]
                .take()
                .expect("may_take saw a free chunk");
            return Ok(lease(taken, class));
        }
        let bytes = state.classes[class].arena_bytes();
        if state.make_room(
            cfg,
            bytes + reserved.bytes,
            class == 0,
            Some(class),
            released,
        ) {
            let (size, count) = (state.classes[class].size, state.classes[class].count);
            let chunks = self.shared.source.grow(size, count)?;
            state.registered += bytes;
            if class == 0 {
                state.registered_smallest += bytes;
            }
            state.note_peak();
            let c = &mut state.classes[class];
            let id = c.arenas.insert(Arena {
                chunks: chunks.len(),
                free: chunks,
            });
            c.with_free.insert(id);
            let taken = c.take().expect("a fresh arena has chunks");
            return Ok(lease(taken, class));
        }
        for larger in class + 1..state.classes.len() {
            if state.classes[larger].may_take(larger, reserved) {
                let taken = state.classes[larger]
                    .take()
                    .expect("may_take saw a free chunk");
                return Ok(lease(taken, larger));
            }
        }
        state.exhausted += 1;
        Err(PoolError::Exhausted {
            class: state.classes[class].size,
            limit: if class == 0 {
                cfg.max_bytes
            } else {
                bulk_limit(cfg)
            },
        })
    }
}

/// A chunk on loan from a pool; goes back to its free list when dropped, and its arena
/// back to the system once wholly idle (above [`PoolConfig::keep_bytes`](super::PoolConfig::keep_bytes)).
pub struct Lease<S: ChunkSource = RegisteredChunks> {
    chunk: Option<S::Chunk>,
    class: usize,
    arena: usize,
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
        let Some(chunk) = self.chunk.take() else {
            return;
        };
        let mut released = Vec::new();
        let mut state = self.pool.state.lock().expect("pool lock");
        let class = &mut state.classes[self.class];
        class.leased -= 1;
        let arena = &mut class.arenas[self.arena];
        arena.free.push(chunk);
        let idle = arena.free.len() == arena.chunks;
        class.with_free.insert(self.arena);
        let bytes = class.arena_bytes();
        if idle && state.registered >= self.pool.config.keep_bytes + bytes {
            state.release_arena(self.class, self.arena, &mut released);
        }
        let waiters = state.lines.wake_heads(&REGISTERED);
        // Deregistration is a system call: not under the lock.
        drop(state);
        drop(released);
        waiters.into_iter().for_each(|w| w());
    }
}

impl<S: ChunkSource> std::fmt::Debug for Lease<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("class", &self.class).finish()
    }
}
