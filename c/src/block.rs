//! Waiting on the caller's own thread for a future that needs no runtime.
//!
//! A request, a one-way send and a READ hand a message to the connection's actor and
//! wait for its answer on a channel; neither step needs an executor, only a waker. So
//! the blocking calls park the C caller's thread and let the actor's answer unpark it,
//! instead of going through the context's runtime thread and back: the round trip of
//! a blocking request is then what a Rust client awaiting it pays.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// `fut`'s output, or `None` once `timeout` passed (the future is then dropped, which
/// abandons what it waited for).
pub(crate) fn block_on<F: Future>(fut: F, timeout: Option<Duration>) -> Option<F::Output> {
    let mut fut = pin!(fut);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return Some(out);
        }
        // A spurious unpark (or one left from an earlier call on this thread) only
        // costs another poll.
        match deadline {
            None => std::thread::park(),
            Some(deadline) => {
                let now = Instant::now();
                if now >= deadline {
                    return None;
                }
                std::thread::park_timeout(deadline - now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_from_another_thread_wake_the_caller() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            let _ = tx.send(7);
        });
        assert_eq!(block_on(rx, None).map(Result::ok), Some(Some(7)));
    }

    #[test]
    fn a_deadline_ends_the_wait() {
        let (_tx, rx) = tokio::sync::oneshot::channel::<()>();
        let start = Instant::now();
        assert!(block_on(rx, Some(Duration::from_millis(30))).is_none());
        assert!(start.elapsed() >= Duration::from_millis(30));
    }
}
