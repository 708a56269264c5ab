//! Wake-ups from other threads, handed to their connections by the poller thread between
//! its passes, the way completions are.
//!
//! A job thread, a blocking closure or a service actor on another thread that has news
//! for a session calls its [`SessionWaker`]. Sent as a message to the connection's actor,
//! that wake-up waited in the arbiter's shared queue, which tokio's `LocalSet` serves one
//! task in 31 while its local queue has work, and a busy poller's always has. Under a
//! flood of 512 lambda connections, a polite client's finished job reached its session
//! 2-10 s after its thread signalled it, while its completions (routed by the poller
//! itself) took milliseconds. So the poller owns a queue of wake-ups: it drains it at
//! every pass and calls the connection directly, and a sleeping poller is rung awake.
//!
//! Connections are named by a key unique on their thread (never reused), not by QP
//! number: a QP number freed by a closed connection can be given to the next one, and a
//! late wake-up must not reach a session that never asked for it.
//!
//! [`SessionWaker`]: crate::runtime::SessionWaker

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::sync::Arc;

use tokio::sync::Notify;

use super::inbox::Inbox;

/// Wake-ups one pass hands out at most, so that a storm of them cannot keep the poller
/// from its CQs; the rest wait for the next pass.
const WAKES_PER_PASS: usize = 256;

/// The way into one poller thread's queue of wake-ups, from any thread.
#[derive(Clone)]
struct Way {
    tx: crossbeam_channel::Sender<(u64, u64)>,
    bell: Arc<Notify>,
}

thread_local! {
    /// This thread's way in, when it is a poller thread.
    static WAY: RefCell<Option<Way>> = const { RefCell::new(None) };
    /// The connections enrolled on this thread, by key. Weak: the connection's actor
    /// owns it.
    static TARGETS: RefCell<HashMap<u64, Weak<dyn Inbox>>> = RefCell::new(HashMap::new());
    /// The next key to give out on this thread.
    static NEXT_KEY: Cell<u64> = const { Cell::new(0) };
}

/// One connection's way back in through its poller thread; `Send`, held by its
/// [`SessionWaker`](crate::runtime::SessionWaker)s.
#[derive(Clone)]
pub(crate) struct WakeRoute {
    way: Way,
    key: u64,
}

impl WakeRoute {
    /// A key for a connection starting on this thread, and the way to it; `None` on a
    /// thread that is not a poller's (its wake-ups then go to the actor's mailbox).
    pub(crate) fn reserve() -> Option<WakeRoute> {
        let way = WAY.with(|w| w.borrow().clone())?;
        let key = NEXT_KEY.with(|k| {
            let key = k.get();
            k.set(key.wrapping_add(1));
            key
        });
        Some(WakeRoute { way, key })
    }

    /// This route's key, to [`enroll`] and [`withdraw`] it on its thread.
    pub(crate) fn key(&self) -> u64 {
        self.key
    }

    /// Queues `token` for the connection and rings its poller; false when the poller is
    /// gone (its thread stopped).
    pub(crate) fn wake(&self, token: u64) -> bool {
        if self.way.tx.send((self.key, token)).is_err() {
            return false;
        }
        self.way.bell.notify_one();
        true
    }
}

/// Delivers the wake-ups of `key` to `inbox` (on the thread that reserved the key).
pub(crate) fn enroll(key: u64, inbox: Weak<dyn Inbox>) {
    TARGETS.with(|t| t.borrow_mut().insert(key, inbox));
}

/// Forgets `key` (on its thread): wake-ups still queued for it are dropped.
pub(crate) fn withdraw(key: u64) {
    TARGETS.with(|t| t.borrow_mut().remove(&key));
}

/// A poller thread's end of its queue.
pub(crate) struct WakeQueue {
    rx: crossbeam_channel::Receiver<(u64, u64)>,
    bell: Arc<Notify>,
}

impl WakeQueue {
    /// Makes this thread a poller's: connections starting on it from now on reserve
    /// their routes here.
    pub(crate) fn install() -> WakeQueue {
        let (tx, rx) = crossbeam_channel::unbounded();
        let bell = Arc::new(Notify::new());
        WAY.with(|w| {
            *w.borrow_mut() = Some(Way {
                tx,
                bell: bell.clone(),
            });
        });
        WakeQueue { rx, bell }
    }

