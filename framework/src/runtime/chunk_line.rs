//! The line for a service's chunks in flight: one bound on the bytes a service's
//! connections keep moving at the NIC at once, and the order in which waiting
//! connections get room. Handler services use it for their calls' READs and WRITEs
//! (`HandlerService::max_chunks_in_flight`); a session of any kind can share one across
//! its service's connections (the `lambda` service does for its inputs' READs).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::runtime::connection::SessionWaker;

/// Chunks in flight across every connection of one service, against a bound.
///
/// Each connection keeps at most a few chunks in flight, but many connections together
/// could still queue hundreds of MiB of READs and WRITEs at the NIC, and every
/// other packet (a polite client's 2-byte request, its answer) waits behind them: in
/// issue 45's flood, 32 connections × 8 chunks of 1 MiB made a small request wait 14 s
/// on Soft-RoCE. So the service bounds the chunks in flight too, and a connection that
/// finds no room waits in line (first in, first out) to be woken when a chunk completes.
///
/// A chunk that completes while connections wait hands its room to the first of them
/// (a grant) instead of giving it back: the woken connection runs later, on its own
/// thread, and a room merely given back would go to whichever connection asked first in
/// between, most often the one whose chunk just completed, still in its completion
/// handler. The woken one would find the line full again and go to its back.
#[derive(Debug)]
pub struct ServiceChunks {
    state: Mutex<ChunkLine>,
    max: usize,
}

#[derive(Debug, Default)]
struct ChunkLine {
    /// Chunks posted, and rooms granted to a waiter and not yet used.
    in_flight: usize,
    waiting: VecDeque<ChunkWaiter>,
}

/// A connection's place in the line, woken with `token` when room is granted to it;
/// `queued` keeps it in line once. One per connection; [`leave`](Self::leave) it when
/// the connection's transfers close, and give back what it was granted and did not use
/// ([`ServiceChunks::return_grants`]).
#[derive(Debug, Clone)]
pub struct ChunkWaiter {
    waker: SessionWaker,
    token: u64,
    queued: Arc<AtomicBool>,
    /// Its transfers are closed: it will never use room, so it is passed over.
    gone: Arc<AtomicBool>,
    /// Rooms handed to it by completing chunks and not used yet (changed under the
    /// line's lock only).
    granted: Arc<AtomicUsize>,
}

impl ChunkWaiter {
    /// A connection that `waker` wakes with `token` when room is granted to it.
    pub fn new(waker: SessionWaker, token: u64) -> ChunkWaiter {
        ChunkWaiter {
            waker,
            token,
            queued: Arc::default(),
            gone: Arc::default(),
            granted: Arc::default(),
        }
    }

    /// Its transfers are closed: it is passed over from now on.
    pub fn leave(&self) {
        self.gone.store(true, Ordering::Release);
    }
}

/// One chunk's place among the service's; the next in line is woken when it goes. Keep
/// it with the chunk until its completion.
#[derive(Debug)]
pub struct ChunkRoom {
    chunks: Arc<ServiceChunks>,
}

impl Drop for ChunkRoom {
    fn drop(&mut self) {
        ServiceChunks::pass_on(&mut lock(&self.chunks.state), 1);
    }
}

impl ServiceChunks {
    /// A line for at most `max` chunks in flight (at least one).
    pub fn new(max: usize) -> Arc<ServiceChunks> {
        Arc::new(ServiceChunks {
            state: Mutex::default(),
            max: max.max(1),
        })
    }

    /// `rooms` rooms are free: each goes to the first connection in line that is still
    /// there (granted, and that connection woken), the rest back to the service.
    fn pass_on(line: &mut ChunkLine, mut rooms: usize) {
        while rooms > 0 {
            let Some(next) = line.waiting.pop_front() else {
                break;
            };
            next.queued.store(false, Ordering::Release);
            if next.gone.load(Ordering::Acquire) {
                continue;
            }
            next.granted.fetch_add(1, Ordering::AcqRel);
            rooms = rooms.saturating_sub(1);
            // A session that cannot be woken (closing) gives its grant back when its
            // transfers close.
            next.waker.wake(next.token);
        }
        line.in_flight = line.in_flight.saturating_sub(rooms);
    }

