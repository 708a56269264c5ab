//! Where a service keeps the address of the actor that owns what its sessions share.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use actix::{Actor, Addr, Context};

/// The address of a service's owner actor, shared by the service's clones. The actor is
/// started with the first session rather than with the service, as the service may be
/// built before the actor system runs; and started again if the system it ran in has
/// stopped (a service value reused across actix systems, as tests do), since what it
/// owned went with that system. The lock guards only this address, taken once per new
/// connection; the owned state itself is the actor's alone.
pub(crate) struct OwnerSlot<A: Actor<Context = Context<A>>>(Arc<Mutex<Option<Addr<A>>>>);

impl<A: Actor<Context = Context<A>>> OwnerSlot<A> {
    pub(crate) fn new() -> Self {
        OwnerSlot(Arc::new(Mutex::new(None)))
    }

    /// The running owner, started with `start` if there is none. Call it on a thread of
    /// the actor system (a session is made on one).
    pub(crate) fn get_or_start(&self, start: impl FnOnce() -> A) -> Addr<A> {
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match slot.as_ref() {
            Some(addr) if addr.connected() => addr.clone(),
            _ => slot.insert(start().start()).clone(),
        }
    }

    /// The owner, if one was started.
    pub(crate) fn get(&self) -> Option<Addr<A>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl<A: Actor<Context = Context<A>>> Clone for OwnerSlot<A> {
    fn clone(&self) -> Self {
        OwnerSlot(Arc::clone(&self.0))
    }
}

impl<A: Actor<Context = Context<A>>> fmt::Debug for OwnerSlot<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnerSlot")
            .field("running", &self.get().is_some_and(|a| a.connected()))
            .finish()
    }
}
