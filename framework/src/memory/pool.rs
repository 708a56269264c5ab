//! Size-class pool. Registering memory costs a system call and pins pages, so the pool
//! registers large arenas on demand, splits each into equal chunks of one class, and
//! recycles chunks through free lists. The total is capped by configuration: when the cap
//! is reached a lease fails with [`PoolError::Exhausted`] instead of registering more.
//!
//! Three rules keep one kind of use from starving another until a restart:
//!
//! - **Idle arenas go back.** An arena whose chunks have all come back is deregistered
//!   and freed as long as more than [`PoolConfig::keep_bytes`] stay registered, and any
//!   idle arena is reclaimed when a class needs room under the cap. A burst of 1 MiB
//!   leases no longer leaves the cap registered as 1 MiB chunks nobody uses.
//! - **Receive buffers keep a reservation.** Every class but the smallest (the one
//!   receives are posted in), together with memory registered outside the pool and
//!   counted against its cap ([`Pool::charge`], rendezvous buffers), may use at most
//!   `max_bytes - reserved_smallest`: bulk transfers can never take the last of the cap
//!   from the receive buffers new connections need.
//! - **A class that cannot grow borrows from a larger one.** When the cap stops a class
//!   from registering another arena, a free chunk of a larger class serves instead.
//!
//! The bookkeeping is generic over where chunks come from ([`ChunkSource`]), so it is
//! tested without RDMA; [`MrPool`] is the pool over registered memory.

use std::collections::BTreeSet;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

use slab::Slab;

use super::line::{Ask, Line, Lines, Reserved, RoomWaker};
use crate::verbs::{Access, MemoryRegion, ProtectionDomain, VerbsError};

/// Pool sizing.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Chunk sizes, ascending (for example 4 KiB, 64 KiB, 1 MiB).
    pub classes: Vec<usize>,
    /// Bytes registered at a time when a class runs dry (at least one chunk).
    pub arena_bytes: usize,
    /// Cap on bytes registered by the pool in all, including what [`Pool::charge`]
    /// counts.
    pub max_bytes: usize,
    /// Bytes of the cap only the smallest class may use: the receive buffers every new
    /// connection needs stay available however much bulk memory is in use.
    pub reserved_smallest: usize,
    /// Idle arenas are kept (not deregistered) while no more than this many bytes are
    /// registered: re-registering costs a system call and page pinning, so a steady load
    /// should not pay it per lease.
    pub keep_bytes: usize,
    /// Bytes of incoming messages all connections together may hold in the heap while
    /// they arrive ([`Pool::charge_heap`]: rendezvous messages being READ and
    /// assembled, which live in plain heap memory, not in the pool). Each connection is
    /// held to its own `rendezvous_budget` as well; without this bound, 1,024
    /// connections at 32 MiB each could make the server hold 32 GiB and meet the OOM
    /// killer. A message that does not fit waits its turn, like a lease at the cap.
    pub heap_bytes: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            // 2 KiB: framed receive buffers and small sends; 4 KiB: raw connections'
            // receives (plain verbs clients' usual size).
            classes: vec![2 << 10, 4 << 10, 64 << 10, 1 << 20],
            arena_bytes: 4 << 20,
            max_bytes: 1 << 30,
            // 8192 receive buffers of 2 KiB: seven shared receive queues (1,792
            // connections), or 512 connections of 16 receives each.
            reserved_smallest: 16 << 20,
            keep_bytes: 64 << 20,
            heap_bytes: 512 << 20,
        }
    }
}

/// Why a lease could not be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// Larger than the largest class.
    #[error("{len} bytes requested, the largest pool class is {largest}")]
    TooLarge {
        /// Bytes asked for.
        len: usize,
        /// Largest chunk size.
        largest: usize,
    },
    /// Registering another arena would pass the configured cap.
    #[error("memory pool exhausted: no free {class} B chunk and the cap of {limit} B reached")]
    Exhausted {
        /// The class that ran dry.
        class: usize,
        /// The cap that applied (the configured cap, less the receive reservation for
        /// classes other than the smallest).
        limit: usize,
    },
    /// Memory registered outside the pool would pass the cap.
    #[error("registering {len} B would pass the pool's cap: {in_use} B of {limit} B in use")]
    ChargeRefused {
        /// Bytes asked for.
        len: usize,
        /// Bytes registered or charged now, other than the smallest class's.
        in_use: usize,
        /// The cap for them (the configured cap less the receive reservation).
        limit: usize,
    },
    /// Registering an arena failed.
    #[error("registering a pool arena failed: {0}")]
    Register(#[from] VerbsError),
    /// Incoming messages already hold the server's heap budget ([`PoolConfig::heap_bytes`]).
    #[error("a message of {len} B would pass the server's budget for incoming messages: {in_use} B of {limit} B held")]
    HeapFull {
        /// Bytes asked for.
        len: usize,
        /// Bytes held by messages arriving now.
        in_use: usize,
        /// The budget.
        limit: usize,
    },
}

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
    pd: ProtectionDomain,
}

