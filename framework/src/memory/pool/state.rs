//! The pool's shared state and its accounting under the cap: what is registered,
//! charged and held, and the reclaiming of idle arenas when an ask needs room. One
//! lock guards it all, so every limit is checked against one consistent count.

use std::sync::Mutex;

use super::class::Class;
use super::config::{bulk_limit, PoolConfig};
use super::source::ChunkSource;
use crate::memory::line::{Line, Lines};

pub(super) struct Shared<S: ChunkSource> {
    pub(super) source: S,
    pub(super) config: PoolConfig,
    pub(super) state: Mutex<State<S::Chunk>>,
}

pub(super) struct State<C> {
    pub(super) classes: Vec<Class<C>>,
    /// Bytes in arenas, all classes.
    pub(super) registered: usize,
    /// Bytes in arenas of the smallest class.
    pub(super) registered_smallest: usize,
    pub(super) charged: usize,
    /// Heap bytes of incoming messages ([`Pool::charge_heap`](super::Pool::charge_heap)); not part of the cap.
    pub(super) heap: usize,
    pub(super) peak: usize,
    /// Asks waiting for memory to come back, one line per limit (see `line.rs`).
    pub(super) lines: Lines,
    pub(super) waits: u64,
    pub(super) exhausted: u64,
}

/// Registered memory came back (a lease, a charge): both lines under the cap may move.
pub(super) const REGISTERED: [Line; 2] = [Line::Smallest, Line::Bulk];

impl<C> State<C> {
    pub(super) fn in_use(&self) -> usize {
        self.registered + self.charged
    }

    /// What counts against the bulk limit: everything but the smallest class.
    pub(super) fn bulk(&self) -> usize {
        self.in_use() - self.registered_smallest
    }

    fn fits(&self, config: &PoolConfig, bytes: usize, smallest: bool) -> bool {
        if smallest {
            self.in_use() + bytes <= config.max_bytes
        } else {
            self.bulk() + bytes <= bulk_limit(config)
        }
    }

    pub(super) fn note_peak(&mut self) {
        self.peak = self.peak.max(self.in_use());
    }

    /// Deregisters idle arenas of classes other than `except` until `bytes` more fit
    /// (`smallest`: under the whole cap, else under the bulk limit). The released chunks
    /// are returned to be dropped after the lock. False if they still do not fit.
    pub(super) fn make_room(
        &mut self,
        config: &PoolConfig,
        bytes: usize,
        smallest: bool,
        except: Option<usize>,
        released: &mut Vec<Vec<C>>,
    ) -> bool {
        while !self.fits(config, bytes, smallest) {
            // Reclaiming the smallest class's arenas frees nothing under the bulk limit.
            let first = if smallest { 0 } else { 1 };
            let victim = (first..self.classes.len())
                .rev()
                .filter(|&c| Some(c) != except)
                .find_map(|c| self.classes[c].idle_arena().map(|a| (c, a)));
            let Some((c, a)) = victim else {
                return false;
            };
            self.release_arena(c, a, released);
        }
        true
    }

    pub(super) fn release_arena(&mut self, class: usize, arena: usize, released: &mut Vec<Vec<C>>) {
        let bytes = self.classes[class].arena_bytes();
        released.push(self.classes[class].remove_arena(arena));
        self.registered -= bytes;
        if class == 0 {
            self.registered_smallest -= bytes;
        }
    }
}

/// The line a lease of class `class` waits in: the smallest class is limited by the whole
/// cap, the others by the bulk limit.
pub(super) fn class_line(class: usize) -> Line {
    if class == 0 {
        Line::Smallest
    } else {
        Line::Bulk
    }
}
