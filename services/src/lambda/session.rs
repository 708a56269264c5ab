//! The session: one connection's driver of the job state machine ([`Invocations`], in a
//! [`MachineSession`](rdmactor::runtime::MachineSession)). It feeds the machine with
//! requests, completions and finished jobs, and carries out its actions (READ, run off
//! the actor, WRITE, reply).

use std::sync::{mpsc, Arc};

use actix::{Addr, Recipient};
use rdmactor::runtime::{
    AskError, Asked, Blocking, BlockingError, BufId, ChunkRoom, CloseReason, Driver, Flow, Held,
    Incoming, MachineCx, Op, ServiceChunks, SessionCx, SessionError, SessionWaker, StateMachine,
};
use rdmactor::transport::Transport;
use rdmactor::verbs::Access;

use super::job::{Outcome, Work};
use super::line::Tenant;
use super::native::NativeLambdas;
use super::owner::{ClientHold, Go, Insert, JobSlot, LambdaOwner, Start, Want};
use super::sandbox::{Compiled, LambdaError, ModuleHash, Sandbox};
use super::wire::LambdaRequest;

mod reads;
use reads::{HeldRead, ReadRoom, READ_ROOM};

/// What a posted READ or WRITE was for.
pub(super) enum PendingOp {
    Read {
        job: usize,
        buf: BufId,
        offset: usize,
        len: usize,
        /// Its place among the service's READs in flight, given back on completion
        /// (none for a small READ).
        _room: Option<ChunkRoom>,
    },
    Write {
        job: usize,
        buf: BufId,
    },
}

/// The job machine as this session drives it: a granted start holds a job slot, and
/// counted bytes a [`Held`] of the server's heap budget.
pub(super) type Invocations = super::job::Invocations<Go<JobSlot>, Held>;
type Action = super::job::Action<Go<JobSlot>>;

impl StateMachine for Invocations {
    type Output = Action;
    fn poll_output(&mut self) -> Option<Action> {
        self.poll_action()
    }
}

pub(super) struct LambdaSession {
    /// Compiles uploads and runs modules, on job threads.
    sandbox: Arc<Sandbox>,
    natives: Arc<NativeLambdas>,
    /// This connection's id in the service's module cache; its holds end when the
    /// session goes.
    client: ClientHold,
    /// The service's owner of the module cache and the job slots.
    start: Recipient<Start>,
    /// Whose turn this connection's jobs take in the service's line.
    tenant: Tenant,
    insert: Recipient<Insert>,
    /// Requests to the owner whose answers are on their way.
    asks: Vec<Ask>,
    /// Uploads being hashed on the runtime's blocking pool, by job.
    hashing: Vec<(usize, Hashing)>,
    /// The service's job slots, for the refusal when no thread can start.
    max_jobs: usize,
    done_tx: mpsc::Sender<(usize, Finished)>,
    done_rx: mpsc::Receiver<(usize, Finished)>,
    /// This connection's place in the service's bound on input READs in flight, and
    /// the READ that found no room (the machine is paused behind it until a grant).
    reads: ReadRoom,
}

/// A request to the service's owner, and what the session goes on with once answered.
enum Ask {
    /// May this upload be compiled (or is it cached)?
    Load {
        job: usize,
        module: Vec<u8>,
        /// The hash of the module, computed off the poller thread.
        hash: ModuleHash,
        answer: Asked<Result<Go<JobSlot>, LambdaError>>,
    },
    /// A job slot (and the module) for this invocation: the machine gets the answer.
    Start {
        job: usize,
        answer: Asked<Result<Go<JobSlot>, LambdaError>>,
    },
    /// Cache the module this job compiled.
    Insert {
        job: usize,
        hash: ModuleHash,
        answer: Asked<Result<(), LambdaError>>,
    },
}

/// An upload's module being hashed; its hash and the module once done.
type Hashing = Blocking<(ModuleHash, Vec<u8>)>;

