//! The epoch ticker behind the wall-clock limit.
//!
//! Compiled guest code checks the engine's epoch counter at function entries and loop
//! back-edges (wasmtime's epoch interruption: a load and a compare, far cheaper than
//! reading a clock). Every running store asks to hear about the next epoch, and when it
//! does it compares the time with its own deadline: it stops its guest once the deadline
//! has passed and waits for the next epoch otherwise.
//!
//! This thread advances the epoch only when a deadline is due: it sleeps until the
//! earliest deadline of the invocations running, advances the epoch then, and every
//! [`TICK`] after that for as long as an overdue invocation is still running (a guest
//! inside a long host call notices only when it returns to its own code). So a timeout
//! stops the work itself within about a tick, on the thread that runs it: no worker is
//! left burning after its caller was told `Timeout`. Invocations that end before their
//! deadline, as nearly all do, cost no tick at all. An earlier version ticked every
//! millisecond while anything ran: under the test VM's emulated CPU those wake-ups (a
//! context switch each, and the second virtual CPU kept busy) showed in
//! `lambda_bench`'s figures.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use wasmtime::Engine;

/// How often the epoch advances while an invocation past its deadline still runs: the
/// granularity of the wall clock for a guest that did not stop at the first epoch.
pub(super) const TICK: Duration = Duration::from_millis(1);

#[derive(Default)]
struct State {
    /// Deadlines of the invocations running now, each with how many share it.
    deadlines: BTreeMap<Instant, usize>,
    /// When the thread looks at `deadlines` next, unless woken (`None`: not before it is
    /// woken). An invocation whose deadline comes later needs no wake-up: the thread
    /// finds it then. In steady use (equal wall-clock limits, so each deadline later than
    /// the last) an invocation wakes nobody.
    wakes_at: Option<Instant>,
    stop: bool,
}

impl State {
    fn earliest(&self) -> Option<Instant> {
        self.deadlines.keys().next().copied()
    }
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

/// Owns the ticker thread; dropping it stops and joins the thread.
pub(super) struct EpochTicker {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    /// Starts the ticker thread for `engine`.
    pub fn start(engine: Engine) -> std::io::Result<Self> {
        let shared = Arc::new(Shared::default());
        let theirs = Arc::clone(&shared);
        let thread = thread::Builder::new()
            .name("lambda-epoch".into())
            .spawn(move || tick(&theirs, &engine))?;
        Ok(EpochTicker {
            shared,
            thread: Some(thread),
        })
    }

    /// Marks one invocation with this `deadline` as running until the guard drops: the
    /// epoch advances at the deadline (and every [`TICK`] after it) while it runs.
    pub fn running(&self, deadline: Instant) -> Running {
        let mut state = self.shared.lock();
        *state.deadlines.entry(deadline).or_insert(0) += 1;
        if state.wakes_at.is_none_or(|at| deadline < at) {
            // The thread sleeps past this deadline: it must look again.
            state.wakes_at = Some(deadline);
            self.shared.wake.notify_one();
        }
        Running {
            shared: Arc::clone(&self.shared),
            deadline,
        }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An invocation in progress (see [`EpochTicker::running`]).
pub(super) struct Running {
    shared: Arc<Shared>,
    deadline: Instant,
}

impl Drop for Running {
    fn drop(&mut self) {
        // The thread is not woken: if it sleeps until this deadline, it wakes then,
        // finds it gone and sleeps again (until the next one, or until woken).
        let mut state = self.shared.lock();
        if let Some(n) = state.deadlines.get_mut(&self.deadline) {
            *n -= 1;
            if *n == 0 {
                state.deadlines.remove(&self.deadline);
            }
        }
    }
}

fn tick(shared: &Shared, engine: &Engine) {
    // When the epoch last advanced for an overdue invocation (then the next tick is due
    // a `TICK` later, not at once).
    let mut ticked: Option<Instant> = None;
    let mut state = shared.lock();
    loop {
        if state.stop {
            return;
        }
        let Some(first) = state.earliest() else {
            ticked = None;
            state.wakes_at = None;
            state = shared
                .wake
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            continue;
        };
        let due = match ticked {
            Some(at) if at >= first => at + TICK,
            _ => first,
        };
        let now = Instant::now();
        if now < due {
            state.wakes_at = Some(due);
            state = shared
                .wake
                .wait_timeout(state, due - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            continue;
        }
        engine.increment_epoch();
        ticked = Some(now);
    }
}
