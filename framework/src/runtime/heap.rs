//! The server's one bound on heap memory that clients cause: [`HeapBudget`] counts bytes
//! against [`PoolConfig::heap_bytes`](crate::memory::PoolConfig::heap_bytes) before they
//! are allocated, and [`Held`] gives them back when dropped.
//!
//! Incoming rendezvous messages have been charged to this budget since issue 26. Issue 45
//! found other ways for a client to make the server hold memory no budget saw (a
//! handler's READ of 16 MiB, 64 calls in flight on each connection, lambda inputs), and
//! an out-of-memory kill was the result. Every path that allocates what a client chose
//! now asks here first (ARCHITECTURE.md, "Every byte a client makes the server hold is
//! counted", lists them), so one number bounds them all and one gauge
//! (`rdmactor_pool_heap_bytes`) shows it.
//!
//! Two ways to ask, as Envoy's overload manager and nginx's limits do: at once
//! ([`HeapBudget::try_hold`]), for callers that can refuse with `Busy` and drop what
//! they hold; or in line with a deadline ([`HeapBudget::hold`]), for callers that have
//! allocated nothing yet and can wait their turn. The line is the pool's heap line
//! (first in, first out, the head's need reserved), shared with incoming messages.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::memory::{Ask, HeapCharge, MrPool, PoolError, RegisteredChunks};
use crate::transport::Transport;

/// Why heap bytes were not granted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeapError {
    /// More than the whole budget: it could never be granted, however long it waited.
    #[error("{len} B is more than the server's whole heap budget of {limit} B")]
    TooLarge {
        /// Bytes asked for.
        len: usize,
        /// The budget.
        limit: usize,
    },
    /// The budget is held by others now (asked with [`HeapBudget::try_hold`]).
    #[error("the server's heap budget is full: {len} B asked, {in_use} B of {limit} B held")]
    Full {
        /// Bytes asked for.
        len: usize,
        /// Bytes held now.
        in_use: usize,
        /// The budget.
        limit: usize,
    },
    /// The budget stayed full for the whole wait (asked with [`HeapBudget::hold`]).
    #[error("the server's heap budget stayed full for {waited_ms} ms ({len} B asked)")]
    TimedOut {
        /// Bytes asked for.
        len: usize,
        /// How long it waited.
        waited_ms: u64,
    },
}

/// The server's heap budget: a cheap handle to share with futures and other threads
/// (from [`SessionCx::heap_budget`](crate::runtime::SessionCx::heap_budget) or
/// [`RequestCx::heap_budget`](crate::runtime::RequestCx::heap_budget)). It names no
/// transport: a service's code is the same over verbs and loopback.
#[derive(Clone)]
pub struct HeapBudget {
    source: Arc<dyn Source>,
}

impl std::fmt::Debug for HeapBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeapBudget")
            .field("limit", &self.limit())
            .field("in_use", &self.in_use())
            .finish()
    }
}

type Waiting = Pin<Box<dyn Future<Output = Result<Held, HeapError>> + Send>>;

/// What a budget is over: the node's pool, whatever its transport.
trait Source: Send + Sync {
    fn limit(&self) -> usize;
    fn in_use(&self) -> usize;
    fn try_hold(&self, len: usize) -> Result<Held, HeapError>;
    fn count(&self, len: usize) -> Result<Held, HeapError>;
    fn hold(&self, len: usize, wait: Duration) -> Waiting;
}

impl HeapBudget {
    pub(crate) fn new<T: Transport>(pool: MrPool<T>) -> Self {
        HeapBudget {
            source: Arc::new(pool),
        }
    }

    /// The whole budget, in bytes.
    pub fn limit(&self) -> usize {
        self.source.limit()
    }

    /// Bytes held now, by every connection of the node.
    pub fn in_use(&self) -> usize {
        self.source.in_use()
    }