/// What a job thread hands back.
enum Finished {
    /// An invocation ran (or an upload was refused before compiling).
    Outcome(Outcome),
    /// An upload compiled: the owner caches it next.
    Compiled(Result<(ModuleHash, Compiled), LambdaError>),
}

/// The outcome of `work` that could not start.
fn refused(work: &Work, e: LambdaError) -> Outcome {
    match work {
        Work::Load(_) => Outcome::Loaded(Err(e)),
        _ => Outcome::Ran(Err(e)),
    }
}

fn owner_gone(e: AskError) -> SessionError {
    SessionError::new(format!("lambda: the service's owner did not answer: {e}"))
}

impl LambdaSession {
    pub(super) fn new(
        sandbox: Arc<Sandbox>,
        natives: Arc<NativeLambdas>,
        client: ClientHold,
        tenant: Tenant,
        owner: Addr<LambdaOwner>,
        max_jobs: usize,
        reads: Arc<ServiceChunks>,
    ) -> Self {
        let (done_tx, done_rx) = mpsc::channel();
        LambdaSession {
            sandbox,
            natives,
            client,
            start: owner.clone().recipient(),
            tenant,
            insert: owner.recipient(),
            asks: Vec::new(),
            hashing: Vec::new(),
            max_jobs,
            done_tx,
            done_rx,
            reads: ReadRoom::new(reads),
        }
    }

    /// A local buffer of `len` bytes for a READ target or WRITE source: from the pool
    /// when it has a class that large, registered for this job otherwise.
    fn buffer<T: Transport>(cx: &mut SessionCx<'_, T>, len: usize) -> Result<BufId, SessionError> {
        cx.alloc(len)
            .or_else(|_| cx.register(len, Access::LOCAL_WRITE))
    }

    /// Posts `read` if the service has room for one more READ in flight (see
    /// [`ReadRoom::admit`]); else returns `Flow::Pause` until room is granted.
    fn post_read<T: Transport>(
        &mut self,
        cx: &mut MachineCx<'_, '_, Self, T>,
        read: HeldRead,
    ) -> Result<Flow, SessionError> {
        let job = read.job;
        let Some((read, room)) = self.reads.admit(|| cx.conn.waker(), read) else {
            tracing::trace!(client = self.client.id.0, job, "READ waits for room");
            return Ok(Flow::Pause);
        };
        let HeldRead {
            offset, src, len, ..
        } = read;
        // At the pool's cap this one request fails, not the connection.
        let buf = match Self::buffer(cx.conn, len) {
            Ok(buf) => buf,
            Err(e) => {
                tracing::warn!(error = %e, len, "no buffer for a lambda's input chunk");
                cx.machine.input_refused(job, &e.to_string());
                return Ok(Flow::Continue);
            }
        };
        let op = Op::Read {
            buf,
            range: 0..len,
            src,
        };
        let pending = PendingOp::Read {
            job,
            buf,
            offset,
            len,
            _room: room,
        };
        cx.post(op, pending)?;
        tracing::trace!(client = self.client.id.0, job, offset, len, "READ posted");
        Ok(Flow::Continue)
    }

