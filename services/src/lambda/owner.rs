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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use tokio::sync::oneshot;

use super::line::{JobLine, Tenant, Waiting};
use super::sandbox::{ClientId, Compiled, LambdaError, ModuleCache, ModuleHash, Quota, Sandbox};
use super::LambdaConfig;

/// A start's answer: what to do (with the input bytes its slot counts), and how many
/// modules left the cache.
pub(crate) type Started = Result<(Go<usize>, usize), LambdaError>;

/// The module cache and the job slots of one lambda service.
pub(crate) struct Budget {
    cache: ModuleCache,
    running: usize,
    max_jobs: usize,
    /// Bytes of input the running jobs hold (small ones apart), and the most they may
    /// (one job alone may always run): the service's share of the server's heap
    /// budget, so that a full service refuses in its own line rather than at the heap,
    /// where a polite client's small input would be refused as well.
    input_running: usize,
    max_input_running: usize,
    /// Inputs this small need only a slot (a polite client's small job is never held
    /// up by others' large inputs; the slots bound these to `max_jobs` × this).
    small_input: usize,
    /// Jobs waiting for a slot or for room, served in turn by tenant.
    line: JobLine<Want>,
    /// Answers to jobs that waited (by ticket): granted, or refused at the end of their
    /// wait; whether it was an upload.
    answers: Vec<(u64, bool, Started)>,
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

/// The room for inputs of running jobs, as it stands.
#[derive(Clone, Copy)]
struct Room {
    held: usize,
    most: usize,
    small: usize,
}

impl Room {
    /// `input` more bytes fit: a small input always does (the slots bound those), and a
    /// job alone whatever its size.
    fn fits(self, input: usize) -> bool {
        input <= self.small
            || self.held == 0
            || self.held.checked_add(input).is_some_and(|n| n <= self.most)
    }
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
    /// An empty cache within the sandbox's bounds and per-client quotas, the job slots
    /// and input bytes of `config`, and an empty line.
    pub(crate) fn new(sandbox: &Sandbox, config: &LambdaConfig) -> Budget {
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
            max_jobs: config.max_jobs,
            input_running: 0,
            max_input_running: config.max_input_running,
            small_input: config.read_chunk,
            line: JobLine::new(config.max_waiting_jobs, config.job_wait),
            answers: Vec::new(),
        }
    }

    /// Decides what `job` may start: at once, when a job slot and room for its input
    /// are free and nobody waits (the slot counted as taken, given back with
    /// [`handle_slot_freed`](Self::handle_slot_freed)); `None` when it waits in line for
    /// its turn (its answer comes out of [`take_answers`](Self::take_answers)). Also
    /// returns how many modules left the cache (a hold past the client's quota lets go of
    /// its oldest).
    ///
    /// # Errors
    ///
    /// [`Busy`](LambdaError::Busy) when the line is full of `tenant`'s own jobs;
    /// [`UnknownLambda`](LambdaError::UnknownLambda) for a module not cached (never
    /// uploaded, or evicted since); [`CacheFull`](LambdaError::CacheFull) when a cached
    /// module alone exceeds the client's quota.
    pub(crate) fn handle_start(
        &mut self,
        tenant: Tenant,
        job: Waiting<Want>,
        now: Instant,
    ) -> Result<Option<(Go<usize>, usize)>, LambdaError> {
        match &job.want {
            // A cached upload needs no slot.
            Want::Load(hash) => {
                if let Some(held) = self.cache.hold(job.client, hash) {
                    return Ok(Some((Go::Held, held?)));
                }
            }
            Want::Module(hash) if !self.cache.contains(hash) => {
                return Err(LambdaError::UnknownLambda(hash.to_string()));
            }
            Want::Module(_) | Want::Native => {}
        }
        if self.line.is_empty() && self.fits(job.input) {
            return self.begin(job.client, &job.want, job.input).map(Some);
        }
        match self.line.park(tenant, job, now) {
            Ok(bumped) => {
                bumped.iter().for_each(|b| self.refuse(b));
                // A small job may fit where the first in line does not.
                self.serve();
                Ok(None)
            }
            Err(_) => Err(self.busy()),
        }
    }

    /// Answers a job that leaves the line without a slot: `Busy`.
    fn refuse(&mut self, job: &Waiting<Want>) {
        let load = matches!(job.want, Want::Load(_));
        self.answers.push((job.ticket, load, Err(self.busy())));
    }

