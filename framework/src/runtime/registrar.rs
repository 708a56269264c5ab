//! Threads of the framework's own for pinning and unpinning large messages (the
//! registrations behind a rendezvous offer, and their release).
//!
//! They used to run on the runtime's blocking pool, which is also where sessions run
//! their jobs (`SessionCx::spawn_blocking`: hashing files, writing them to disk). That
//! pool queues work once all its threads are busy, so a service with many slow jobs
//! under way, or a client that asks for many, held up every connection's large
//! messages behind them. Here registrations wait only for one another.
//!
//! Two threads, started on first use and kept for the life of the process (idle ones
//! sleep in `recv`): a registration pins pages in the kernel and takes milliseconds at
//! most (0.4 ms on average for 8 MiB in the test VM), so two keep a large message from
//! waiting behind another one being pinned, and more would only contend for the same
//! memory-map lock. If the threads cannot be started, the work goes to the runtime's
//! blocking pool as before.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};

/// Threads in the pool.
const THREADS: usize = 2;

type Job = Box<dyn FnOnce() + Send>;

/// Where jobs go: `None` when the threads could not be started.
static POOL: OnceLock<Option<mpsc::Sender<Job>>> = OnceLock::new();

fn start() -> Option<mpsc::Sender<Job>> {
    let (tx, rx) = mpsc::channel::<Job>();
    let rx = Arc::new(Mutex::new(rx));
    let mut started = 0;
    for i in 0..THREADS {
        let rx = Arc::clone(&rx);
        let spawned = std::thread::Builder::new()
            .name(format!("rdmactor-register-{i}"))
            .spawn(move || loop {
                // One thread waits in `recv` holding the lock, the others on the lock.
                let job = match rx.lock() {
                    Ok(rx) => rx.recv(),
                    Err(_) => return,
                };
                let Ok(job) = job else { return };
                // A job that panics must not take the thread (and the pool) with it.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            });
        match spawned {
            Ok(_) => started += 1,
            Err(e) => tracing::warn!(error = %e, "cannot start a registration thread"),
        }
    }
    (started > 0).then_some(tx)
}

/// Runs `job` on the registration threads; on the runtime's blocking pool if they
/// could not be started, or here when there is no runtime either.
pub(crate) fn run(job: impl FnOnce() + Send + 'static) {
    let job: Job = Box::new(job);
    let job = match POOL.get_or_init(start) {
        Some(tx) => match tx.send(job) {
            Ok(()) => return,
            // Every thread is gone.
            Err(mpsc::SendError(job)) => job,
        },
        None => job,
    };
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => drop(rt.spawn_blocking(job)),
        Err(_) => job(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn jobs_run_on_the_registration_threads_even_when_one_panics() {
        let (tx, rx) = mpsc::channel();
        run(|| panic!("a job that panics"));
        for _ in 0..4 {
            let tx = tx.clone();
            run(move || {
                let name = std::thread::current().name().map(str::to_owned);
                let _ = tx.send(name);
            });
        }
        for _ in 0..4 {
            let name = rx.recv_timeout(Duration::from_secs(10)).expect("job ran");
            assert!(
                name.is_some_and(|n| n.starts_with("rdmactor-register-")),
                "ran on a registration thread"
            );
        }
    }
}
