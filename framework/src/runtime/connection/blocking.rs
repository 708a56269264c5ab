//! Blocking work bounded per connection and per service, and skipped once its connection
//! is gone.
//!
//! tokio has one blocking pool for the whole process (512 threads by default). Before
//! issue 45, every `spawn_blocking` of every connection went straight to it: one client
//! sending many requests whose handlers hash or read files could take every thread, and
//! closures queued by a connection that had closed still ran, for nobody. Now a closure
//! first takes a place among its connection's (`ConnectionConfig::blocking_per_connection`
//! running, `blocking_queued_per_connection` started at all) and then one among its
//! service's (`blocking_per_service`), in order, and looks once more whether anyone still
//! waits for it before it starts.

use std::cell::OnceCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Semaphore;

/// Why a [`Blocking`](super::Blocking) task has no result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BlockingError {
    /// The closure panicked; the message is the panic's, when it was a string.
    #[error("blocking task panicked: {0}")]
    Panicked(String),
    /// The task was dropped before it ran (the runtime is shutting down).
    #[error("blocking task was dropped before it finished")]
    Lost,
    /// The connection already had as many closures started and not finished as it may
    /// (`ConnectionConfig::blocking_queued_per_connection`); this one was not started.
    #[error(
        "blocking task refused: {started} of this connection's {max} are started and not finished"
    )]
    Busy {
        /// Closures of this connection started and not finished.
        started: usize,
        /// The bound.
        max: usize,
    },
    /// The connection closed while the closure waited for its turn; it was not run.
    #[error("blocking task skipped: its connection closed before its turn")]
    Skipped,
}

/// A connection's bounds on its blocking closures. Nothing is allocated until its
/// session first runs one: most connections never do, and an idle connection's every
/// byte counts (ARCHITECTURE.md, "What an idle framed connection costs").
#[derive(Debug)]
pub(crate) struct BlockingGate {
    shared: OnceCell<BlockingHandle>,
    per_connection: usize,
    max_started: usize,
    /// The service's bound, once the connection's service is known (`None` for a
    /// client's connection: its application bounds it).
    service: Option<Arc<Semaphore>>,
}

impl BlockingGate {
    pub(crate) fn new(per_connection: usize, max_started: usize) -> Self {
        BlockingGate {
            shared: OnceCell::new(),
            per_connection,
            max_started,
            service: None,
        }
    }

    /// Counts closures of this connection under its service's bound too.
    pub(crate) fn under_service(&mut self, service: Arc<Semaphore>) {
        self.service = Some(service);
    }

    /// The handle closures of this connection share, made on first use.
    pub(crate) fn handle(&self) -> BlockingHandle {
        self.shared
            .get_or_init(|| BlockingHandle {
                inner: Arc::new(Inner {
                    running: Semaphore::new(self.per_connection),
                    started: AtomicUsize::new(0),
                    max_started: self.max_started,
                    service: self.service.clone(),
                }),
            })
            .clone()
    }
}

/// Where one connection's blocking closures wait their turn; cheap to clone into the
/// futures that run them.
#[derive(Debug, Clone)]
pub(crate) struct BlockingHandle {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Running closures of this connection.
    running: Semaphore,
    /// Closures started and not finished (running or waiting), against `max_started`.
    started: AtomicUsize,
    max_started: usize,
    /// Running closures of every connection of the service.
    service: Option<Arc<Semaphore>>,
}

/// A closure's place: counted as started until dropped.
pub(crate) struct Started {
    gate: Arc<Inner>,
}

impl Drop for Started {
    fn drop(&mut self) {
        self.gate.started.fetch_sub(1, Ordering::AcqRel);
        crate::metrics::blocking_started(-1.0);
    }
}

impl BlockingHandle {
    /// Takes a place for one more closure, or says the connection has too many.
    pub(crate) fn start(&self) -> Result<Started, BlockingError> {
        let started = self.inner.started.fetch_add(1, Ordering::AcqRel);
        let place = Started {
            gate: Arc::clone(&self.inner),
        };
        crate::metrics::blocking_started(1.0);
        if started >= self.inner.max_started {
            return Err(BlockingError::Busy {
                started,
                max: self.inner.max_started,
            });
        }
        Ok(place)
    }

