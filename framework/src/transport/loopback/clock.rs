//! The fabric's clock: one thread that runs what must happen later (RNR retries,
//! transport retransmissions and timeouts, delayed completions, connection timeouts).
//!
//! Nothing on the fast path touches it: a SEND that finds a receive, a WRITE, a READ
//! run on the poster's thread. Only work that waits is scheduled here, by a weak
//! reference, so a QP or CQ dropped meanwhile is simply skipped. The thread starts with
//! the first timer and ends when the fabric is dropped.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Instant;

/// Something the clock calls back when its time comes.
pub(super) trait Tick: Send + Sync {
    /// Its time has come (or passed: the clock never calls early, may call late).
    fn tick(&self);
}

struct Timer {
    at: Instant,
    seq: u64,
    what: Weak<dyn Tick>,
}

impl PartialEq for Timer {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Timer {}
impl PartialOrd for Timer {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Timer {
    /// Reversed, so that the max-heap yields the earliest deadline first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Default)]
struct State {
    timers: BinaryHeap<Timer>,
    seq: u64,
    started: bool,
    stop: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

/// The clock of one fabric.
#[derive(Default)]
pub(super) struct Clock {
    shared: Arc<Shared>,
}

impl Clock {
    /// Calls `what.tick()` at `at` (or soon after), unless `what` is gone by then.
    pub(super) fn schedule(&self, at: Instant, what: Weak<dyn Tick>) {
        let mut st = self.shared.state.lock().expect("clock lock");
        st.seq += 1;
        let seq = st.seq;
        st.timers.push(Timer { at, seq, what });
        if !st.started {
            st.started = true;
            let shared = self.shared.clone();
            let spawned = std::thread::Builder::new()
                .name("loopback-clock".into())
                .spawn(move || run(&shared));
            if let Err(e) = spawned {
                // No thread: timers never fire, so waiting work waits for ever; say so.
                tracing::error!(error = %e, "loopback: starting the clock thread failed");
                st.started = false;
            }
        }
        drop(st);
        self.shared.wake.notify_one();
    }
}

impl Drop for Clock {
    fn drop(&mut self) {
        // Not joined: the last fabric handle may be dropped by a tick on the clock
        // thread itself.
        self.shared.state.lock().expect("clock lock").stop = true;
        self.shared.wake.notify_one();
    }
}

fn run(shared: &Shared) {
    let mut due: Vec<Weak<dyn Tick>> = Vec::with_capacity(16);
    let mut st = shared.state.lock().expect("clock lock");
    loop {
        if st.stop {
            return;
        }
        let now = Instant::now();
        while st.timers.peek().is_some_and(|t| t.at <= now) {
            due.extend(st.timers.pop().map(|t| t.what));
        }
        if !due.is_empty() {
            drop(st);
            for what in due.drain(..) {
                if let Some(what) = what.upgrade() {
                    what.tick();
                }
            }
            st = shared.state.lock().expect("clock lock");
            continue;
        }
        st = match st.timers.peek().map(|t| t.at) {
            Some(at) => {
                let wait = at.saturating_duration_since(now);
                shared.wake.wait_timeout(st, wait).expect("clock lock").0
            }
            None => shared.wake.wait(st).expect("clock lock"),
        };
    }
}
