//! State every connection of a service shares, kept by one actor: [`Owner`] holds its
//! address, starts it when first needed and again if the actix system it ran in stopped.
//!
//! Which to choose, an owner actor or a sharded map, is discussed with measured costs in
//! `docs/writing-a-service.md` ("State shared by connections").

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use actix::{Actor, Addr, Arbiter, ArbiterHandle, Context};

/// The address of a service's owner actor: the one actor that holds what the service's
/// connections share (a map, quotas, a cache, job slots), so that no lock is held on
/// the data path and every change to it is one message handled in order.
///
/// The actor is started when first asked for rather than with the service, because a
/// service is usually built before the actix system runs ([`ServerBuilder::run`] builds
/// the system itself). It is started again, empty, if the thread it ran on stopped (its
/// actix system, as when a service value is reused across systems in tests, or its
/// arbiter), since what it owned went with it. Clones share the one address; the lock guards only the address, for a few
/// instructions per call, never the owned state.
///
/// # Which thread it runs on
///
/// An actix actor runs on the arbiter (thread) it was started on, and every message to
/// it is handled there:
///
/// - [`get_or_start`](Self::get_or_start) starts it on the calling thread's arbiter. From
///   `Service::session` that is the CM actor's thread: the thread whose actix system
///   started the server (with [`ServerBuilder::run`], the thread that called `run`). From
///   a request handler or a session callback it is that connection's poller thread,
///   which the owner then shares with the connections it polls.
/// - [`get_or_start_dedicated`](Self::get_or_start_dedicated) starts it on a thread of
///   its own, stopped with the last clone of the `Owner`. Choose it for an owner asked on
///   every request (a store, a cache): on a poller thread its mailbox takes turns with
///   every handler call and connection that thread runs, and under a flood a polite
///   client's request waited seconds there (issue 45); on its own thread it answers in
///   microseconds whatever the pollers carry.
/// - [`get_or_start_in`](Self::get_or_start_in) starts it on an arbiter you choose.
///
/// A request from a connection on another thread costs two cross-thread hops; one on the
/// same thread, two mailbox turns (the figures are in the guide).
///
/// [`ServerBuilder::run`]: crate::runtime::ServerBuilder::run
pub struct Owner<A: Actor<Context = Context<A>>>(Arc<Mutex<Slot<A>>>);

/// The address, and the thread of a [dedicated](Owner::get_or_start_dedicated) owner,
/// stopped when the last `Owner` clone goes.
struct Slot<A: Actor<Context = Context<A>>> {
    addr: Option<Addr<A>>,
    thread: Option<Arbiter>,
}

impl<A: Actor<Context = Context<A>>> Drop for Slot<A> {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            thread.stop();
        }
    }
}

impl<A: Actor<Context = Context<A>>> Owner<A> {
    /// No actor yet: the first [`get_or_start`](Self::get_or_start) starts it.
    pub fn new() -> Self {
        Owner(Arc::new(Mutex::new(Slot {
            addr: None,
            thread: None,
        })))
    }

    /// The running owner, started with `start` on the calling thread's arbiter if there
    /// is none or its system stopped. Call it on a thread of an actix system (a session
    /// is made on one, a request handler runs on one); elsewhere actix panics.
    pub fn get_or_start(&self, start: impl FnOnce() -> A) -> Addr<A> {
        self.get_or(|| start().start())
    }

    /// As [`get_or_start`](Self::get_or_start), but a new actor starts on `arbiter`'s
    /// thread, which may be any thread of any running system.
    pub fn get_or_start_in(
        &self,
        arbiter: &ArbiterHandle,
        start: impl FnOnce() -> A + Send + 'static,
    ) -> Addr<A>
    where
        A: Send,
    {
        self.get_or(|| A::start_in_arbiter(arbiter, move |_| start()))
    }

    /// As [`get_or_start`](Self::get_or_start), but a new actor starts on a thread of its
    /// own (an arbiter of the calling thread's actix system), which stops with the last
    /// clone of this `Owner` (or when that system stops, after which the next call starts
    /// both again).
    pub fn get_or_start_dedicated(&self, start: impl FnOnce() -> A + Send + 'static) -> Addr<A>
    where
        A: Send,
    {
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(addr) = slot.addr.as_ref().filter(|a| a.connected()) {
            return addr.clone();
        }
        if let Some(old) = slot.thread.take() {
            old.stop();
        }
        let thread = Arbiter::new();
        let addr = A::start_in_arbiter(&thread.handle(), move |_| start());
        slot.thread = Some(thread);
        slot.addr = Some(addr.clone());
        addr
    }

    fn get_or(&self, start: impl FnOnce() -> Addr<A>) -> Addr<A> {
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match slot.addr.as_ref() {
            Some(addr) if addr.connected() => addr.clone(),
            _ => slot.addr.insert(start()).clone(),
        }
    }

    /// The owner, if one was started (it may have stopped since: see
    /// `Addr::connected`).
    pub fn get(&self) -> Option<Addr<A>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .addr
            .clone()
    }
}

impl<A: Actor<Context = Context<A>>> Default for Owner<A> {
    fn default() -> Self {
        Owner::new()
    }
}

impl<A: Actor<Context = Context<A>>> Clone for Owner<A> {
    fn clone(&self) -> Self {
        Owner(Arc::clone(&self.0))
    }
}

impl<A: Actor<Context = Context<A>>> fmt::Debug for Owner<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Owner")
            .field("running", &self.get().is_some_and(|a| a.connected()))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Counter;
    impl Actor for Counter {
        type Context = Context<Self>;
    }

    #[test]
    fn one_owner_per_system_and_a_new_one_after_it_stopped() {
        let owner = Owner::<Counter>::new();
        let first = actix::System::new().block_on({
            let owner = owner.clone();
            async move {
                let a = owner.get_or_start(|| Counter);
                let b = owner.get_or_start(|| unreachable!("already running"));
                assert_eq!(a, b);
                a
            }
        });
        assert!(!first.connected(), "its system stopped");
        actix::System::new().block_on(async move {
            let again = owner.get_or_start(|| Counter);
            assert_ne!(again, first);
            assert!(again.connected());
        });
    }

    #[test]
    fn a_dedicated_owner_runs_on_its_own_thread_until_the_last_clone_goes() {
        struct Where;
        impl Actor for Where {
            type Context = Context<Self>;
        }
        #[derive(actix::Message)]
        #[rtype(result = "std::thread::ThreadId")]
        struct Which;
        impl actix::Handler<Which> for Where {
            type Result = actix::MessageResult<Which>;
            fn handle(&mut self, _: Which, _: &mut Context<Self>) -> Self::Result {
                actix::MessageResult(std::thread::current().id())
            }
        }
        actix::System::new().block_on(async {
            let owner = Owner::<Where>::new();
            let addr = owner.get_or_start_dedicated(|| Where);
            let there = addr.send(Which).await.unwrap();
            assert_ne!(there, std::thread::current().id());
            let clone = owner.clone();
            assert_eq!(clone.get_or_start_dedicated(|| unreachable!()), addr);
            drop(owner);
            assert!(addr.send(Which).await.is_ok(), "a clone still holds it");
            drop(clone);
            // The thread stops: the actor's mailbox closes.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while addr.connected() {
                assert!(std::time::Instant::now() < deadline, "still running");
                actix::clock::sleep(std::time::Duration::from_millis(5)).await;
            }
        });
    }
}