    /// Waits for this connection's turn and then its service's, runs `f` on the
    /// blocking pool unless `alive` says nobody waits for it any more, and returns its
    /// result. A panic in `f` is caught and named.
    pub(crate) async fn run<R, F>(
        &self,
        place: Started,
        alive: impl Fn() -> bool,
        f: F,
    ) -> Result<R, BlockingError>
    where
        R: Send + 'static,
        F: FnOnce() -> R + Send + 'static,
    {
        let _place = place;
        // Nobody closes these semaphores: an error here cannot happen, but say so.
        let _conn = self
            .inner
            .running
            .acquire()
            .await
            .map_err(|_| BlockingError::Lost)?;
        let _service = match &self.inner.service {
            Some(s) => Some(s.acquire().await.map_err(|_| BlockingError::Lost)?),
            None => None,
        };
        if !alive() {
            return Err(BlockingError::Skipped);
        }
        match tokio::task::spawn_blocking(f).await {
            Ok(value) => Ok(value),
            Err(e) if e.is_panic() => Err(BlockingError::Panicked(
                super::lifecycle::panic_message(&*e.into_panic()),
            )),
            Err(_) => Err(BlockingError::Lost),
        }
    }
}

/// The per-service bounds of one server: a semaphore per service name, made on the
/// first connection of each.
#[derive(Debug, Default)]
pub(crate) struct ServiceGates {
    gates: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl ServiceGates {
    /// The gate of `service`, with `permits` places if it is new.
    pub(crate) fn of(&self, service: &str, permits: usize) -> Arc<Semaphore> {
        let mut gates = self.gates.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(
            gates
                .entry(service.to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(permits))),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn past_the_started_bound_a_closure_is_refused_at_once() {
        let gate = BlockingGate::new(1, 2).handle();
        let a = gate.start().expect("first");
        let _b = gate.start().expect("second");
        assert_eq!(
            gate.start().err(),
            Some(BlockingError::Busy { started: 2, max: 2 })
        );
        drop(a);
        assert!(gate.start().is_ok(), "a finished closure frees its place");
    }

    #[test]
    fn a_closure_whose_connection_is_gone_is_skipped() {
        let gate = BlockingGate::new(1, 4).handle();
        let ran = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&ran);
        let place = gate.start().unwrap();
        let got =
            rt().block_on(gate.run(place, || false, move || r.fetch_add(1, Ordering::SeqCst)));
        assert_eq!(got, Err(BlockingError::Skipped));
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        assert_eq!(
            gate.inner.started.load(Ordering::SeqCst),
            0,
            "its place is given back"
        );
    }

    #[test]
    fn closures_of_one_connection_run_at_most_n_at_once() {
        let gate = BlockingGate::new(2, 64).handle();
        let now = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        rt().block_on(async {
            let mut runs = Vec::new();
            for _ in 0..8 {
                let (now, most) = (Arc::clone(&now), Arc::clone(&most));
                let place = gate.start().unwrap();
                let g = gate.clone();
                runs.push(async move {
                    g.run(
                        place,
                        || true,
                        move || {
                            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(n, Ordering::SeqCst);
                            std::thread::sleep(std::time::Duration::from_millis(5));
                            now.fetch_sub(1, Ordering::SeqCst);
                        },
                    )
                    .await
                });
            }
            for r in futures_join(runs).await {
                r.expect("ran");
            }
        });
        assert!(most.load(Ordering::SeqCst) <= 2, "{most:?}");
    }

    /// Polls every future to the end on this task.
    async fn futures_join<F>(fs: Vec<F>) -> Vec<F::Output>
    where
        F: std::future::Future + 'static,
        F::Output: 'static,
    {
        let local = tokio::task::LocalSet::new();
        let handles: Vec<_> = fs.into_iter().map(|f| local.spawn_local(f)).collect();
        local
            .run_until(async move {
                let mut out = Vec::new();
                for h in handles {
                    out.push(h.await.expect("joined"));
                }
                out
            })
            .await
    }
}