impl ChunkSource for RegisteredChunks {
    type Chunk = MemoryRegion;
    fn grow(&self, size: usize, count: usize) -> Result<Vec<MemoryRegion>, PoolError> {
        let arena = MemoryRegion::register(&self.pd, size * count, Access::LOCAL_WRITE)?;
        Ok(arena.split(size))
    }
}

/// The pool of registered memory.
pub type MrPool = Pool<RegisteredChunks>;

/// Counters for metrics and leak checks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes registered in arenas now.
    pub registered_bytes: usize,
    /// Bytes registered outside the pool and counted against its cap now
    /// ([`Pool::charge`]).
    pub charged_bytes: usize,
    /// The most `registered_bytes + charged_bytes` has been.
    pub peak_bytes: usize,
    /// Chunks leased right now, per class.
    pub leased: Vec<usize>,
    /// Arenas registered now, per class.
    pub arenas: Vec<usize>,
    /// Places taken in line since start ([`Pool::join_line`]): how often someone met a
    /// limit and waited for room.
    pub waits: u64,
    /// Waiting now, per line (smallest class, bulk, heap).
    pub waiting: [usize; 3],
    /// Leases refused at the cap since start.
    pub exhausted: u64,
    /// Heap bytes held by incoming messages now ([`Pool::charge_heap`]).
    pub heap_bytes: usize,
}

struct Arena<C> {
    free: Vec<C>,
    chunks: usize,
}

struct Class<C> {
    size: usize,
    /// Chunks per arena.
    count: usize,
    arenas: Slab<Arena<C>>,
    /// Arenas with a free chunk; leases take the lowest, so high arenas drain and go back.
    with_free: BTreeSet<usize>,
    leased: usize,
}

impl<C> Class<C> {
    fn arena_bytes(&self) -> usize {
        self.size * self.count
    }

    /// Whether someone other than the head of the line may take a free chunk of this
    /// class (index `me`): there is one, and it is not the last one of the class the
    /// head waits for.
    fn may_take(&self, me: usize, reserved: Reserved) -> bool {
        let mut free = self.with_free.iter().map(|&id| self.arenas[id].free.len());
        if reserved.class != Some(me) {
            return free.next().is_some();
        }
        free.sum::<usize>() > 1
    }

    fn take(&mut self) -> Option<(usize, C)> {
        let &id = self.with_free.first()?;
        let arena = &mut self.arenas[id];
        let chunk = arena.free.pop().expect("listed as having a free chunk");
        if arena.free.is_empty() {
            self.with_free.remove(&id);
        }
        self.leased += 1;
        Some((id, chunk))
    }

    /// An arena none of whose chunks is leased, if any.
    fn idle_arena(&self) -> Option<usize> {
        self.with_free
            .iter()
            .rev()
            .copied()
            .find(|&id| self.arenas[id].free.len() == self.arenas[id].chunks)
    }

    fn remove_arena(&mut self, id: usize) -> Vec<C> {
        self.with_free.remove(&id);
        self.arenas.remove(id).free
    }
}

struct Shared<S: ChunkSource> {
    source: S,
    config: PoolConfig,
    state: Mutex<State<S::Chunk>>,
}

struct State<C> {
    classes: Vec<Class<C>>,
    /// Bytes in arenas, all classes.
    registered: usize,
    /// Bytes in arenas of the smallest class.
    registered_smallest: usize,
    charged: usize,
    /// Heap bytes of incoming messages ([`Pool::charge_heap`]); not part of the cap.
    heap: usize,
    peak: usize,
    /// Asks waiting for memory to come back, one line per limit (see `line.rs`).
    lines: Lines,
    waits: u64,
    exhausted: u64,
}