    pub(crate) fn busy(&self) -> LambdaError {
        LambdaError::Busy {
            limit: self.max_jobs,
        }
    }

    /// A slot is free and `input` more bytes fit.
    fn fits(&self, input: usize) -> bool {
        self.running < self.max_jobs && self.room().fits(input)
    }

    /// What an input counts against `max_input_running`: nothing when small.
    fn counted(&self, input: usize) -> usize {
        if input <= self.small_input {
            0
        } else {
            input
        }
    }

    fn room(&self) -> Room {
        Room {
            held: self.input_running,
            most: self.max_input_running,
            small: self.small_input,
        }
    }

    /// Starts `want` on a free slot: takes the slot and the room for its input.
    fn begin(&mut self, client: ClientId, want: &Want, input: usize) -> Started {
        let go = match want {
            Want::Load(hash) => match self.cache.hold(client, hash) {
                Some(held) => return Ok((Go::Held, held?)),
                None => Go::Compile(input),
            },
            Want::Module(hash) => {
                let compiled = self
                    .cache
                    .get(client, hash)
                    .ok_or_else(|| LambdaError::UnknownLambda(hash.to_string()))?;
                Go::Run(compiled, input)
            }
            Want::Native => Go::Native(input),
        };
        self.running = self.running.saturating_add(1);
        self.input_running = self.input_running.saturating_add(self.counted(input));
        Ok((go, 0))
    }

    /// Grants slots to the jobs in line, in turn, while they fit.
    fn serve(&mut self) {
        loop {
            if self.running >= self.max_jobs {
                return;
            }
            let room = self.room();
            let Some(job) = self.line.next(|j| room.fits(j.input)) else {
                return;
            };
            let load = matches!(job.want, Want::Load(_));
            let started = self.begin(job.client, &job.want, job.input);
            self.answers.push((job.ticket, load, started));
        }
    }

    /// A job ended, with `input` bytes of input: its slot and room go to the next in
    /// line.
    pub(crate) fn handle_slot_freed(&mut self, input: usize) {
        self.running = self.running.saturating_sub(1);
        self.input_running = self.input_running.saturating_sub(self.counted(input));
        self.serve();
    }

    /// The jobs whose wait ended by `now` are refused `Busy`.
    pub(crate) fn handle_expiry(&mut self, now: Instant) {
        self.line.expire(now).iter().for_each(|j| self.refuse(j));
    }

    /// Answers to jobs that waited, since the last call.
    pub(crate) fn take_answers(&mut self) -> Vec<(u64, bool, Started)> {
        std::mem::take(&mut self.answers)
    }

    /// When the first wait in line ends.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.line.next_deadline()
    }

    /// Jobs waiting in line now.
    pub(crate) fn waiting(&self) -> usize {
        self.line.len()
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

    /// The client's connection closed: its holds end, and its jobs leave the line;
    /// returns how many modules left the cache.
    pub(crate) fn handle_release(&mut self, client: ClientId) -> usize {
        self.line.leave(client).iter().for_each(|j| self.refuse(j));
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
    /// How each job waiting in line is answered, by ticket.
    waiting: HashMap<u64, oneshot::Sender<Result<Go<JobSlot>, LambdaError>>>,
    next_ticket: u64,
    /// A wake-up for the line's first deadline is set.
    timer: bool,
}

impl std::fmt::Debug for LambdaOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LambdaOwner")
            .field("cached_modules", &self.budget.cached_modules())
            .field("running_jobs", &self.budget.running())
            .field("waiting_jobs", &self.budget.waiting())
            .finish()
    }
}

impl LambdaOwner {
    pub(crate) fn new(sandbox: Arc<Sandbox>, config: &LambdaConfig) -> LambdaOwner {
        LambdaOwner {
            budget: Budget::new(&sandbox, config),
            sandbox,
            waiting: HashMap::new(),
            next_ticket: 0,
            timer: false,
        }
    }

    /// The budget's answer made real: slots that give themselves back, evictions
    /// counted, uploads' outcomes in the metrics.
    fn finish(
        &self,
        load: bool,
        started: Started,
        ctx: &Context<Self>,
    ) -> Result<Go<JobSlot>, LambdaError> {
        if load {
            match &started {
                Ok((Go::Held, _)) => rdmactor::metrics::lambda_module_load("cached"),
                Err(_) => rdmactor::metrics::lambda_module_load("refused"),
                Ok(_) => {}
            }
        }
        let (go, evicted) = started?;
        self.evicted(evicted);
        let slot = |input| JobSlot {
            owner: ctx.address(),
            input,
        };
        Ok(match go {
            Go::Held => Go::Held,
            Go::Compile(input) => Go::Compile(slot(input)),
            Go::Run(compiled, input) => Go::Run(compiled, slot(input)),
            Go::Native(input) => Go::Native(slot(input)),
        })
    }

