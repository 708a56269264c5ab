//! What the `lambda` service's connections share, and its owner: the module cache
//! (uploads held per client within quotas, least recently used let go first, holds
//! ended when a connection closes) and the job slots
//! ([`LambdaConfig::max_jobs`](super::LambdaConfig::max_jobs)).
//!
//! [`Budget`] is the plain state machine (no locking, no I/O); [`LambdaOwner`], one
//! actor per service, owns the one instance. Sessions ask it on control paths only, once
//! per request: an upload ([`Start`] with [`Want::Load`], then [`Insert`] after a cache
//! miss was compiled on a job thread) and an invocation ([`Start`] with [`Want::Module`]
//! or [`Want::Native`]: the lookup and the job slot in one answer). The input's READs and
//! the guest's run never go through it: the job thread runs the [`Compiled`] module it
//! was handed, and gives its slot back ([`JobSlot`]'s drop) when it ends.

use std::sync::Arc;

use actix::prelude::*;

use super::sandbox::{ClientId, Compiled, LambdaError, ModuleCache, ModuleHash, Quota, Sandbox};

/// The module cache and the job slots of one lambda service.
pub(crate) struct Budget {
    cache: ModuleCache,
    running: usize,
    max_jobs: usize,
}

/// What a session wants to start.
#[derive(Debug, Clone)]
pub(crate) enum Want {
    /// Upload of a module with this hash: held at once if cached, compiled otherwise.
    Load(ModuleHash),
    /// An invocation of a cached module.
    Module(ModuleHash),
    /// An invocation of a native lambda.
    Native,
}

/// What the session may do, as [`Budget::handle_start`] decided.
#[derive(Debug)]
pub(crate) enum Go<S> {
    /// The upload's module was cached: the client holds it now; nothing to run.
    Held,
    /// Compile the upload on a job thread (with this slot), then [`Insert`] it.
    Compile(S),
    /// Run this module on a job thread (with this slot).
    Run(Compiled, S),
    /// Run the native lambda on a job thread (with this slot).
    Native(S),
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled")
            .field("cost", &self.cost)
            .finish_non_exhaustive()
    }
}

impl Budget {
    /// An empty cache within the sandbox's bounds and per-client quotas, and
    /// `max_jobs` job slots.
    pub(crate) fn new(sandbox: &Sandbox, max_jobs: usize) -> Budget {
        let c = sandbox.config();
        Budget {
            cache: ModuleCache::new(
                c.max_cached_modules,
                c.max_cached_bytes,
                Quota {
                    modules: c.max_modules_per_client,
                    bytes: c.max_bytes_per_client,
                },
            ),
            running: 0,
            max_jobs,
        }
    }

    /// Decides what `client` may start; a job slot, when one is needed, is counted as
    /// taken (give it back with [`handle_slot_freed`](Self::handle_slot_freed)). Returns
    /// how many modules left the cache too (a hold past the client's quota lets go of
    /// its oldest).
    ///
    /// # Errors
    ///
    /// [`Busy`](LambdaError::Busy) when every job slot is taken;
    /// [`UnknownLambda`](LambdaError::UnknownLambda) for a module not cached (never
    /// uploaded, or evicted since); [`CacheFull`](LambdaError::CacheFull) when a cached
    /// module alone exceeds the client's quota.
    pub(crate) fn handle_start(
        &mut self,
        client: ClientId,
        want: &Want,
    ) -> Result<(Go<()>, usize), LambdaError> {
        match want {
            Want::Load(hash) => match self.cache.hold(client, hash) {
                Some(held) => Ok((Go::Held, held?)),
                None => Ok((Go::Compile(self.claim()?), 0)),
            },
            Want::Module(hash) => {
                let compiled = self
                    .cache
                    .get(client, hash)
                    .ok_or_else(|| LambdaError::UnknownLambda(hash.to_string()))?;
                Ok((Go::Run(compiled, self.claim()?), 0))
            }
            Want::Native => Ok((Go::Native(self.claim()?), 0)),
        }
    }