    /// Gives back the rooms granted to `waiter` that it did not use: it had nothing left
    /// to post (its transfers failed, or its connection is closing), and the rooms would
    /// otherwise be kept from everyone behind it.
    pub fn return_grants(&self, waiter: &ChunkWaiter) {
        let mut line = lock(&self.state);
        let unused = waiter.granted.swap(0, Ordering::AcqRel);
        if unused > 0 {
            ServiceChunks::pass_on(&mut line, unused);
        }
    }

    /// Room for one more chunk: one granted to `waiter`, or a free one when nobody is
    /// waiting for it. Else `waiter` takes a place in line (once).
    pub fn take(self: &Arc<Self>, waiter: &ChunkWaiter) -> Option<ChunkRoom> {
        let mut line = lock(&self.state);
        let granted = waiter.granted.load(Ordering::Acquire);
        if granted > 0 {
            waiter
                .granted
                .store(granted.saturating_sub(1), Ordering::Release);
            return Some(ChunkRoom {
                chunks: Arc::clone(self),
            });
        }
        while let Some(w) = line.waiting.front() {
            if !w.gone.load(Ordering::Acquire) {
                break;
            }
            w.queued.store(false, Ordering::Release);
            line.waiting.pop_front();
        }
        // Free room goes to the head of the line: nobody waits, or `waiter` is first.
        let first = line
            .waiting
            .front()
            .is_none_or(|w| Arc::ptr_eq(&w.queued, &waiter.queued));
        if line.in_flight < self.max && first {
            if let Some(w) = line.waiting.pop_front() {
                w.queued.store(false, Ordering::Release);
            }
            line.in_flight = line.in_flight.saturating_add(1);
            return Some(ChunkRoom {
                chunks: Arc::clone(self),
            });
        }
        if !waiter.queued.swap(true, Ordering::AcqRel) {
            line.waiting.push_back(waiter.clone());
        }
        None
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter() -> ChunkWaiter {
        ChunkWaiter::new(SessionWaker::detached(), 2)
    }

    fn in_flight(chunks: &ServiceChunks) -> usize {
        lock(&chunks.state).in_flight
    }

    #[test]
    fn a_freed_room_goes_to_the_first_in_line_not_to_whoever_asks_next() {
        let chunks = ServiceChunks::new(2);
        let (a, b, c) = (waiter(), waiter(), waiter());
        let held: Vec<ChunkRoom> = (0..2).map(|_| chunks.take(&a).expect("room")).collect();
        // The line is full: b, then c, wait.
        assert!(chunks.take(&b).is_none());
        assert!(chunks.take(&c).is_none());
        let mut held = held.into_iter();
        drop(held.next());
        // a's chunk completed, and a asks again at once, before b has run: the room
        // was b's, and a goes to the back of the line.
        assert!(chunks.take(&a).is_none());
        assert_eq!(b.granted.load(Ordering::Acquire), 1);
        let b_room = chunks.take(&b).expect("b's grant");
        assert_eq!(in_flight(&chunks), 2);
        // The next freed room is c's, then a's.
        drop(held.next());
        assert!(chunks.take(&a).is_none());
        let c_room = chunks.take(&c).expect("c's grant");
        drop(b_room);
        let a_room = chunks.take(&a).expect("a's grant");
        drop((c_room, a_room));
        assert_eq!(in_flight(&chunks), 0);
        assert!(lock(&chunks.state).waiting.is_empty());
    }

    #[test]
    fn a_grant_not_used_is_passed_on_and_a_gone_waiter_is_passed_over() {
        let chunks = ServiceChunks::new(1);
        let (a, b, c) = (waiter(), waiter(), waiter());
        let room = chunks.take(&a).expect("room");
        assert!(chunks.take(&b).is_none());
        assert!(chunks.take(&c).is_none());
        // b's connection closes before its turn: it is passed over, c gets the room.
        b.leave();
        drop(room);
        assert_eq!(b.granted.load(Ordering::Acquire), 0);
        assert_eq!(c.granted.load(Ordering::Acquire), 1);
        // c had nothing left to post: its grant goes back, and with nobody waiting the
        // service has its room again.
        chunks.return_grants(&c);
        assert_eq!(in_flight(&chunks), 0);
        let again = chunks.take(&a).expect("free room");
        drop(again);
        assert_eq!(in_flight(&chunks), 0);
    }
}
