//! Waiting in line for pool memory: first in, first out, with room kept for the head.
//!
//! A connection refused at one of the pool's limits waits for memory to come back
//! instead of closing (what the others hold goes back on its own). Before this line
//! existed, every waiter was woken on every return and the first to run took the memory:
//! a connection asking for 7 MiB could lose, again and again, to connections asking for
//! 64 KiB that arrived after it, and nothing bounded its wait. Now:
//!
//! - **One line per limit.** Memory that comes back under one limit (the heap budget)
//!   does not help an ask under another (the registered cap), so each has its own line.
//! - **Only the head is woken.** Waking everyone made them all retry and all but one
//!   fail; the head alone retries, and once served (or gone) the next one is woken.
//! - **The head's need is reserved.** An ask from anyone but the head succeeds only if
//!   the head's need still fits afterwards, and a free chunk of the class the head waits
//!   for is the head's. Newcomers cannot overtake the line; they can still use memory
//!   the head could not use anyway.
//!
//! A place is an RAII value ([`super::PlaceInLine`]): dropping it (served, deadline
//! passed, connection closed) leaves the line and wakes whoever is head next. How long a
//! place may be held is the caller's policy (a connection's message fails at its
//! deadline, see `ConnectionConfig::pool_wait`).

use std::collections::VecDeque;
use std::sync::Arc;

/// Which of the pool's limits an ask waits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    /// Leases of the smallest class (receive buffers, small sends), under the whole cap.
    Smallest = 0,
    /// Leases of the larger classes and charges, under the cap less the receive
    /// reservation.
    Bulk = 1,
    /// Heap held by incoming messages ([`super::PoolConfig::heap_bytes`]).
    Heap = 2,
}

/// What a waiter asks the pool for; decides its line and what is kept for it while it is
/// at the head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// A chunk of at least this many bytes ([`super::Pool::lease`]).
    Lease(usize),
    /// Registered bytes counted against the cap ([`super::Pool::charge`]).
    Charge(usize),
    /// Heap bytes of an incoming message ([`super::Pool::charge_heap`]).
    Heap(usize),
}

/// Called (from the thread that gives memory back) when a waiter reaches the head of its
/// line with memory to try, or is at the head and memory came back. It may be called
/// again later, so it is a `Fn`; it should only schedule the retry (send a message),
/// never ask the pool itself: it runs while the giver returns from its drop.
pub type RoomWaker = Arc<dyn Fn() + Send + Sync>;

struct Waiter {
    id: u64,
    need: usize,
    class: Option<usize>,
    wake: RoomWaker,
    /// Woken and not retried since: another return need not wake it again.
    woken: bool,
}

/// What an ask must leave for the head of its line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Reserved {
    /// Bytes that must still fit under the line's limit afterwards.
    pub bytes: usize,
    /// The class whose free chunks are the head's.
    pub class: Option<usize>,
}

/// The three lines of one pool, kept under the pool's lock.
#[derive(Default)]
pub(super) struct Lines {
    lines: [VecDeque<Waiter>; 3],
    next_id: u64,
}

impl Lines {
    /// Adds a waiter at the back of `line`; its id names its place.
    pub fn join(&mut self, line: Line, need: usize, class: Option<usize>, wake: RoomWaker) -> u64 {
        self.next_id += 1;
        self.lines[line as usize].push_back(Waiter {
            id: self.next_id,
            need,
            class,
            wake,
            woken: false,
        });
        self.next_id
    }

    /// Removes the place `id`. If it was the head, the new head's waker, to be called
    /// once the pool's lock is released: what the old head did not take may serve it.
    pub fn leave(&mut self, line: Line, id: u64) -> Option<RoomWaker> {
        let q = &mut self.lines[line as usize];
        let at = q.iter().position(|w| w.id == id)?;
        q.remove(at);
        if at != 0 {
            return None;
        }
        let head = q.front_mut()?;
        head.woken = true;
        Some(head.wake.clone())
    }

    /// What an ask by `who` (`None`: someone not in line) under `line` must leave: the
    /// head's need, unless `who` is the head or nobody waits.
    pub fn reserved(&self, line: Line, who: Option<u64>) -> Reserved {
        match self.lines[line as usize].front() {
            Some(head) if Some(head.id) != who => Reserved {
                bytes: head.need,
                class: head.class,
            },
            _ => Reserved::default(),
        }
    }

    /// The waiter `id` is asking again: a later return must wake it again if this ask
    /// fails.
    pub fn retrying(&mut self, line: Line, id: u64) {
        if let Some(w) = self.lines[line as usize].iter_mut().find(|w| w.id == id) {
            w.woken = false;
        }
    }

    /// Memory came back under `lines`: the wakers of their heads not already woken, to be
    /// called once the pool's lock is released.
    pub fn wake_heads(&mut self, lines: &[Line]) -> Vec<RoomWaker> {
        lines
            .iter()
            .filter_map(|&line| {
                let head = self.lines[line as usize].front_mut()?;
                if head.woken {
                    return None;
                }
                head.woken = true;
                Some(head.wake.clone())
            })
            .collect()
    }

    /// How many wait in `line`.
    pub fn len(&self, line: Line) -> usize {
        self.lines[line as usize].len()
    }

    /// How many are ahead of `id` in `line` (`None`: not in it).
    pub fn ahead_of(&self, line: Line, id: u64) -> Option<usize> {
        self.lines[line as usize].iter().position(|w| w.id == id)
    }
}