    fn claim(&mut self) -> Result<(), LambdaError> {
        if self.running >= self.max_jobs {
            return Err(LambdaError::Busy {
                limit: self.max_jobs,
            });
        }
        self.running += 1;
        Ok(())
    }

    /// A job thread ended.
    pub(crate) fn handle_slot_freed(&mut self) {
        self.running = self.running.saturating_sub(1);
    }

    /// Caches a module `client` uploaded and a job compiled, held for it; returns how
    /// many modules left the cache.
    ///
    /// # Errors
    ///
    /// As [`ModuleCache::insert`]: [`CacheFull`](LambdaError::CacheFull),
    /// [`CacheTaken`](LambdaError::CacheTaken).
    pub(crate) fn handle_insert(
        &mut self,
        client: ClientId,
        hash: ModuleHash,
        compiled: Compiled,
    ) -> Result<usize, LambdaError> {
        self.cache.insert(client, hash, compiled)
    }

    /// The client's connection closed: its holds end; returns how many modules left the
    /// cache.
    pub(crate) fn handle_release(&mut self, client: ClientId) -> usize {
        self.cache.release(client)
    }

    /// Job threads running now.
    pub(crate) fn running(&self) -> usize {
        self.running
    }

    /// Modules cached now.
    pub(crate) fn cached_modules(&self) -> usize {
        self.cache.len()
    }

    /// `true` if the module is cached.
    pub(crate) fn contains(&self, hash: &ModuleHash) -> bool {
        self.cache.contains(hash)
    }

    /// Modules `client` holds.
    #[cfg(test)]
    pub(crate) fn held_by(&self, client: ClientId) -> usize {
        self.cache.held_by(client)
    }
}

/// Owns one lambda service's module cache and job slots (a `Budget`: the plain state
/// machine); a thin driver of it.
pub struct LambdaOwner {
    budget: Budget,
    /// Counts evictions and compilations for the application.
    sandbox: Arc<Sandbox>,
}

impl std::fmt::Debug for LambdaOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LambdaOwner")
            .field("cached_modules", &self.budget.cached_modules())
            .field("running_jobs", &self.budget.running())
            .finish()
    }
}

impl LambdaOwner {
    pub(crate) fn new(sandbox: Arc<Sandbox>, max_jobs: usize) -> LambdaOwner {
        LambdaOwner {
            budget: Budget::new(&sandbox, max_jobs),
            sandbox,
        }
    }
}

impl Actor for LambdaOwner {
    type Context = Context<Self>;
}

/// What `client` wants to start (see [`Budget::handle_start`]).
#[derive(Message)]
#[rtype(result = "Result<Go<JobSlot>, LambdaError>")]
pub(crate) struct Start {
    pub client: ClientId,
    pub want: Want,
}

/// A module `client` uploaded, compiled (see [`Budget::handle_insert`]).
#[derive(Message)]
#[rtype(result = "Result<(), LambdaError>")]
pub(crate) struct Insert {
    pub client: ClientId,
    pub hash: ModuleHash,
    pub compiled: Compiled,
}

/// A job slot is free again (sent by [`JobSlot`]'s drop).
#[derive(Message)]
#[rtype(result = "()")]
struct SlotFreed;

/// A client's holds end (sent by [`ClientHold`]'s drop).
#[derive(Message)]
#[rtype(result = "()")]
struct ReleaseClient(ClientId);

/// The cache and the job slots as they are now (for tests and logs).
#[derive(Message)]
#[rtype(result = "LambdaStats")]
pub struct Stats;

/// The answer to [`Stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LambdaStats {
    /// Modules in the service's cache.
    pub cached_modules: usize,
    /// Job threads running.
    pub running_jobs: usize,
}

/// `true` if a module with this hash is in the service's cache.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct Contains(pub ModuleHash);

impl LambdaOwner {
    fn evicted(&self, n: usize) {
        if n > 0 {
            self.sandbox.evicted(n);
        }
    }
}