/// Registered memory came back (a lease, a charge): both lines under the cap may move.
const REGISTERED: [Line; 2] = [Line::Smallest, Line::Bulk];

impl<C> State<C> {
    fn in_use(&self) -> usize {
        self.registered + self.charged
    }

    /// What counts against the bulk limit: everything but the smallest class.
    fn bulk(&self) -> usize {
        self.in_use() - self.registered_smallest
    }

    fn fits(&self, config: &PoolConfig, bytes: usize, smallest: bool) -> bool {
        if smallest {
            self.in_use() + bytes <= config.max_bytes
        } else {
            self.bulk() + bytes <= bulk_limit(config)
        }
    }

    fn note_peak(&mut self) {
        self.peak = self.peak.max(self.in_use());
    }

    /// Deregisters idle arenas of classes other than `except` until `bytes` more fit
    /// (`smallest`: under the whole cap, else under the bulk limit). The released chunks
    /// are returned to be dropped after the lock. False if they still do not fit.
    fn make_room(
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

    fn release_arena(&mut self, class: usize, arena: usize, released: &mut Vec<Vec<C>>) {
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
fn class_line(class: usize) -> Line {
    if class == 0 {
        Line::Smallest
    } else {
        Line::Bulk
    }
}

fn bulk_limit(config: &PoolConfig) -> usize {
    config.max_bytes.saturating_sub(config.reserved_smallest)
}

/// A size-class pool; cheap to clone, shareable across threads.
pub struct Pool<S: ChunkSource> {
    shared: Arc<Shared<S>>,
}

impl<S: ChunkSource> Clone for Pool<S> {
    fn clone(&self) -> Self {
        Pool {
            shared: self.shared.clone(),
        }
    }
}

impl MrPool {
    /// A pool registering on `pd`.
    pub fn registered(pd: &ProtectionDomain, config: PoolConfig) -> MrPool {
        Pool::new(RegisteredChunks { pd: pd.clone() }, config)
    }
}

impl<S: ChunkSource> Pool<S> {
    /// A pool drawing from `source`.
    pub fn new(source: S, mut config: PoolConfig) -> Self {
        config.classes.sort_unstable();
        config.classes.dedup();
        let arena_bytes = config.arena_bytes;
        let classes = config
            .classes
            .iter()
            .map(|&size| Class {
                size,
                count: (arena_bytes / size).max(1),
                arenas: Slab::new(),
                with_free: BTreeSet::new(),
                leased: 0,
            })
            .collect();
        Pool {
            shared: Arc::new(Shared {
                source,
                config,
                state: Mutex::new(State {
                    classes,
                    registered: 0,
                    registered_smallest: 0,
                    charged: 0,
                    heap: 0,
                    peak: 0,
                    lines: Lines::default(),
                    waits: 0,
                    exhausted: 0,
                }),
            }),
        }
    }

    /// The smallest size class.
    pub fn smallest(&self) -> usize {
        self.shared.config.classes.first().copied().unwrap_or(0)
    }

    /// The largest chunk the pool hands out.
    pub fn largest(&self) -> usize {
        self.shared.config.classes.last().copied().unwrap_or(0)
    }

    /// Leases a chunk of at least `len` bytes: the smallest class that fits, registering
    /// another arena for it if it has no free chunk (reclaiming idle arenas of other
    /// classes if the cap requires), else a free chunk of a larger class. Leaves what the
    /// head of the line waits for (see [`join_line`](Self::join_line)).
    pub fn lease(&self, len: usize) -> Result<Lease<S>, PoolError> {
        self.lease_in_turn(len, None)
    }

    /// Counts `len` bytes the caller registers outside the pool (a rendezvous buffer of
    /// exactly one message) against the pool's cap, under the same limit as every class
    /// but the smallest, until the returned [`Charge`] is dropped. Checked before the
    /// caller allocates anything; idle arenas are reclaimed to make room if needed.
    pub fn charge(&self, len: usize) -> Result<Charge<S>, PoolError> {
        self.charge_in_turn(len, None)
    }

    /// Counts `len` heap bytes of an incoming message against
    /// [`PoolConfig::heap_bytes`] until the returned [`HeapCharge`] is dropped. Checked
    /// before the caller allocates; a refusal can be waited out in line
    /// ([`join_line`](Self::join_line)), unless `len` alone is over the budget.
    pub fn charge_heap(&self, len: usize) -> Result<HeapCharge<S>, PoolError> {
        self.charge_heap_in_turn(len, None)
    }

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

    fn class_of(&self, len: usize) -> Option<usize> {
        self.shared
            .config
            .classes
            .iter()
            .position(|&size| size >= len)
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
    fn who(&self, place: Option<&PlaceInLine<S>>) -> Option<u64> {
        let place = place?;
        assert!(
            Arc::ptr_eq(&place.pool, &self.shared),
            "a place in another pool's line"
        );
        Some(place.id)
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
        let limit = self.shared.config.heap_bytes;
        let mut state = self.shared.state.lock().expect("pool lock");
        if let Some(id) = who {
            state.lines.retrying(Line::Heap, id);
        }
        let reserved = state.lines.reserved(Line::Heap, who).bytes;
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

    /// The most [`charge_heap`](Self::charge_heap) can ever grant at once.
    pub fn heap_limit(&self) -> usize {
        self.shared.config.heap_bytes
    }

    /// The most a charge or a lease of a class other than the smallest can ever take:
    /// asks beyond it will never fit, however long they wait.
    pub fn bulk_limit(&self) -> usize {
        bulk_limit(&self.shared.config)
    }

    /// Current counters.
    pub fn stats(&self) -> PoolStats {
        let state = self.shared.state.lock().expect("pool lock");
        PoolStats {
            registered_bytes: state.registered,
            charged_bytes: state.charged,
            peak_bytes: state.peak,
            leased: state.classes.iter().map(|c| c.leased).collect(),
            arenas: state.classes.iter().map(|c| c.arenas.len()).collect(),
            waits: state.waits,
            waiting: [Line::Smallest, Line::Bulk, Line::Heap].map(|l| state.lines.len(l)),
            exhausted: state.exhausted,
            heap_bytes: state.heap,
        }
    }
}

impl<S: ChunkSource> std::fmt::Debug for Pool<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("config", &self.shared.config)
            .field("stats", &self.stats())
            .finish()
    }
}

/// A chunk on loan from a pool; goes back to its free list when dropped, and its arena
/// back to the system once wholly idle (above [`PoolConfig::keep_bytes`]).
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

/// Heap bytes of an incoming message counted against [`PoolConfig::heap_bytes`] (see
/// [`Pool::charge_heap`]); uncounted when dropped.
pub struct HeapCharge<S: ChunkSource = RegisteredChunks> {
    len: usize,
    pool: Arc<Shared<S>>,
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

impl<S: ChunkSource> std::fmt::Debug for Charge<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Charge").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Plain heap chunks, counting arenas grown and chunks dropped, so the bookkeeping is
    /// tested without RDMA.
    #[derive(Default)]
    struct Heap {
        arenas: AtomicUsize,
    }

    impl ChunkSource for Heap {
        type Chunk = Vec<u8>;
        fn grow(&self, size: usize, count: usize) -> Result<Vec<Vec<u8>>, PoolError> {
            self.arenas.fetch_add(1, Ordering::Relaxed);
            Ok((0..count).map(|_| vec![0; size]).collect())
        }
    }

    /// Classes of 64, 256 and 1024 B in arenas of 1 KiB; nothing reserved, every idle
    /// arena kept (the behaviour of a pool that never shrinks).
    fn pool(max: usize) -> Pool<Heap> {
        Pool::new(
            Heap::default(),
            PoolConfig {
                classes: vec![1024, 64, 256],
                arena_bytes: 1024,
                max_bytes: max,
                reserved_smallest: 0,
                keep_bytes: usize::MAX / 2,
                heap_bytes: 4 << 10,
            },
        )
    }

    /// The same classes under a cap of 16 KiB, 2 KiB of it reserved for the smallest
    /// class, idle arenas returned down to `keep` bytes.
    fn shrinking(keep: usize) -> Pool<Heap> {
        Pool::new(
            Heap::default(),
            PoolConfig {
                classes: vec![64, 256, 1024],
                arena_bytes: 1024,
                max_bytes: 16 << 10,
                reserved_smallest: 2 << 10,
                keep_bytes: keep,
                heap_bytes: 4 << 10,
            },
        )
    }

    #[test]
    fn smallest_fitting_class_is_used() {
        let p = pool(1 << 20);
        assert_eq!(p.lease(1).unwrap().len(), 64);
        assert_eq!(p.lease(65).unwrap().len(), 256);
        assert_eq!(p.lease(1024).unwrap().len(), 1024);
        assert!(matches!(
            p.lease(1025),
            Err(PoolError::TooLarge {
                len: 1025,
                largest: 1024
            })
        ));
    }

    #[test]
    fn leases_return_on_drop_and_are_reused() {
        let p = pool(1 << 20);
        let a = p.lease(64).unwrap();
        let b = p.lease(64).unwrap();
        assert_eq!(p.stats().leased, vec![2, 0, 0]);
        drop((a, b));
        assert_eq!(p.stats().leased, vec![0, 0, 0]);
        let held: Vec<_> = (0..16).map(|_| p.lease(64).unwrap()).collect();
        assert_eq!(
            p.shared.source.arenas.load(Ordering::Relaxed),
            1,
            "one arena of 16"
        );
        drop(held);
        assert_eq!(p.stats().registered_bytes, 1024);
    }

    #[test]
    fn exhaustion_is_an_error_not_a_panic() {
        let p = pool(2048);
        let held: Vec<_> = (0..2).map(|_| p.lease(1024).unwrap()).collect();
        let err = p.lease(1000).unwrap_err();
        assert!(
            matches!(
                err,
                PoolError::Exhausted {
                    class: 1024,
                    limit: 2048
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("exhausted"));
        drop(held);
        assert!(p.lease(1000).is_ok(), "freed chunks serve again");
    }

    #[test]
    fn leases_move_across_threads() {
        let p = pool(1 << 20);
        let leases: Vec<_> = (0..8).map(|_| p.lease(200).unwrap()).collect();
        std::thread::spawn(move || drop(leases)).join().unwrap();
        assert_eq!(p.stats().leased, vec![0, 0, 0]);
    }

    /// Issue 16, item 4, scaled down: a burst of largest-class leases takes all the cap
    /// it may, yet the smallest class (receive buffers) still leases from its
    /// reservation; once the burst is over its arenas go back and the whole cap serves
    /// the smallest class.
    #[test]
    fn a_burst_of_large_leases_never_starves_the_smallest_class() {
        let p = shrinking(0);
        let mut burst = Vec::new();
        while let Ok(l) = p.lease(1024) {
            burst.push(l);
        }
        assert_eq!(burst.len(), 14, "the cap less the 2 KiB reservation");
        assert!(matches!(
            p.lease(1024),
            Err(PoolError::Exhausted {
                class: 1024,
                limit: 14336
            })
        ));
        let recv: Vec<_> = (0..32).map(|_| p.lease(64).unwrap()).collect();
        assert_eq!(p.stats().registered_bytes, 16 << 10);
        drop(burst);
        let stats = p.stats();
        assert_eq!(
            stats.arenas,
            vec![2, 0, 0],
            "idle arenas returned: {stats:?}"
        );
        assert_eq!(stats.registered_bytes, 2048);
        let more: Vec<_> = (0..16 * 16 - 32).map(|_| p.lease(64).unwrap()).collect();
        assert_eq!(p.stats().registered_bytes, 16 << 10, "the whole cap");
        drop((recv, more));
        assert_eq!(p.stats().registered_bytes, 0);
        assert_eq!(p.stats().peak_bytes, 16 << 10);
    }

    #[test]
    fn idle_arenas_are_kept_up_to_the_floor() {
        let p = shrinking(3 << 10);
        let held: Vec<_> = (0..6).map(|_| p.lease(1024).unwrap()).collect();
        drop(held);
        assert_eq!(p.stats().registered_bytes, 3 << 10, "kept for reuse");
        let grown = p.shared.source.arenas.load(Ordering::Relaxed);
        let again: Vec<_> = (0..3).map(|_| p.lease(1024).unwrap()).collect();
        assert_eq!(
            p.shared.source.arenas.load(Ordering::Relaxed),
            grown,
            "kept arenas serve without registering"
        );
        drop(again);
    }

    /// Arenas kept under the floor are still reclaimed when another class needs the room.
    #[test]
    fn kept_arenas_are_reclaimed_under_pressure() {
        let p = shrinking(usize::MAX / 2);
        drop((0..14).map(|_| p.lease(1024).unwrap()).collect::<Vec<_>>());
        assert_eq!(p.stats().registered_bytes, 14 << 10, "all kept");
        let small: Vec<_> = (0..16 * 16).map(|_| p.lease(64).unwrap()).collect();
        assert_eq!(p.stats().arenas, vec![16, 0, 0]);
        drop(small);
    }

    #[test]
    fn a_class_that_cannot_grow_borrows_a_larger_free_chunk() {
        let p = Pool::new(
            Heap::default(),
            PoolConfig {
                classes: vec![64, 256, 1024],
                arena_bytes: 2048,
                max_bytes: 16 << 10,
                reserved_smallest: 2 << 10,
                keep_bytes: usize::MAX / 2,
                heap_bytes: 4 << 10,
            },
        );
        let mut big: Vec<_> = (0..14).map(|_| p.lease(1024).unwrap()).collect();
        // One 1 KiB chunk free in an arena still in use; the bulk limit is reached.
        big.pop();
        let mid = p.lease(256).unwrap();
        assert_eq!(mid.len(), 1024, "borrowed from the larger class");
        assert_eq!(p.stats().leased, vec![0, 0, 14]);
        assert!(p.lease(256).is_err(), "nothing left to borrow");
        drop(mid);
        assert_eq!(
            p.stats().leased,
            vec![0, 0, 13],
            "returned to its own class"
        );
        drop(big);
    }

    #[test]
    fn charges_count_against_the_bulk_limit() {
        let p = shrinking(usize::MAX / 2);
        drop(p.lease(1024).unwrap());
        let c = p.charge(14 << 10).unwrap();
        assert_eq!(c.len(), 14 << 10);
        let err = p.charge(1).unwrap_err();
        assert!(matches!(err, PoolError::ChargeRefused { .. }), "{err}");
        assert_eq!(
            p.stats().registered_bytes,
            0,
            "the idle 1 KiB arena was reclaimed for the first charge"
        );
        assert!(p.lease(64).is_ok(), "the reservation still serves");
        drop(c);
        assert_eq!(p.stats().charged_bytes, 0);
        assert!(p.charge(14 << 10).is_ok());
    }

    /// A waker counting its calls.
    fn counter() -> (Arc<AtomicUsize>, RoomWaker) {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        (
            calls,
            Arc::new(move || {
                c.fetch_add(1, Ordering::SeqCst);
            }),
        )
    }

    #[test]
    fn only_the_head_is_woken_and_the_next_once_it_leaves() {
        let p = shrinking(usize::MAX / 2);
        let held = p.charge(14 << 10).unwrap();
        assert!(p.charge(1 << 10).is_err());
        let (first_calls, first_wake) = counter();
        let (second_calls, second_wake) = counter();
        let first = p.join_line(Ask::Charge(1 << 10), first_wake);
        let second = p.join_line(Ask::Charge(1 << 10), second_wake);
        assert_eq!((first.ahead(), second.ahead()), (0, 1));
        assert_eq!(p.stats().waiting, [0, 2, 0]);
        drop(p.lease(64).unwrap());
        assert_eq!(
            first_calls.load(Ordering::SeqCst),
            1,
            "a return wakes the head"
        );
        assert_eq!(second_calls.load(Ordering::SeqCst), 0, "and only the head");
        drop(p.lease(64).unwrap());
        assert_eq!(
            first_calls.load(Ordering::SeqCst),
            1,
            "a head woken and not yet retried is not woken again"
        );
        assert!(
            p.charge_in_turn(1 << 10, Some(&first)).is_err(),
            "still full: the retry fails"
        );
        drop(p.lease(64).unwrap());
        assert_eq!(
            first_calls.load(Ordering::SeqCst),
            2,
            "after its retry, woken again"
        );
        drop(held);
        let got = p
            .charge_in_turn(1 << 10, Some(&first))
            .expect("room came back: the head is served");
        drop(first);
        assert_eq!(
            second_calls.load(Ordering::SeqCst),
            1,
            "the head's leaving wakes the next"
        );
        assert!(p.charge_in_turn(1 << 10, Some(&second)).is_ok());
        drop((second, got));
        assert_eq!(p.stats().waiting, [0, 0, 0]);
        assert_eq!(p.stats().waits, 2);
    }

    /// Without the reservation, a stream of small asks arriving after a large one keeps
    /// taking the room as it comes back, and the large one waits for ever.
    #[test]
    fn newcomers_cannot_take_the_room_the_head_waits_for() {
        let p = shrinking(usize::MAX / 2);
        // Bulk limit 14 KiB: 10 KiB held, a 6 KiB ask waits.
        let held = p.charge(10 << 10).unwrap();
        assert!(p.charge(6 << 10).is_err());
        let (_, wake) = counter();
        let head = p.join_line(Ask::Charge(6 << 10), wake);
        let small = p.charge(1 << 10);
        assert!(
            matches!(small, Err(PoolError::ChargeRefused { .. })),
            "4 KiB are free, but 1 KiB would leave the head's 6 KiB unable to fit: {small:?}"
        );
        drop(held);
        let small = p
            .charge(4 << 10)
            .expect("room for both: the newcomer goes too");
        assert!(
            p.charge(5 << 10).is_err(),
            "4 + 5 + the head's 6 would pass 14"
        );
        let big = p
            .charge_in_turn(6 << 10, Some(&head))
            .expect("the head's room was kept");
        drop((head, small, big));
        assert_eq!(p.stats().charged_bytes, 0);
    }

    #[test]
    fn the_last_free_chunk_of_the_heads_class_is_the_heads() {
        // One 1 KiB arena of 256 B chunks fits under the bulk limit; nothing more.
        let p = Pool::new(
            Heap::default(),
            PoolConfig {
                classes: vec![64, 256],
                arena_bytes: 1024,
                max_bytes: 2048,
                reserved_smallest: 1024,
                keep_bytes: usize::MAX / 2,
                heap_bytes: 4 << 10,
            },
        );
        let mut held: Vec<_> = (0..4).map(|_| p.lease(256).unwrap()).collect();
        assert!(p.lease(256).is_err());
        let (calls, wake) = counter();
        let head = p.join_line(Ask::Lease(256), wake);
        held.pop();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(
            p.lease(256).is_err(),
            "the one free chunk is kept for the head"
        );
        let mine = p
            .lease_in_turn(256, Some(&head))
            .expect("the head takes it");
        assert_eq!(mine.len(), 256);
        drop(head);
        assert!(p.lease(64).is_ok(), "other classes were never held back");
    }

    #[test]
    fn a_waiter_that_leaves_hands_the_head_on() {
        let p = pool(1 << 20);
        let held = p.charge_heap(4 << 10).unwrap();
        let (a_calls, a_wake) = counter();
        let (b_calls, b_wake) = counter();
        let a = p.join_line(Ask::Heap(2 << 10), a_wake);
        let b = p.join_line(Ask::Heap(1 << 10), b_wake);
        assert_eq!(a.line(), Line::Heap);
        drop(a);
        assert_eq!(b_calls.load(Ordering::SeqCst), 1, "b is the head now");
        assert_eq!(a_calls.load(Ordering::SeqCst), 0);
        assert_eq!(b.ahead(), 0);
        drop(held);
        assert_eq!(
            b_calls.load(Ordering::SeqCst),
            1,
            "woken and not retried before the return: not woken twice"
        );
        let got = p
            .charge_heap_in_turn(1 << 10, Some(&b))
            .expect("b is served");
        drop(b);
        drop(got);
        assert_eq!(p.stats().waiting, [0, 0, 0]);
    }

    #[test]
    fn heap_charges_are_bounded_and_wake_waiters_when_they_go() {
        let p = pool(1 << 20);
        let a = p.charge_heap(3 << 10).unwrap();
        let err = p.charge_heap(2 << 10).unwrap_err();
        assert!(
            matches!(
                err,
                PoolError::HeapFull {
                    len: 2048,
                    in_use: 3072,
                    limit: 4096
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string().contains("budget for incoming messages"),
            "{err}"
        );
        let (woken, wake) = counter();
        let place = p.join_line(Ask::Heap(2 << 10), wake);
        assert_eq!(p.stats().heap_bytes, 3 << 10);
        drop(a);
        assert_eq!(woken.load(Ordering::SeqCst), 1, "the waiter ran");
        assert_eq!(p.stats().heap_bytes, 0);
        let b = p.charge_heap_in_turn(2 << 10, Some(&place)).unwrap();
        drop(place);
        assert_eq!(p.stats().heap_bytes, 2 << 10);
        drop(b);
        assert!(p.charge_heap(p.heap_limit() + 1).is_err());
    }
}