    /// Sends the answers of jobs that waited. One whose session is gone drops here,
    /// and its slot with it (given back).
    fn answer_waiting(&mut self, ctx: &mut Context<Self>) {
        for (ticket, load, started) in self.budget.take_answers() {
            let answer = self.finish(load, started, ctx);
            if let Some(tx) = self.waiting.remove(&ticket) {
                tracing::trace!(ticket, granted = answer.is_ok(), "waiting start answered");
                let _ = tx.send(answer);
            }
        }
        self.wake_at_next_deadline(ctx);
    }

    /// Refuses the jobs whose wait ended, when the first of them ends.
    fn wake_at_next_deadline(&mut self, ctx: &mut Context<Self>) {
        if self.timer {
            return;
        }
        let Some(deadline) = self.budget.next_deadline() else {
            return;
        };
        self.timer = true;
        ctx.run_later(
            deadline.saturating_duration_since(Instant::now()),
            |owner, ctx| {
                owner.timer = false;
                owner.budget.handle_expiry(Instant::now());
                owner.answer_waiting(ctx);
            },
        );
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
    /// Whose turn it takes in line.
    pub tenant: Tenant,
    pub want: Want,
    /// Bytes of input the job will hold.
    pub input: usize,
}

/// A module `client` uploaded, compiled (see [`Budget::handle_insert`]).
#[derive(Message)]
#[rtype(result = "Result<(), LambdaError>")]
pub(crate) struct Insert {
    pub client: ClientId,
    pub hash: ModuleHash,
    pub compiled: Compiled,
}

/// A job slot is free again, with the input bytes it counted (sent by [`JobSlot`]'s
/// drop).
#[derive(Message)]
#[rtype(result = "()")]
struct SlotFreed(usize);

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
    /// Jobs waiting in line for a slot.
    pub waiting_jobs: usize,
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
    /// An answer known at once is a plain reply: as a future it was a task that waited
    /// behind this actor's mailbox (3.8 s in a flood, issue 45's lambda round).
    type Result = Response<Result<Go<JobSlot>, LambdaError>>;

    fn handle(&mut self, msg: Start, ctx: &mut Context<Self>) -> Self::Result {
        let ticket = self.next_ticket;
        self.next_ticket = self.next_ticket.wrapping_add(1);
        let load = matches!(msg.want, Want::Load(_));
        tracing::trace!(client = msg.client.0, ticket, "start asked");
        let job = Waiting {
            ticket,
            client: msg.client,
            want: msg.want,
            input: msg.input,
        };
        let started = match self.budget.handle_start(msg.tenant, job, Instant::now()) {
            Ok(Some(go)) => Ok(go),
            Err(e) => Err(e),
            Ok(None) => {
                // In line: answered when its turn comes or its wait ends.
                let (tx, rx) = oneshot::channel();
                self.waiting.insert(ticket, tx);
                self.answer_waiting(ctx);
                let busy = self.budget.busy();
                return Response::fut(async move { rx.await.unwrap_or(Err(busy)) });
            }
        };
        Response::reply(self.finish(load, started, ctx))
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

    fn handle(&mut self, msg: SlotFreed, ctx: &mut Context<Self>) {
        self.budget.handle_slot_freed(msg.0);
        self.answer_waiting(ctx);
    }
}

impl Handler<ReleaseClient> for LambdaOwner {
    type Result = ();

    fn handle(&mut self, msg: ReleaseClient, ctx: &mut Context<Self>) {
        let evicted = self.budget.handle_release(msg.0);
        self.evicted(evicted);
        self.answer_waiting(ctx);
    }
}

impl Handler<Stats> for LambdaOwner {
    type Result = MessageResult<Stats>;

    fn handle(&mut self, _: Stats, _: &mut Context<Self>) -> Self::Result {
        MessageResult(LambdaStats {
            cached_modules: self.budget.cached_modules(),
            running_jobs: self.budget.running(),
            waiting_jobs: self.budget.waiting(),
        })
    }
}

impl Handler<Contains> for LambdaOwner {
    type Result = bool;

