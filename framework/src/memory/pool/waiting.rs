//! The glue between the pool and its lines (`memory/line.rs`): taking a place when an
//! ask is refused at a limit, and knowing, when an ask comes back with its place, whose
//! turn it is.

use std::sync::Arc;

use super::state::{class_line, Shared, State};
use super::{ChunkSource, Pool, RegisteredChunks};
use crate::memory::line::{Ask, Line, RoomWaker};

impl<S: ChunkSource> Pool<S> {
    /// The line `ask` waits in, and what is kept for it at the head: an arena of its
    /// class for a lease (or a free chunk of that class), the bytes themselves otherwise.
    fn line_of(&self, state: &State<S::Chunk>, ask: Ask) -> (Line, usize, Option<usize>) {
        match ask {
            Ask::Lease(len) => match self.class_of(len) {
                Some(c) => (class_line(c), state.classes[c].arena_bytes(), Some(c)),
                // Never served; the caller learns why when it asks.
                None => (Line::Bulk, 0, None),
            },
            Ask::Charge(len) => (Line::Bulk, len, None),
            Ask::Heap(len) => (Line::Heap, len, None),
        }
    }

    /// Takes a place at the back of the line for `ask`, after the pool refused it at a
    /// limit: `wake` is called when the place reaches the head and memory may serve it,
    /// and again each time memory comes back while it is the head and not yet served.
    /// Ask again with the place ([`lease_in_turn`](Self::lease_in_turn) ...), at once (memory returned
    /// before the place was taken woke nobody) and after each wake; drop the place when
    /// served or giving up, which wakes the next in line.
    pub fn join_line(&self, ask: Ask, wake: RoomWaker) -> PlaceInLine<S> {
        let mut state = self.shared.state.lock().expect("pool lock");
        let (line, need, class) = self.line_of(&state, ask);
        state.waits += 1;
        let id = state.lines.join(line, need, class, wake);
        PlaceInLine {
            pool: self.shared.clone(),
            line,
            id,
        }
    }

    /// The id of `place`'s waiter, checked to be one of this pool's.
    pub(super) fn who(&self, place: Option<&PlaceInLine<S>>) -> Option<u64> {
        let place = place?;
        assert!(
            Arc::ptr_eq(&place.pool, &self.shared),
            "a place in another pool's line"
        );
        Some(place.id)
    }
}

/// A place in one of the pool's lines (see [`Pool::join_line`]): asks made with it
/// ([`Pool::lease_in_turn`] ...) are served ahead of anyone behind it. Dropping it leaves
/// the line.
pub struct PlaceInLine<S: ChunkSource = RegisteredChunks> {
    pool: Arc<Shared<S>>,
    line: Line,
    id: u64,
}

impl<S: ChunkSource> PlaceInLine<S> {
    /// How many wait ahead of this place (0: it is the head).
    pub fn ahead(&self) -> usize {
        let state = self.pool.state.lock().expect("pool lock");
        state.lines.ahead_of(self.line, self.id).unwrap_or(0)
    }

    /// The line it is in.
    pub fn line(&self) -> Line {
        self.line
    }
}

impl<S: ChunkSource> Drop for PlaceInLine<S> {
    fn drop(&mut self) {
        let mut state = self.pool.state.lock().expect("pool lock");
        let next = state.lines.leave(self.line, self.id);
        drop(state);
        if let Some(wake) = next {
            wake();
        }
    }
}

impl<S: ChunkSource> std::fmt::Debug for PlaceInLine<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlaceInLine")
            .field("line", &self.line)
            .field("id", &self.id)
            .finish()
    }
}