impl Handler<Start> for LambdaOwner {
    type Result = Result<Go<JobSlot>, LambdaError>;

    fn handle(&mut self, msg: Start, ctx: &mut Context<Self>) -> Self::Result {
        let started = self.budget.handle_start(msg.client, &msg.want);
        if let Want::Load(_) = msg.want {
            match &started {
                Ok((Go::Held, _)) => rdmactor::metrics::lambda_module_load("cached"),
                Err(_) => rdmactor::metrics::lambda_module_load("refused"),
                Ok(_) => {}
            }
        }
        let (go, evicted) = started?;
        self.evicted(evicted);
        let slot = || JobSlot(ctx.address());
        Ok(match go {
            Go::Held => Go::Held,
            Go::Compile(()) => Go::Compile(slot()),
            Go::Run(compiled, ()) => Go::Run(compiled, slot()),
            Go::Native(()) => Go::Native(slot()),
        })
    }
}

impl Handler<Insert> for LambdaOwner {
    type Result = Result<(), LambdaError>;

    fn handle(&mut self, msg: Insert, _: &mut Context<Self>) -> Self::Result {
        let inserted = self
            .budget
            .handle_insert(msg.client, msg.hash, msg.compiled);
        rdmactor::metrics::lambda_module_load(if inserted.is_ok() {
            "compiled"
        } else {
            "refused"
        });
        self.evicted(inserted?);
        Ok(())
    }
}

impl Handler<SlotFreed> for LambdaOwner {
    type Result = ();

    fn handle(&mut self, _: SlotFreed, _: &mut Context<Self>) {
        self.budget.handle_slot_freed();
    }
}

impl Handler<ReleaseClient> for LambdaOwner {
    type Result = ();

    fn handle(&mut self, msg: ReleaseClient, _: &mut Context<Self>) {
        let evicted = self.budget.handle_release(msg.0);
        self.evicted(evicted);
    }
}

impl Handler<Stats> for LambdaOwner {
    type Result = MessageResult<Stats>;

    fn handle(&mut self, _: Stats, _: &mut Context<Self>) -> Self::Result {
        MessageResult(LambdaStats {
            cached_modules: self.budget.cached_modules(),
            running_jobs: self.budget.running(),
        })
    }
}

impl Handler<Contains> for LambdaOwner {
    type Result = bool;

    fn handle(&mut self, msg: Contains, _: &mut Context<Self>) -> bool {
        self.budget.contains(&msg.0)
    }
}

/// One of the service's job slots, held by a job thread; given back when dropped.
pub(crate) struct JobSlot(Addr<LambdaOwner>);

impl std::fmt::Debug for JobSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobSlot")
    }
}

impl Drop for JobSlot {
    fn drop(&mut self) {
        self.0.do_send(SlotFreed);
    }
}

/// A connection's client id in the service's cache; its holds end when dropped.
pub(crate) struct ClientHold {
    pub id: ClientId,
    owner: Addr<LambdaOwner>,
}

impl ClientHold {
    /// Client `id` (never 0, the application's) of `owner`'s cache.
    pub(crate) fn new(id: ClientId, owner: Addr<LambdaOwner>) -> ClientHold {
        ClientHold { id, owner }
    }
}

