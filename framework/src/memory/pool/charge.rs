//! Charges: bytes the pool does not hand out but must count, registered memory under
//! the cap ([`Charge`]) and heap memory of arriving messages under their own budget
//! ([`HeapCharge`]), each uncounted on drop.

use std::sync::Arc;

use super::config::bulk_limit;
use super::state::{Shared, REGISTERED};
use super::waiting::PlaceInLine;
use super::{ChunkSource, Pool, PoolError, RegisteredChunks};
use crate::memory::line::Line;

impl<S: ChunkSource> Pool<S> {
    /// Counts `len` bytes the caller registers outside the pool (a rendezvous buffer of
    /// exactly one message) against the pool's cap, under the same limit as every class
    /// but the smallest, until the returned [`Charge`] is dropped. Checked before the
    /// caller allocates anything; idle arenas are reclaimed to make room if needed.
    pub fn charge(&self, len: usize) -> Result<Charge<S>, PoolError> {
        self.charge_in_turn(len, None)
    }

    /// Counts `len` heap bytes of an incoming message against
    /// [`PoolConfig::heap_bytes`](super::PoolConfig::heap_bytes) until the returned [`HeapCharge`] is dropped. Checked
    /// before the caller allocates; a refusal can be waited out in line
    /// ([`join_line`](Self::join_line)), unless `len` alone is over the budget.
    pub fn charge_heap(&self, len: usize) -> Result<HeapCharge<S>, PoolError> {
        self.charge_heap_in_turn(len, None)
    }

    /// Counts `len` heap bytes that exist already (a delivered request a session keeps,
    /// bytes a handler made to send) against the same budget, checked against its limit
    /// only: not against what the head of the heap line is owed. Refusing them frees
    /// them, so the bound holds either way, and a waiting 16 MiB READ does not get to
    /// turn away a polite client's 2-byte request.
    pub fn charge_heap_existing(&self, len: usize) -> Result<HeapCharge<S>, PoolError> {
        let state = self.shared.state.lock().expect("pool lock");
        self.count_heap(state, len, 0)
    }

    /// [`charge`](Self::charge) as the waiter holding `place` (if any).
    pub fn charge_in_turn(
        &self,
        len: usize,
        place: Option<&PlaceInLine<S>>,
    ) -> Result<Charge<S>, PoolError> {
        let who = self.who(place);
        let cfg = &self.shared.config;
        let mut released = Vec::new();
        let mut state = self.shared.state.lock().expect("pool lock");
        if let Some(id) = who {
            state.lines.retrying(Line::Bulk, id);
        }
        let reserved = state.lines.reserved(Line::Bulk, who).bytes;
        if !state.make_room(cfg, len + reserved, false, None, &mut released) {
            return Err(PoolError::ChargeRefused {
                len,
                in_use: state.bulk(),
                limit: bulk_limit(cfg),
            });
        }
        state.charged += len;
        state.note_peak();
        drop(state);
        drop(released);
        Ok(Charge {
            len,
            pool: self.shared.clone(),
        })
    }

    /// [`charge_heap`](Self::charge_heap) as the waiter holding `place` (if any).
    pub fn charge_heap_in_turn(
        &self,
        len: usize,
        place: Option<&PlaceInLine<S>>,
    ) -> Result<HeapCharge<S>, PoolError> {
        let who = self.who(place);
        let mut state = self.shared.state.lock().expect("pool lock");
        if let Some(id) = who {
            state.lines.retrying(Line::Heap, id);
        }
        let reserved = state.lines.reserved(Line::Heap, who).bytes;
        self.count_heap(state, len, reserved)
    }

    /// Counts `len` heap bytes if they fit under the budget with `reserved` left over.
    fn count_heap(
        &self,
        mut state: std::sync::MutexGuard<'_, super::state::State<S::Chunk>>,
        len: usize,
        reserved: usize,
    ) -> Result<HeapCharge<S>, PoolError> {
        let limit = self.shared.config.heap_bytes;
        if state.heap.saturating_add(len).saturating_add(reserved) > limit {
            return Err(PoolError::HeapFull {
                len,
                in_use: state.heap,
                limit,
            });
        }
        state.heap += len;
        Ok(HeapCharge {
            len,
            pool: self.shared.clone(),
        })
    }
}

/// Bytes registered outside the pool and counted against its cap (see [`Pool::charge`]);
/// uncounted when dropped.
pub struct Charge<S: ChunkSource = RegisteredChunks> {
    len: usize,
    pool: Arc<Shared<S>>,
}

impl<S: ChunkSource> Charge<S> {
    /// Bytes counted.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a charge of nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Heap bytes of an incoming message counted against [`PoolConfig::heap_bytes`](super::PoolConfig::heap_bytes) (see
/// [`Pool::charge_heap`]); uncounted when dropped.
pub struct HeapCharge<S: ChunkSource = RegisteredChunks> {
    len: usize,
    pool: Arc<Shared<S>>,
}

impl<S: ChunkSource> HeapCharge<S> {
    /// Bytes counted.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a charge of nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<S: ChunkSource> std::fmt::Debug for HeapCharge<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeapCharge")
            .field("len", &self.len)
            .finish()
    }
}

impl<S: ChunkSource> Drop for HeapCharge<S> {
    fn drop(&mut self) {
        let mut state = self.pool.state.lock().expect("pool lock");
        state.heap -= self.len;
        let waiters = state.lines.wake_heads(&[Line::Heap]);
        drop(state);
        waiters.into_iter().for_each(|w| w());
    }
}

impl<S: ChunkSource> Drop for Charge<S> {
    fn drop(&mut self) {
        let mut state = self.pool.state.lock().expect("pool lock");
        state.charged -= self.len;
        let waiters = state.lines.wake_heads(&REGISTERED);
        drop(state);
        waiters.into_iter().for_each(|w| w());
    }
}

impl<S: ChunkSource> std::fmt::Debug for Charge<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Charge").field("len", &self.len).finish()
    }
}
