//! The epoch ticker behind the wall-clock limit.
//!
//! Compiled guest code checks the engine's epoch counter at function entries and loop
//! back-edges (wasmtime's epoch interruption: a load and a compare, far cheaper than
//! reading a clock). This thread advances the counter every [`TICK`] while at least one
//! invocation runs (and for [`LINGER_TICKS`] after the last one), and parks otherwise;
//! at each tick a running store compares the time
//! with its own deadline and stops the guest once it has passed. So a timeout stops the
//! work itself within about a tick, on the thread that runs it: no worker is left
//! burning after its caller was told `Timeout`.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use wasmtime::Engine;

/// How often the epoch advances while guests run: the granularity of the wall clock.
pub(super) const TICK: Duration = Duration::from_millis(1);
/// Ticks the thread goes on ticking after the last invocation ended, before it parks.
/// Parking and waking cost a futex call and two context switches per invocation, which
/// showed in the VM's `lambda_bench` (0.1 to 0.3 ms per 1 MiB invocation); a server
/// under load keeps the ticker awake instead, at the price of 100 idle ticks.
const LINGER_TICKS: u32 = 100;

#[derive(Default)]
struct State {
    /// Invocations running now.
    active: usize,
    stop: bool,
    /// The thread waits on the condvar (and must be woken for the next invocation).
    parked: bool,
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

    /// Marks one invocation as running until the guard drops.
    pub fn running(&self) -> Running {
        let mut state = self.shared.lock();
        state.active += 1;
        if state.parked {
            self.shared.wake.notify_one();
        }
        Running(Arc::clone(&self.shared))
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
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An invocation in progress (see [`EpochTicker::running`]).
pub(super) struct Running(Arc<Shared>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.lock().active -= 1;
    }
}

fn tick(shared: &Shared, engine: &Engine) {
    let mut idle_ticks = 0;
    loop {
        {
            let mut state = shared.lock();
            if state.active == 0 {
                idle_ticks += 1;
            } else {
                idle_ticks = 0;
            }
            while state.active == 0 && !state.stop && idle_ticks > LINGER_TICKS {
                state.parked = true;
                state = shared
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
                state.parked = false;
                if state.active > 0 {
                    idle_ticks = 0;
                }
            }
            if state.stop {
                return;
            }
        }
        thread::sleep(TICK);
        engine.increment_epoch();
    }
}