impl Drop for ClientHold {
    fn drop(&mut self) {
        self.owner.do_send(ReleaseClient(self.id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lambda::SandboxConfig;

    fn wat(text: &str) -> Vec<u8> {
        wat::parse_str(text).unwrap()
    }

    /// A minimal module of the ABI, distinct per `n`.
    fn module(n: u32) -> Vec<u8> {
        wat(&format!(
            r#"(module (memory (export "memory") 1)
                 (func (export "alloc") (param i32) (result i32) i32.const {n})
                 (func (export "run") (param i32 i32) (result i64) i64.const 0))"#
        ))
    }

    #[test]
    fn uploads_are_held_per_client_and_released_with_it() {
        let sandbox = Sandbox::with_config(SandboxConfig {
            max_modules_per_client: 1,
            ..SandboxConfig::default()
        });
        let mut b = Budget::new(&sandbox, 2);
        let (a, c) = (ClientId(1), ClientId(2));
        let (h1, m1) = sandbox.compile(&module(1)).unwrap();
        // A miss: compile on a job slot, then insert.
        assert!(matches!(
            b.handle_start(a, &Want::Load(h1)),
            Ok((Go::Compile(()), 0))
        ));
        b.handle_slot_freed();
        assert_eq!(b.handle_insert(a, h1, m1).unwrap(), 0);
        // A hit for another client: held at once, no slot.
        assert!(matches!(
            b.handle_start(c, &Want::Load(h1)),
            Ok((Go::Held, 0))
        ));
        assert_eq!((b.held_by(a), b.held_by(c), b.running()), (1, 1, 0));
        // Past its quota, a client lets go of its own oldest only.
        let (h2, m2) = sandbox.compile(&module(2)).unwrap();
        assert_eq!(b.handle_insert(c, h2, m2).unwrap(), 0, "h1 stays for a");
        assert!(b.contains(&h1) && b.contains(&h2));
        assert_eq!(b.handle_release(a), 1, "h1 had no other holder");
        assert!(!b.contains(&h1));
        assert!(matches!(
            b.handle_start(a, &Want::Module(h1)),
            Err(LambdaError::UnknownLambda(_))
        ));
        assert_eq!(b.handle_release(c), 1);
        assert_eq!(b.cached_modules(), 0);
    }

    #[test]
    fn job_slots_are_bounded_and_given_back() {
        let sandbox = Sandbox::new();
        let mut b = Budget::new(&sandbox, 2);
        let a = ClientId(1);
        let (h, m) = sandbox.compile(&module(3)).unwrap();
        b.handle_insert(a, h, m).unwrap();
        assert!(matches!(
            b.handle_start(a, &Want::Module(h)),
            Ok((Go::Run(..), 0))
        ));
        assert!(matches!(
            b.handle_start(a, &Want::Native),
            Ok((Go::Native(()), 0))
        ));
        assert_eq!(
            b.handle_start(a, &Want::Native).unwrap_err(),
            LambdaError::Busy { limit: 2 }
        );
        // A miss needs a slot too; a hit does not.
        let other = ModuleHash::of(b"not cached");
        assert!(b.handle_start(a, &Want::Load(other)).is_err());
        assert!(matches!(
            b.handle_start(a, &Want::Load(h)),
            Ok((Go::Held, 0))
        ));
        b.handle_slot_freed();
        assert!(b.handle_start(a, &Want::Native).is_ok());
        assert_eq!(b.running(), 2);
    }

    #[actix::test]
    async fn slots_and_holds_come_back_when_their_handles_drop() {
        let sandbox = Arc::new(Sandbox::new());
        let owner = LambdaOwner::new(sandbox.clone(), 1).start();
        let client = ClientHold::new(ClientId(1), owner.clone());
        let (h, m) = sandbox.compile(&module(4)).unwrap();
        owner
            .send(Insert {
                client: client.id,
                hash: h,
                compiled: m,
            })
            .await
            .unwrap()
            .unwrap();
        let start = |want| {
            owner.send(Start {
                client: client.id,
                want,
            })
        };
        let Go::Run(_, slot) = start(Want::Module(h)).await.unwrap().unwrap() else {
            panic!("a cached module runs");
        };
        assert!(matches!(
            start(Want::Native).await.unwrap(),
            Err(LambdaError::Busy { limit: 1 })
        ));
        drop(slot);
        assert!(matches!(
            start(Want::Native).await.unwrap(),
            Ok(Go::Native(_))
        ));
        assert_eq!(owner.send(Stats).await.unwrap().running_jobs, 0);
        drop(client);
        assert!(!owner.send(Contains(h)).await.unwrap());
    }
}