    /// Hands out the queued wake-ups (at most [`WAKES_PER_PASS`]); returns how many
    /// were taken. Each call into a connection is made with nothing borrowed, so a
    /// session may wake itself again from inside.
    pub(crate) fn deliver(&self) -> usize {
        let mut taken = 0;
        while taken < WAKES_PER_PASS {
            let Ok((key, token)) = self.rx.try_recv() else {
                break;
            };
            taken += 1;
            let target: Option<Rc<dyn Inbox>> =
                TARGETS.with(|t| t.borrow().get(&key).and_then(Weak::upgrade));
            if let Some(inbox) = target {
                inbox.wake(token);
            }
        }
        taken
    }

    /// Waits until a wake-up is queued (or was, since the last wait): for a poller about
    /// to sleep on its completion channel.
    pub(crate) async fn rung(&self) {
        self.bell.notified().await;
    }
}

/// Runs `wait` on the relay thread: a future that waits for work done elsewhere (a
/// blocking closure on the relay runtime's pool), then wakes a session through its
/// [`SessionWaker`].
///
/// Not on the connection's own thread: the closure's end would wake a task there, which
/// would wait in the arbiter's shared queue (see above) as a plain wake-up did. The
/// relay thread runs nothing else, so it takes the result at once and queues the
/// wake-up on the poller. (An actor's answer to `SessionCx::ask` needs no task at all:
/// its waker is the session's wake-up.)
///
/// [`SessionWaker`]: crate::runtime::SessionWaker
pub(crate) fn relay(wait: impl std::future::Future<Output = ()> + Send + 'static) {
    static RELAY: std::sync::OnceLock<tokio::runtime::Handle> = std::sync::OnceLock::new();
    let handle = RELAY.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime for the relay thread");
        let handle = runtime.handle().clone();
        std::thread::Builder::new()
            .name("rdmactor-relay".into())
            .spawn(move || runtime.block_on(std::future::pending::<()>()))
            .expect("the relay thread");
        handle
    });
    handle.spawn(wait);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::WorkCompletion;
    use std::time::Instant;

    struct Woken(RefCell<Vec<u64>>);

    impl Inbox for Woken {
        fn completions(&self, _: &[WorkCompletion], _: Instant, _: bool) {}
        fn wake(&self, token: u64) {
            self.0.borrow_mut().push(token);
        }
    }

    /// Wake-ups sent from another thread reach the enrolled connection in order; a
    /// withdrawn key's are dropped, and a new connection never gets an old key's.
    #[test]
    fn wakes_from_other_threads_reach_their_connection_only() {
        let queue = WakeQueue::install();
        let first = Rc::new(Woken(RefCell::new(Vec::new())));
        let route = WakeRoute::reserve().expect("a poller thread");
        enroll(route.key(), Rc::downgrade(&first) as Weak<dyn Inbox>);
        let sent = route.clone();
        std::thread::spawn(move || {
            for token in 0..3 {
                assert!(sent.wake(token));
            }
        })
        .join()
        .expect("waker thread");
        assert_eq!(queue.deliver(), 3);
        assert_eq!(*first.0.borrow(), vec![0, 1, 2]);

        withdraw(route.key());
        let second = Rc::new(Woken(RefCell::new(Vec::new())));
        let next = WakeRoute::reserve().expect("a poller thread");
        assert_ne!(next.key(), route.key(), "keys are never reused");
        enroll(next.key(), Rc::downgrade(&second) as Weak<dyn Inbox>);
        assert!(route.wake(9));
        assert!(next.wake(4));
        assert_eq!(queue.deliver(), 2);
        assert_eq!(*first.0.borrow(), vec![0, 1, 2], "withdrawn: nothing more");
        assert_eq!(*second.0.borrow(), vec![4]);
    }

    /// A thread that is not a poller's has no route (its wakers use the mailbox).
    #[test]
    fn other_threads_have_no_route() {
        assert!(std::thread::spawn(|| WakeRoute::reserve().is_none())
            .join()
            .expect("thread"));
    }
}