    /// Feeds the machine the jobs that finished and the owner's answers that came, at
    /// every callback (not only at their wake-ups), so that the next request sees them.
    fn collect<T: Transport>(
        &mut self,
        cx: &mut MachineCx<'_, '_, Self, T>,
    ) -> Result<(), SessionError> {
        while let Ok((job, finished)) = self.done_rx.try_recv() {
            tracing::trace!(client = self.client.id.0, job, "job thread finished");
            match finished {
                Finished::Outcome(outcome) => cx.machine.handle_outcome(job, outcome),
                Finished::Compiled(Ok((hash, compiled))) => {
                    let insert = Insert {
                        client: self.client.id,
                        hash,
                        compiled,
                    };
                    let answer = cx.conn.ask(job as u64, &self.insert, insert);
                    self.asks.push(Ask::Insert { job, hash, answer });
                }
                Finished::Compiled(Err(e)) => {
                    rdmactor::metrics::lambda_module_load("refused");
                    cx.machine.handle_outcome(job, Outcome::Loaded(Err(e)));
                }
            }
        }
        for (job, hashing) in std::mem::take(&mut self.hashing) {
            match hashing.try_take() {
                None => self.hashing.push((job, hashing)),
                Some(Ok((hash, module))) => {
                    let start = Start {
                        client: self.client.id,
                        tenant: self.tenant.clone(),
                        want: Want::Load(hash),
                        input: 0,
                    };
                    let answer = cx.conn.ask(job as u64, &self.start, start);
                    self.asks.push(Ask::Load {
                        job,
                        module,
                        hash,
                        answer,
                    });
                }
                // The connection has as many blocking closures started as it may: this
                // upload is refused, the connection goes on.
                Some(Err(e @ BlockingError::Busy { .. })) => {
                    cx.machine
                        .handle_busy(job, &format!("no room to hash the module: {e}"));
                }
                Some(Err(e)) => {
                    let e = LambdaError::Trap(format!("hashing the module: {e}"));
                    cx.machine.handle_outcome(job, Outcome::Loaded(Err(e)));
                }
            }
        }
        for ask in std::mem::take(&mut self.asks) {
            match ask {
                Ask::Load {
                    job,
                    module,
                    hash,
                    answer,
                } => match answer.try_take() {
                    None => self.asks.push(Ask::Load {
                        job,
                        module,
                        hash,
                        answer,
                    }),
                    Some(answer) => match answer.map_err(owner_gone)? {
                        Err(e) => cx.machine.handle_outcome(job, Outcome::Loaded(Err(e))),
                        Ok(go) => self.go(cx, job, Work::Load(module), Vec::new(), Some(hash), go),
                    },
                },
                Ask::Start { job, answer } => match answer.try_take() {
                    None => self.asks.push(Ask::Start { job, answer }),
                    Some(answer) => {
                        let answer = answer.map_err(owner_gone)?;
                        tracing::trace!(
                            client = self.client.id.0,
                            job,
                            granted = answer.is_ok(),
                            "start answered"
                        );
                        cx.machine.handle_started(job, answer);
                    }
                },
                Ask::Insert { job, hash, answer } => match answer.try_take() {
                    None => self.asks.push(Ask::Insert { job, hash, answer }),
                    Some(answer) => {
                        let loaded = answer.map_err(owner_gone)?.map(|()| hash);
                        cx.machine.handle_outcome(job, Outcome::Loaded(loaded));
                    }
                },
            }
        }
        Ok(())
    }

    /// Asks the owner for an invocation's job slot (and its module, and room for its
    /// `input` bytes); the machine gets the answer, which may wait for this tenant's
    /// turn. One request per job, never per chunk, and before anything is allocated for
    /// the job's input.
    fn ask_start<T: Transport>(
        &mut self,
        cx: &mut SessionCx<'_, T>,
        job: usize,
        work: &Work,
        input: usize,
    ) {
        let want = match work {
            Work::Module(hash, _) => Want::Module(*hash),
            Work::Native(_) => Want::Native,
            // Not reached: uploads are `Action::Load`.
            Work::Load(module) => Want::Load(ModuleHash::of(module)),
        };
        tracing::trace!(
            client = self.client.id.0,
            job,
            len = input,
            "asking for a job slot"
        );
        let start = Start {
            client: self.client.id,
            tenant: self.tenant.clone(),
            want,
            input,
        };
        let answer = cx.ask(job as u64, &self.start, start);
        self.asks.push(Ask::Start { job, answer });
    }

