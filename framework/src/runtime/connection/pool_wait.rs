//! Waiting for the pool: a connection's places in its lines, and the deadline on them.
//!
//! A connection refused at one of the pool's limits does not close: what the others
//! hold goes back on its own, so it takes a place in the pool's line for that limit (see
//! `memory/line.rs`: first in, first out, with room kept for the head) and is pumped when
//! its turn comes. Three things can wait, each at most once at a time because each waits
//! at the front of something:
//!
//! - the large message at the front of the outgoing queue, for its rendezvous
//!   registration's charge ([`Waiting::Offer`]);
//! - the peer's offer at the front of the queue, for its share of the heap budget
//!   ([`Waiting::Read`]);
//! - the next READ chunk of a message already being taken, for a pool chunk
//!   ([`Waiting::Chunk`]).
//!
//! A wait cannot last for ever. Peers that never READ what they were offered are cut
//! off at the rendezvous deadline, but the pool can stay full for longer than any one
//! offer (a queue of them), and a client should hear why its message did not move rather
//! than wait on it without end. So an offer or a READ not started within
//! `ConnectionConfig::pool_wait` fails with [`BudgetError::NoRoom`]: an outgoing message is
//! handed back to the session (`Session::on_refused`), an incoming one is refused to the
//! peer (whose request fails with the reason). The connection goes on. A chunk of a
//! message already under way is not timed: its message holds its budget, and chunks
//! come back as READs complete.

use std::time::{Duration, Instant};

use crate::memory::{PlaceInLine, RegisteredChunks};
use crate::proto::budget::BudgetError;
use crate::transport::Transport;

/// What waits for the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Waiting {
    /// The front outgoing message, for its rendezvous charge.
    Offer = 0,
    /// The front incoming offer, for its heap charge.
    Read = 1,
    /// The next READ chunk, for a pool lease; never timed out.
    Chunk = 2,
}

struct Place<T: Transport> {
    place: PlaceInLine<RegisteredChunks<T>>,
    since: Instant,
}

/// A connection's places in the pool's lines.
pub(super) struct PoolWaits<T: Transport> {
    places: [Option<Place<T>>; 3],
    /// How long an offer or READ may wait before it fails.
    limit: Duration,
}

impl<T: Transport> PoolWaits<T> {
    pub fn new(limit: Duration) -> Self {
        PoolWaits {
            places: [None, None, None],
            limit,
        }
    }

    /// The place `what` holds, if it waits.
    pub fn place(&self, what: Waiting) -> Option<&PlaceInLine<RegisteredChunks<T>>> {
        self.places[what as usize].as_ref().map(|p| &p.place)
    }

    /// `what` waits in `place` from `now` on.
    pub fn wait(&mut self, what: Waiting, place: PlaceInLine<RegisteredChunks<T>>, now: Instant) {
        self.places[what as usize] = Some(Place { place, since: now });
    }

    /// `what` was served (or is gone): its place goes, which wakes the next in line.
    pub fn served(&mut self, what: Waiting) {
        self.places[what as usize] = None;
    }

    /// Leaves every line (the connection is closing).
    pub fn clear(&mut self) {
        self.places = [None, None, None];
    }

    /// The earliest deadline of the timed waits (`None`: nothing timed waits).
    pub fn deadline(&self) -> Option<Instant> {
        [Waiting::Offer, Waiting::Read]
            .iter()
            .filter_map(|&w| self.places[w as usize].as_ref())
            .map(|p| p.since + self.limit)
            .min()
    }

    /// The timed waits past their deadline at `now` leave their lines, each with the
    /// refusal its message (the front one, of `len` bytes) fails with. Harmless early.
    pub fn expire(&mut self, now: Instant, len: usize) -> Vec<(Waiting, BudgetError)> {
        let mut out = Vec::new();
        for w in [Waiting::Offer, Waiting::Read] {
            let Some(p) = &self.places[w as usize] else {
                continue;
            };
            let waited = now.saturating_duration_since(p.since);
            if waited < self.limit {
                continue;
            }
            self.places[w as usize] = None;
            out.push((
                w,
                BudgetError::NoRoom {
                    len,
                    waited_ms: waited.as_millis().try_into().unwrap_or(usize::MAX),
                },
            ));
        }
        out
    }
}