    /// Counts `len` bytes about to be made, now, or says why not. Never waits, and never
    /// overtakes those waiting in line: room kept for the head of the line is not
    /// given.
    pub fn try_hold(&self, len: usize) -> Result<Held, HeapError> {
        self.source.try_hold(len)
    }

    /// Counts `len` bytes that exist already (a delivered request the session keeps,
    /// bytes made to send) against the limit alone, or says why not, so the caller
    /// drops them. Room kept for the head of the line does not refuse them: turning
    /// away memory that exists would not give the head any, only the client an error.
    pub fn count(&self, len: usize) -> Result<Held, HeapError> {
        self.source.count(len)
    }

    /// Counts `len` bytes, waiting in the heap line (behind incoming messages and other
    /// holds asked earlier) for at most `wait`. For a caller that has allocated nothing
    /// yet: ask first, then allocate.
    pub async fn hold(&self, len: usize, wait: Duration) -> Result<Held, HeapError> {
        self.source.hold(len, wait).await
    }
}

impl<T: Transport> Source for MrPool<T> {
    fn limit(&self) -> usize {
        self.heap_limit()
    }

    fn in_use(&self) -> usize {
        self.stats().heap_bytes
    }

    fn try_hold(&self, len: usize) -> Result<Held, HeapError> {
        self.charge_heap(len)
            .map(Held::new)
            .map_err(|e| refusal(self, len, e))
    }

    fn count(&self, len: usize) -> Result<Held, HeapError> {
        self.charge_heap_existing(len)
            .map(Held::new)
            .map_err(|e| refusal(self, len, e))
    }

    fn hold(&self, len: usize, wait: Duration) -> Waiting {
        let pool = self.clone();
        Box::pin(async move {
            match pool.try_hold(len) {
                Ok(held) => return Ok(held),
                Err(HeapError::Full { .. }) => {}
                Err(e) => return Err(e),
            }
            let since = Instant::now();
            let room = Arc::new(tokio::sync::Notify::new());
            let wake = Arc::clone(&room);
            // `notify_one` keeps a permit when nobody waits yet, so a wake-up between an
            // ask and the wait below is not lost.
            let place = pool.join_line(Ask::Heap(len), Arc::new(move || wake.notify_one()));
            let deadline = tokio::time::Instant::from_std(since + wait);
            loop {
                match pool.charge_heap_in_turn(len, Some(&place)) {
                    // Dropping the place on return wakes whoever is next.
                    Ok(charge) => return Ok(Held::new(charge)),
                    Err(PoolError::HeapFull { .. }) => {}
                    Err(e) => return Err(refusal(&pool, len, e)),
                }
                if tokio::time::timeout_at(deadline, room.notified())
                    .await
                    .is_err()
                {
                    return Err(HeapError::TimedOut {
                        len,
                        waited_ms: u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX),
                    });
                }
            }
        })
    }
}

fn refusal<T: Transport>(pool: &MrPool<T>, len: usize, e: PoolError) -> HeapError {
    let limit = pool.heap_limit();
    match e {
        PoolError::HeapFull { .. } if len > limit => HeapError::TooLarge { len, limit },
        PoolError::HeapFull { in_use, limit, .. } => HeapError::Full { len, in_use, limit },
        // The heap budget refuses with nothing else.
        _ => HeapError::Full {
            len,
            in_use: pool.stats().heap_bytes,
            limit,
        },
    }
}

/// Bytes counted against the heap budget until this is dropped. Keep it beside what it
/// counts (in the same struct, or moved into the same future), so that both go together.
pub struct Held {
    len: usize,
    _charge: Box<dyn Send + Sync>,
}

impl Held {
    fn new<T: Transport>(charge: HeapCharge<RegisteredChunks<T>>) -> Held {
        Held {
            len: charge.len(),
            _charge: Box::new(charge),
        }
    }

    /// Bytes counted.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a hold of nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held").field("len", &self.len).finish()
    }
}