    /// Runs `work` on a thread of its own and hands its result to this session (through
    /// `done_tx`, then a wake-up); false if no thread could be started.
    fn spawn_job(
        &self,
        job: usize,
        work: Box<dyn FnOnce() -> Finished + Send>,
        waker: SessionWaker,
    ) -> bool {
        tracing::trace!(client = self.client.id.0, job, "job thread starting");
        let done = self.done_tx.clone();
        let client = self.client.id.0;
        let spawned = std::thread::Builder::new()
            .name("lambda-job".into())
            .spawn(move || {
                let finished = work();
                tracing::trace!(client, job, "job thread done, waking its session");
                // The session may be gone (connection closed): nobody to tell.
                if done.send((job, finished)).is_ok() {
                    waker.wake(job as u64);
                }
            });
        if let Err(e) = &spawned {
            tracing::debug!(job, error = %e, "cannot start a lambda job thread");
        }
        spawned.is_ok()
    }

    /// Carries out the owner's answer to a job's start.
    fn go<T: Transport>(
        &mut self,
        cx: &mut MachineCx<'_, '_, Self, T>,
        job: usize,
        work: Work,
        input: Vec<u8>,
        hash: Option<ModuleHash>,
        go: Go<JobSlot>,
    ) {
        let sandbox = self.sandbox.clone();
        let natives = self.natives.clone();
        let busy = refused(
            &work,
            LambdaError::Busy {
                limit: self.max_jobs,
            },
        );
        let run: Box<dyn FnOnce() -> Finished + Send> = match (go, work) {
            (Go::Held, Work::Load(module)) => {
                let hash = hash.unwrap_or_else(|| ModuleHash::of(&module));
                return cx.machine.handle_outcome(job, Outcome::Loaded(Ok(hash)));
            }
            (Go::Compile(slot), Work::Load(module)) => Box::new(move || {
                let compiled = sandbox.compile(&module);
                drop(slot);
                Finished::Compiled(compiled)
            }),
            (Go::Run(compiled, slot), Work::Module(_, limits)) => Box::new(move || {
                let ran = sandbox.run_compiled(&compiled, &input, &limits, &mut Default::default());
                drop(slot);
                Finished::Outcome(Outcome::Ran(counted("module", ran)))
            }),
            (Go::Native(slot), Work::Native(name)) => Box::new(move || {
                let ran = natives.run(&name, &input);
                drop(slot);
                Finished::Outcome(Outcome::Ran(counted("native", ran)))
            }),
            (_, work) => {
                // The owner answers what was asked; anything else is a bug here.
                let e = LambdaError::Trap("the service answered another request".into());
                return cx.machine.handle_outcome(job, refused(&work, e));
            }
        };
        if !self.spawn_job(job, run, cx.conn.waker()) {
            // The closure (and its slot) dropped with the error.
            cx.machine.handle_outcome(job, busy);
        }
    }
}

impl<T: Transport> Driver<T> for LambdaSession {
    type Machine = Invocations;
    type Posted = PendingOp;

    fn on_message(
        &mut self,
        cx: &mut MachineCx<'_, '_, Self, T>,
        msg: Incoming,
    ) -> Result<(), SessionError> {
        let req: LambdaRequest = postcard::from_bytes(&msg.data)
            .map_err(|e| SessionError::new(format!("malformed lambda request: {e}")))?;
        if msg.tag == 0 {
            return Err(SessionError::new("lambda requests need a reply tag"));
        }
        cx.machine.handle_request(msg.tag, req);
        self.collect(cx)
    }

    /// A job thread finished (the token is its job; `collect` takes every finished one),
    /// or the held READ was granted room.
    fn on_wake(
        &mut self,
        cx: &mut MachineCx<'_, '_, Self, T>,
        token: u64,
    ) -> Result<(), SessionError> {
        if token == READ_ROOM {
            if let Some(read) = self.reads.granted() {
                if self.post_read(cx, read)? == Flow::Continue {
                    cx.resume();
                }
            }
        }
        self.collect(cx)
    }

    fn on_close(&mut self, _machine: Invocations, _reason: &CloseReason) {
        self.reads.leave();
    }