    fn handle(&mut self, msg: Contains, _: &mut Context<Self>) -> bool {
        self.budget.contains(&msg.0)
    }
}

/// One of the service's job slots and its job's input bytes, held by a job thread;
/// given back when dropped.
pub(crate) struct JobSlot {
    owner: Addr<LambdaOwner>,
    input: usize,
}

impl std::fmt::Debug for JobSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobSlot")
    }
}

impl Drop for JobSlot {
    fn drop(&mut self) {
        self.owner.do_send(SlotFreed(self.input));
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
    use std::net::IpAddr;
    use std::time::Duration;

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

    fn config(max_jobs: usize) -> LambdaConfig {
        LambdaConfig {
            max_jobs,
            max_input_running: 32 << 20,
            max_waiting_jobs: 8,
            job_wait: Duration::from_secs(2),
            ..LambdaConfig::default()
        }
    }

    fn host(n: u8) -> Tenant {
        Tenant::Address(IpAddr::from([10, 0, 0, n]))
    }

    /// `client` (on host `client`) asks for `want` with `input` bytes, as ticket `ticket`.
    fn start(
        b: &mut Budget,
        client: u64,
        want: Want,
        input: usize,
        ticket: u64,
    ) -> Result<Option<(Go<usize>, usize)>, LambdaError> {
        let job = Waiting {
            ticket,
            client: ClientId(client),
            want,
            input,
        };
        b.handle_start(host(client as u8), job, Instant::now())
    }

    #[test]
    fn uploads_are_held_per_client_and_released_with_it() {
        let sandbox = Sandbox::with_config(SandboxConfig {
            max_modules_per_client: 1,
            ..SandboxConfig::default()
        });
        let mut b = Budget::new(&sandbox, &config(2));
        let (a, c) = (ClientId(1), ClientId(2));
        let (h1, m1) = sandbox.compile(&module(1)).unwrap();
        // A miss: compile on a job slot, then insert.
        assert!(matches!(
            start(&mut b, 1, Want::Load(h1), 0, 0),
            Ok(Some((Go::Compile(0), 0)))
        ));
        b.handle_slot_freed(0);
        assert_eq!(b.handle_insert(a, h1, m1).unwrap(), 0);
        // A hit for another client: held at once, no slot.
        assert!(matches!(
            start(&mut b, 2, Want::Load(h1), 0, 1),
            Ok(Some((Go::Held, 0)))
        ));
        assert_eq!((b.held_by(a), b.held_by(c), b.running()), (1, 1, 0));
        // Past its quota, a client lets go of its own oldest only.
        let (h2, m2) = sandbox.compile(&module(2)).unwrap();
        assert_eq!(b.handle_insert(c, h2, m2).unwrap(), 0, "h1 stays for a");
        assert!(b.contains(&h1) && b.contains(&h2));
        assert_eq!(b.handle_release(a), 1, "h1 had no other holder");
        assert!(!b.contains(&h1));
        assert!(matches!(
            start(&mut b, 1, Want::Module(h1), 0, 2),
            Err(LambdaError::UnknownLambda(_))
        ));
        assert_eq!(b.handle_release(c), 1);
        assert_eq!(b.cached_modules(), 0);
    }

    #[test]
    fn full_slots_make_jobs_wait_and_a_freed_slot_goes_to_the_next_tenant() {
        let sandbox = Sandbox::new();
        let mut b = Budget::new(&sandbox, &config(2));
        let (h, m) = sandbox.compile(&module(3)).unwrap();
        b.handle_insert(ClientId(1), h, m).unwrap();
        assert!(matches!(
            start(&mut b, 1, Want::Module(h), 10, 0),
            Ok(Some((Go::Run(_, 10), 0)))
        ));
        assert!(matches!(
            start(&mut b, 1, Want::Native, 20, 1),
            Ok(Some((Go::Native(20), 0)))
        ));
        // Both slots taken: host 1 queues two more, then host 2 one.
        assert!(matches!(start(&mut b, 1, Want::Native, 1, 2), Ok(None)));
        assert!(matches!(start(&mut b, 1, Want::Native, 1, 3), Ok(None)));
        assert!(matches!(start(&mut b, 2, Want::Native, 1, 4), Ok(None)));
        // A cached upload needs no slot, even now.
        assert!(matches!(
            start(&mut b, 1, Want::Load(h), 0, 5),
            Ok(Some((Go::Held, 0)))
        ));
        assert!(b.take_answers().is_empty());
        assert_eq!(b.waiting(), 3);
        // Each freed slot goes to the next tenant in turn: host 1, then host 2.
        b.handle_slot_freed(10);
        b.handle_slot_freed(20);
        let answered: Vec<u64> = b.take_answers().iter().map(|a| a.0).collect();
        assert_eq!(answered, [2, 4]);
        assert_eq!((b.running(), b.waiting()), (2, 1));
        // The last one's wait ends: refused Busy.
        b.handle_expiry(Instant::now() + Duration::from_secs(3));
        let [(3, false, Err(LambdaError::Busy { limit: 2 }))] = b.take_answers()[..] else {
            panic!("ticket 3 refused busy");
        };
        assert_eq!(b.waiting(), 0);
    }

    #[test]
    fn input_bytes_running_are_bounded_and_a_small_input_passes_a_large_one() {
        let sandbox = Sandbox::new();
        let mut b = Budget::new(&sandbox, &config(8));
        // 32 MiB of room: two 16 MiB inputs fill it, a third waits.
        assert!(matches!(
            start(&mut b, 1, Want::Native, 16 << 20, 0),
            Ok(Some(_))
        ));
        assert!(matches!(
            start(&mut b, 1, Want::Native, 16 << 20, 1),
            Ok(Some(_))
        ));
        assert!(matches!(
            start(&mut b, 1, Want::Native, 16 << 20, 2),
            Ok(None)
        ));
        // Another host's 4 KiB needs only a slot: it passes the large one at once.
        assert!(matches!(start(&mut b, 2, Want::Native, 4096, 3), Ok(None)));
        let answered: Vec<u64> = b.take_answers().iter().map(|a| a.0).collect();
        assert_eq!(answered, [3]);
        // A 16 MiB job ends: the waiting one fits (the small one counts no room).
        b.handle_slot_freed(16 << 20);
        let answered: Vec<u64> = b.take_answers().iter().map(|a| a.0).collect();
        assert_eq!(answered, [2]);
        assert_eq!((b.running(), b.waiting()), (3, 0));
        // With every slot taken, a small input waits like any other.
        for t in 4..9 {
            assert!(matches!(start(&mut b, 2, Want::Native, 1, t), Ok(Some(_))));
        }
        assert!(matches!(start(&mut b, 2, Want::Native, 1, 9), Ok(None)));
    }

    #[test]
    fn a_closed_connection_leaves_the_line() {
        let sandbox = Sandbox::new();
        let mut b = Budget::new(&sandbox, &config(1));
        assert!(matches!(start(&mut b, 1, Want::Native, 1, 0), Ok(Some(_))));
        assert!(matches!(start(&mut b, 2, Want::Native, 1, 1), Ok(None)));
        assert_eq!(b.handle_release(ClientId(2)), 0);
        assert_eq!(b.take_answers().len(), 1, "refused: nobody will read it");
        b.handle_slot_freed(1);
        assert!(b.take_answers().is_empty());
        assert_eq!((b.running(), b.waiting()), (0, 0));
    }

    #[actix::test]
    async fn slots_and_holds_come_back_when_their_handles_drop() {
        let sandbox = Arc::new(Sandbox::new());
        let owner = LambdaOwner::new(
            sandbox.clone(),
            &LambdaConfig {
                job_wait: Duration::from_millis(50),
                ..config(1)
            },
        )
        .start();
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
                tenant: host(1),
                want,
                input: 1,
            })
        };
        let Go::Run(_, slot) = start(Want::Module(h)).await.unwrap().unwrap() else {
            panic!("a cached module runs");
        };
        // The one slot is taken: this one waits its 50 ms, then is refused.
        assert!(matches!(
            start(Want::Native).await.unwrap(),
            Err(LambdaError::Busy { limit: 1 })
        ));
        // One that waits gets the slot when it is given back.
        let waiting = start(Want::Native);
        let freed = async {
            actix::clock::sleep(Duration::from_millis(10)).await;
            drop(slot);
        };
        let (got, ()) = tokio::join!(waiting, freed);
        let Ok(Go::Native(slot)) = got.unwrap() else {
            panic!("the freed slot");
        };
        drop(slot);
        assert!(matches!(
            start(Want::Native).await.unwrap(),
            Ok(Go::Native(_))
        ));
        let stats = owner.send(Stats).await.unwrap();
        assert_eq!((stats.running_jobs, stats.waiting_jobs), (0, 0));
        drop(client);
        assert!(!owner.send(Contains(h)).await.unwrap());
    }
}