    fn on_op(
        &mut self,
        cx: &mut MachineCx<'_, '_, Self, T>,
        pending: PendingOp,
        result: rdmactor::verbs::Result<()>,
    ) -> Result<(), SessionError> {
        let (job, buf, what) = match pending {
            PendingOp::Read { job, buf, .. } => (job, buf, "reading the input"),
            PendingOp::Write { job, buf } => (job, buf, "writing the output"),
        };
        if let Err(e) = result {
            cx.conn.free(buf);
            // The QP is in error; the connection closes after this call.
            return Err(SessionError::new(format!("{what} of job {job}: {e}")));
        }
        match pending {
            PendingOp::Read { offset, len, .. } => {
                tracing::trace!(client = self.client.id.0, job, offset, len, "READ done");
                let machine = &mut *cx.machine;
                cx.conn.read_with(buf, 0..len, |bytes| {
                    machine.handle_input(job, offset, bytes)
                })?;
            }
            PendingOp::Write { .. } => cx.machine.handle_written(job),
        }
        cx.conn.free(buf);
        self.collect(cx)
    }

    fn carry(
        &mut self,
        cx: &mut MachineCx<'_, '_, Self, T>,
        action: Action,
    ) -> Result<Flow, SessionError> {
        match action {
            Action::Reply { tag, response } => {
                let bytes = postcard::to_allocvec(&response)
                    .map_err(|e| SessionError::new(e.to_string()))?;
                cx.conn.send(tag, bytes)?;
            }
            Action::ReadInput {
                job,
                offset,
                src,
                len,
            } => {
                let read = HeldRead {
                    job,
                    offset,
                    src,
                    len,
                };
                return self.post_read(cx, read);
            }
            Action::WriteOutput { job, dst, data } => {
                tracing::trace!(
                    client = self.client.id.0,
                    job,
                    len = data.len(),
                    "output WRITE"
                );
                // At the pool's cap this one request fails, not the connection.
                let buf = match Self::buffer(cx.conn, data.len()) {
                    Ok(buf) => buf,
                    Err(e) => {
                        tracing::warn!(error = %e, len = data.len(), "no buffer for a lambda's output");
                        cx.machine.output_refused(job, &e.to_string());
                        return Ok(Flow::Continue);
                    }
                };
                cx.conn.copy_in(buf, 0, &data)?;
                let write = Op::Write {
                    buf,
                    range: 0..data.len(),
                    dst,
                    imm: None,
                };
                cx.post(write, PendingOp::Write { job, buf })?;
            }
            Action::Start { job, work, len } => self.ask_start(cx.conn, job, &work, len),
            Action::Hold { job, len } => {
                // At once, never waiting: the job holds one of the service's slots.
                let held = cx.conn.heap_budget().try_hold(len);
                if let Err(e) = &held {
                    tracing::debug!(error = %e, len, "no heap budget for a lambda job");
                }
                cx.machine.handle_held(job, held);
            }
            Action::Load { job, module } => {
                // A module is as large as the service allows (MiBs): hashed on the
                // runtime's blocking pool, not on the poller thread that serves every
                // connection on it; the owner is asked once the hash is in.
                let hashing = cx
                    .conn
                    .spawn_blocking(job as u64, move || (ModuleHash::of(&module), module));
                self.hashing.push((job, hashing));
            }
            Action::Run {
                job,
                work,
                input,
                slot,
            } => self.go(cx, job, work, input, None, slot),
        }
        Ok(Flow::Continue)
    }
}

/// Counts a finished invocation in `rdmactor_lambda_runs_total`, by kind and outcome.
fn counted(
    kind: &'static str,
    result: Result<Vec<u8>, LambdaError>,
) -> Result<Vec<u8>, LambdaError> {
    let outcome = match &result {
        Ok(_) => "ok",
        Err(LambdaError::Trap(_)) => "trap",
        Err(LambdaError::OutOfFuel { .. }) => "out_of_fuel",
        Err(LambdaError::Timeout { .. }) => "timeout",
        Err(LambdaError::MemoryLimit { .. }) => "memory_limit",
        Err(_) => "error",
    };
    rdmactor::metrics::lambda_run(kind, outcome);
    result
}
