//! The `lambda` service: wire messages, the per-connection protocol core, the session
//! that drives it, and the client helpers. See [`LambdaService`].

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use rdmactor::runtime::{
    BufId, ClientConnection, Message, Op, OpId, PeerInfo, RequestError, Service, Session,
    SessionCx, SessionError, SessionWaker,
};
use rdmactor::verbs::{Access, RemoteRegion};
use serde::{Deserialize, Serialize};
use slab::Slab;

use super::native::NativeLambdas;
use super::sandbox::{LambdaError, Limits, ModuleHash, Sandbox};

// ---------------------------------------------------------------------------------------
// Wire
// ---------------------------------------------------------------------------------------

/// Which lambda an invocation runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LambdaRef {
    /// A module uploaded before (on any connection).
    Module(ModuleHash),
    /// A native lambda the application registered under this name.
    Native(String),
}

/// [`Limits`] on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireLimits {
    /// [`Limits::fuel`].
    pub fuel: u64,
    /// [`Limits::max_memory_bytes`].
    pub max_memory_bytes: u64,
    /// [`Limits::wall_clock`], in milliseconds.
    pub wall_clock_ms: u64,
    /// [`Limits::max_output`].
    pub max_output: u64,
}

impl From<Limits> for WireLimits {
    fn from(l: Limits) -> Self {
        WireLimits {
            fuel: l.fuel,
            max_memory_bytes: l.max_memory_bytes as u64,
            wall_clock_ms: u64::try_from(l.wall_clock.as_millis()).unwrap_or(u64::MAX),
            max_output: l.max_output as u64,
        }
    }
}

impl From<WireLimits> for Limits {
    fn from(w: WireLimits) -> Self {
        Limits {
            fuel: w.fuel,
            max_memory_bytes: usize::try_from(w.max_memory_bytes).unwrap_or(usize::MAX),
            wall_clock: Duration::from_millis(w.wall_clock_ms),
            max_output: usize::try_from(w.max_output).unwrap_or(usize::MAX),
        }
    }
}

/// A client's message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LambdaRequest {
    /// Validate, compile and cache a WebAssembly module: [`LambdaResponse::Loaded`].
    Upload {
        /// The module's bytes (binary format).
        module: Vec<u8>,
    },
    /// Run a lambda on `input[..input_len]` and write its output to the start of
    /// `output`: [`LambdaResponse::Done`].
    Invoke {
        /// What to run.
        lambda: LambdaRef,
        /// The client's input region (REMOTE_READ).
        input: RemoteRegion,
        /// Input bytes, from the start of `input`.
        input_len: u64,
        /// The client's output region (REMOTE_WRITE); its length caps the output.
        output: RemoteRegion,
        /// Limits wished for (module lambdas); the server caps each field, and uses its
        /// own cap for `None`.
        limits: Option<WireLimits>,
    },
}

/// The server's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LambdaResponse {
    /// The module is loaded under this hash.
    Loaded {
        /// Its name for [`LambdaRef::Module`].
        hash: ModuleHash,
    },
    /// The lambda ran; its `len` output bytes are at the start of the output region.
    Done {
        /// Output bytes written.
        len: u64,
    },
    /// Nothing ran to completion.
    Failed(Failure),
}

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct Failure {
    /// What kind of failure.
    pub kind: FailureKind,
    /// What the server said.
    pub message: String,
}

/// The kinds of [`Failure`]: one per [`LambdaError`] variant, then the service's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
#[allow(missing_docs)]
pub enum FailureKind {
    InvalidModule,
    ModuleTooLarge,
    ImportsNotAllowed,
    MissingExport,
    CacheFull,
    UnknownLambda,
    Busy,
    InputTooLarge,
    Trap,
    OutOfFuel,
    MemoryLimit,
    Timeout,
    BadResult,
    OutputTooLarge,
    GuestError,
    NativeError,
    /// The request does not make sense (e.g. `input_len` beyond the input region).
    BadRequest,
}

impl From<&LambdaError> for FailureKind {
    fn from(e: &LambdaError) -> Self {
        match e {
            LambdaError::InvalidModule(_) => FailureKind::InvalidModule,
            LambdaError::ModuleTooLarge { .. } => FailureKind::ModuleTooLarge,
            LambdaError::ImportsNotAllowed(_) => FailureKind::ImportsNotAllowed,
            LambdaError::MissingExport(_) => FailureKind::MissingExport,
            LambdaError::CacheFull { .. } => FailureKind::CacheFull,
            LambdaError::UnknownLambda(_) => FailureKind::UnknownLambda,
            LambdaError::Busy { .. } => FailureKind::Busy,
            LambdaError::InputTooLarge { .. } => FailureKind::InputTooLarge,
            LambdaError::Trap(_) => FailureKind::Trap,
            LambdaError::OutOfFuel { .. } => FailureKind::OutOfFuel,
            LambdaError::MemoryLimit { .. } => FailureKind::MemoryLimit,
            LambdaError::Timeout { .. } => FailureKind::Timeout,
            LambdaError::BadResult(_) => FailureKind::BadResult,
            LambdaError::OutputTooLarge { .. } => FailureKind::OutputTooLarge,
            LambdaError::GuestError(_) => FailureKind::GuestError,
            LambdaError::NativeError(_) => FailureKind::NativeError,
        }
    }
}

impl From<&LambdaError> for Failure {
    fn from(e: &LambdaError) -> Self {
        Failure {
            kind: e.into(),
            message: e.to_string(),
        }
    }
}

impl Failure {
    fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Failure {
            kind,
            message: message.into(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Protocol core (no I/O)
// ---------------------------------------------------------------------------------------

/// The service's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LambdaConfig {
    /// Caps every invocation's limits, field by field (and is used when the client asks
    /// for none).
    pub cap: Limits,
    /// Largest input an invocation may name, in bytes.
    pub max_input: usize,
    /// Jobs (uploads and invocations) one connection may have under way.
    pub max_jobs_per_connection: usize,
    /// Job threads the whole service may run at once (native lambdas have no other
    /// bound; modules are also bounded by the sandbox's `max_workers`).
    pub max_jobs: usize,
    /// The least wall clock an invocation gets, whatever the client asks for (at most
    /// `cap.wall_clock`). Without a floor, `wall_clock_ms = 0` made every invocation a
    /// free instant timeout: the client's job slot came back at once while work was
    /// still being set up and torn down, so one client could keep the workers busy.
    pub min_wall_clock: Duration,
}

impl Default for LambdaConfig {
    /// [`Limits::default`] as the cap, 16 MiB inputs, 4 jobs per connection, 64 in all,
    /// at least 10 ms of wall clock per invocation.
    fn default() -> Self {
        LambdaConfig {
            cap: Limits::default(),
            max_input: 16 << 20,
            max_jobs_per_connection: 4,
            max_jobs: 64,
            min_wall_clock: Duration::from_millis(10),
        }
    }
}

/// What a job computes off the actor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Work {
    Load(Vec<u8>),
    Module(ModuleHash, Limits),
    Native(String),
}

/// A job's outcome, from its thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Loaded(Result<ModuleHash, LambdaError>),
    Ran(Result<Vec<u8>, LambdaError>),
}

/// What the driver does next, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Answer request `tag`.
    Reply { tag: u32, response: LambdaResponse },
    /// RDMA READ `len` bytes of `src`, then `handle_input`.
    ReadInput {
        job: usize,
        src: RemoteRegion,
        len: usize,
    },
    /// Compute off the actor, then `handle_outcome`.
    Run {
        job: usize,
        work: Work,
        input: Vec<u8>,
    },
    /// RDMA WRITE `data` to `dst`, then `handle_written`.
    WriteOutput {
        job: usize,
        dst: RemoteRegion,
        data: Vec<u8>,
    },
}

#[derive(Debug)]
enum Stage {
    Loading,
    Reading { work: Work, output: RemoteRegion },
    Running { output: RemoteRegion },
    Writing { len: u64 },
}

#[derive(Debug)]
struct Job {
    tag: u32,
    stage: Stage,
}

/// One connection's requests, from arrival to answer, with no I/O: the session feeds it
/// (`handle_*`) and carries out its [`Action`]s (`poll_action`, in order).
#[derive(Debug)]
pub(crate) struct Invocations {
    config: LambdaConfig,
    jobs: Slab<Job>,
    actions: VecDeque<Action>,
}

impl Invocations {
    pub fn new(config: LambdaConfig) -> Self {
        Invocations {
            config,
            jobs: Slab::new(),
            actions: VecDeque::new(),
        }
    }

    /// Jobs under way.
    #[cfg(test)]
    pub fn jobs(&self) -> usize {
        self.jobs.len()
    }

    fn fail(&mut self, tag: u32, failure: Failure) {
        self.actions.push_back(Action::Reply {
            tag,
            response: LambdaResponse::Failed(failure),
        });
    }

    /// A request arrived with `tag`.
    pub fn handle_request(&mut self, tag: u32, req: LambdaRequest) {
        if self.jobs.len() >= self.config.max_jobs_per_connection {
            let limit = self.config.max_jobs_per_connection;
            return self.fail(
                tag,
                Failure::new(
                    FailureKind::Busy,
                    format!("{limit} jobs under way on this connection"),
                ),
            );
        }
        match req {
            LambdaRequest::Upload { module } => {
                let job = self.jobs.insert(Job {
                    tag,
                    stage: Stage::Loading,
                });
                self.actions.push_back(Action::Run {
                    job,
                    work: Work::Load(module),
                    input: Vec::new(),
                });
            }
            LambdaRequest::Invoke {
                lambda,
                input,
                input_len,
                output,
                limits,
            } => {
                let src = match input.slice(0, input_len) {
                    Ok(src) => src,
                    Err(e) => {
                        return self.fail(tag, Failure::new(FailureKind::BadRequest, e.to_string()))
                    }
                };
                let len = input_len as usize;
                if len > self.config.max_input {
                    return self.fail(
                        tag,
                        Failure::new(
                            FailureKind::InputTooLarge,
                            format!(
                                "input of {len} bytes; the server accepts {}",
                                self.config.max_input
                            ),
                        ),
                    );
                }
                let work = match lambda {
                    LambdaRef::Native(name) => Work::Native(name),
                    LambdaRef::Module(hash) => {
                        let wished = limits.map_or(self.config.cap, Limits::from);
                        let mut limits = wished.capped_by(&self.config.cap);
                        limits.wall_clock = limits
                            .wall_clock
                            .max(self.config.min_wall_clock)
                            .min(self.config.cap.wall_clock);
                        limits.max_output = limits
                            .max_output
                            .min(usize::try_from(output.len).unwrap_or(usize::MAX));
                        Work::Module(hash, limits)
                    }
                };
                if len == 0 {
                    let job = self.jobs.insert(Job {
                        tag,
                        stage: Stage::Running { output },
                    });
                    self.actions.push_back(Action::Run {
                        job,
                        work,
                        input: Vec::new(),
                    });
                } else {
                    let job = self.jobs.insert(Job {
                        tag,
                        stage: Stage::Reading { work, output },
                    });
                    self.actions.push_back(Action::ReadInput { job, src, len });
                }
            }
        }
    }

    /// The input of `job` was read.
    pub fn handle_input(&mut self, job: usize, input: Vec<u8>) {
        let Some(j) = self.jobs.get_mut(job) else {
            return;
        };
        let stage = std::mem::replace(&mut j.stage, Stage::Loading);
        match stage {
            Stage::Reading { work, output } => {
                j.stage = Stage::Running { output };
                self.actions.push_back(Action::Run { job, work, input });
            }
            other => j.stage = other,
        }
    }

    /// The thread of `job` finished (or could not start).
    pub fn handle_outcome(&mut self, job: usize, outcome: Outcome) {
        let Some(j) = self.jobs.get(job) else {
            return;
        };
        let tag = j.tag;
        let output = match &j.stage {
            Stage::Running { output } => Some(*output),
            _ => None,
        };
        match (outcome, output) {
            (Outcome::Loaded(result), None) => {
                self.jobs.remove(job);
                match result {
                    Ok(hash) => self.actions.push_back(Action::Reply {
                        tag,
                        response: LambdaResponse::Loaded { hash },
                    }),
                    Err(e) => self.fail(tag, (&e).into()),
                }
            }
            (Outcome::Ran(Ok(data)), Some(output)) if data.len() as u64 > output.len => {
                self.jobs.remove(job);
                let e = LambdaError::OutputTooLarge {
                    len: data.len(),
                    limit: output.len as usize,
                };
                self.fail(tag, (&e).into());
            }
            (Outcome::Ran(Ok(data)), Some(_)) if data.is_empty() => {
                self.jobs.remove(job);
                self.actions.push_back(Action::Reply {
                    tag,
                    response: LambdaResponse::Done { len: 0 },
                });
            }
            (Outcome::Ran(Ok(data)), Some(output)) => {
                let len = data.len() as u64;
                self.jobs[job].stage = Stage::Writing { len };
                self.actions.push_back(Action::WriteOutput {
                    job,
                    dst: RemoteRegion { len, ..output },
                    data,
                });
            }
            (Outcome::Ran(Err(e)), Some(_)) => {
                self.jobs.remove(job);
                self.fail(tag, (&e).into());
            }
            (outcome, _) => debug_assert!(false, "{outcome:?} for job {job} in {:?}", j.stage),
        }
    }

    /// The output of `job` was written.
    pub fn handle_written(&mut self, job: usize) {
        if let Some(Job {
            tag,
            stage: Stage::Writing { len },
        }) = self.jobs.try_remove(job)
        {
            self.actions.push_back(Action::Reply {
                tag,
                response: LambdaResponse::Done { len },
            });
        }
    }

    /// The next thing to do.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }
}

// ---------------------------------------------------------------------------------------
// Service and session (the driver)
// ---------------------------------------------------------------------------------------

/// The `lambda` service: clients upload WebAssembly modules and invoke them, or native
/// lambdas the application registered, on bytes they expose by RDMA.
///
/// # Protocol
///
/// ```text
/// client                                            server
///   Upload{module}  ──────────────────────────►      Sandbox::load (on a job thread)
///                   ◄───────────── Loaded{hash} | Failed{kind, message}
///   Invoke{lambda, input, input_len, output, limits} ─►
///                                                    RDMA READ input[..input_len]
///                                                    run (on a job thread, limits capped)
///                                                    RDMA WRITE output[..len]
///                   ◄───────────────── Done{len} | Failed{kind, message}
/// ```
///
/// `input` is a region the client registered with `REMOTE_READ`, `output` one with
/// `REMOTE_WRITE`; the server touches nothing else, and a region without the right
/// access fails the server's READ or WRITE, which closes the connection. The output's
/// length caps the lambda's output ([`Limits::max_output`]); client-requested limits are
/// capped field by field by the server's [`LambdaConfig::cap`].
///
/// # Work happens off the connection's actor
///
/// Loading and running go to a thread of their own (the sandbox adds its worker below
/// that), so a slow or hostile lambda never stalls the other connections of a poller.
/// The thread hands its outcome over a channel and wakes the session
/// (`SessionCx::waker`, answered by `Session::on_wake` on the connection's actor), which
/// goes on with the job at once: WRITE the output, answer. The client just awaits its
/// reply. (Not `SessionCx::spawn_blocking`: jobs count against
/// [`LambdaConfig::max_jobs`] and an abandoned sandbox worker must not hold a thread of
/// the shared blocking pool.)
///
/// # Errors
///
/// Every failure comes back as `Failed` with a [`FailureKind`] (one per
/// [`LambdaError`] variant, plus the service's own) and a readable message; none closes
/// the connection, so a client that sent a trapping, looping or memory-hungry lambda can
/// go on using it.
pub struct LambdaService {
    sandbox: Arc<Sandbox>,
    natives: Arc<NativeLambdas>,
    config: LambdaConfig,
    running: Arc<AtomicUsize>,
}

impl fmt::Debug for LambdaService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LambdaService")
            .field("config", &self.config)
            .field("running_jobs", &self.running.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl LambdaService {
    /// Runs modules in `sandbox` and native lambdas from `natives` (both may be shared
    /// with the application), within `config`.
    pub fn new(sandbox: Arc<Sandbox>, natives: Arc<NativeLambdas>, config: LambdaConfig) -> Self {
        LambdaService {
            sandbox,
            natives,
            config,
            running: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl Service for LambdaService {
    fn session(&self, _peer: &PeerInfo) -> Box<dyn Session> {
        let (done_tx, done_rx) = mpsc::channel();
        Box::new(LambdaSession {
            core: Invocations::new(self.config),
            sandbox: self.sandbox.clone(),
            natives: self.natives.clone(),
            running: self.running.clone(),
            max_jobs: self.config.max_jobs,
            ops: HashMap::new(),
            done_tx,
            done_rx,
        })
    }
}

/// One of [`LambdaConfig::max_jobs`], released when the job's thread ends.
struct JobSlot(Arc<AtomicUsize>);

impl JobSlot {
    fn claim(running: &Arc<AtomicUsize>, max: usize) -> Option<JobSlot> {
        running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| JobSlot(running.clone()))
    }
}

impl Drop for JobSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

enum PendingOp {
    Read { job: usize, buf: BufId, len: usize },
    Write { job: usize, buf: BufId },
}

struct LambdaSession {
    core: Invocations,
    sandbox: Arc<Sandbox>,
    natives: Arc<NativeLambdas>,
    running: Arc<AtomicUsize>,
    max_jobs: usize,
    ops: HashMap<OpId, PendingOp>,
    done_tx: mpsc::Sender<(usize, Outcome)>,
    done_rx: mpsc::Receiver<(usize, Outcome)>,
}

impl LambdaSession {
    /// A local buffer of `len` bytes for a READ target or WRITE source: from the pool
    /// when it has a class that large, registered for this job otherwise.
    fn buffer(cx: &mut SessionCx<'_>, len: usize) -> Result<BufId, SessionError> {
        cx.alloc(len)
            .or_else(|_| cx.register(len, Access::LOCAL_WRITE))
    }

    /// Collects finished jobs, then carries out every action.
    fn drive(&mut self, cx: &mut SessionCx<'_>) -> Result<(), SessionError> {
        let waker = cx.waker();
        while let Ok((job, outcome)) = self.done_rx.try_recv() {
            self.core.handle_outcome(job, outcome);
        }
        while let Some(action) = self.core.poll_action() {
            match action {
                Action::Reply { tag, response } => {
                    let bytes = postcard::to_allocvec(&response)
                        .map_err(|e| SessionError::new(e.to_string()))?;
                    cx.send(tag, bytes)?;
                }
                Action::ReadInput { job, src, len } => {
                    let buf = Self::buffer(cx, len)?;
                    let op = cx.post(Op::Read {
                        buf,
                        range: 0..len,
                        src,
                    })?;
                    self.ops.insert(op, PendingOp::Read { job, buf, len });
                }
                Action::WriteOutput { job, dst, data } => {
                    let buf = Self::buffer(cx, data.len())?;
                    cx.bytes_mut(buf)?[..data.len()].copy_from_slice(&data);
                    let op = cx.post(Op::Write {
                        buf,
                        range: 0..data.len(),
                        dst,
                        imm: None,
                    })?;
                    self.ops.insert(op, PendingOp::Write { job, buf });
                }
                Action::Run { job, work, input } => {
                    if let Err(outcome) = self.spawn(job, work, input, waker.clone()) {
                        self.core.handle_outcome(job, outcome);
                    }
                }
            }
        }
        Ok(())
    }

    /// Starts `work` on a thread of its own; its outcome comes back through `done_rx`, and
    /// `waker` makes the session collect it.
    fn spawn(
        &self,
        job: usize,
        work: Work,
        input: Vec<u8>,
        waker: SessionWaker,
    ) -> Result<(), Outcome> {
        let busy = |work: &Work, why: String| {
            let e = LambdaError::Busy {
                limit: self.max_jobs,
            };
            tracing::debug!(job, %why, "lambda job refused");
            match work {
                Work::Load(_) => Outcome::Loaded(Err(e)),
                _ => Outcome::Ran(Err(e)),
            }
        };
        let Some(slot) = JobSlot::claim(&self.running, self.max_jobs) else {
            return Err(busy(&work, "all job threads busy".into()));
        };
        let sandbox = self.sandbox.clone();
        let natives = self.natives.clone();
        let done = self.done_tx.clone();
        let err_work = work.clone();
        std::thread::Builder::new()
            .name("lambda-job".into())
            .spawn(move || {
                let outcome = match work {
                    Work::Load(module) => Outcome::Loaded(sandbox.load(&module)),
                    Work::Module(hash, limits) => {
                        Outcome::Ran(sandbox.run_owned(&hash, input, &limits))
                    }
                    Work::Native(name) => Outcome::Ran(natives.run(&name, &input)),
                };
                drop(slot);
                // The session may be gone (connection closed): nobody to tell.
                if done.send((job, outcome)).is_ok() {
                    waker.wake(job as u64);
                }
            })
            .map(|_| ())
            .map_err(|e| busy(&err_work, format!("cannot start a thread: {e}")))
    }
}

impl Session for LambdaSession {
    fn on_message(&mut self, cx: &mut SessionCx<'_>, msg: Message) -> Result<(), SessionError> {
        let req: LambdaRequest = postcard::from_bytes(&msg.data)
            .map_err(|e| SessionError::new(format!("malformed lambda request: {e}")))?;
        if msg.tag == 0 {
            return Err(SessionError::new("lambda requests need a reply tag"));
        }
        self.core.handle_request(msg.tag, req);
        self.drive(cx)
    }

    /// A job thread finished (the token is its job; `drive` collects every finished one).
    fn on_wake(&mut self, cx: &mut SessionCx<'_>, _job: u64) -> Result<(), SessionError> {
        self.drive(cx)
    }

    fn on_op(
        &mut self,
        cx: &mut SessionCx<'_>,
        op: OpId,
        result: rdmactor::verbs::Result<()>,
    ) -> Result<(), SessionError> {
        let pending = self
            .ops
            .remove(&op)
            .ok_or_else(|| SessionError::new(format!("completion of unknown {op:?}")))?;
        let (job, buf, what) = match pending {
            PendingOp::Read { job, buf, .. } => (job, buf, "reading the input"),
            PendingOp::Write { job, buf } => (job, buf, "writing the output"),
        };
        if let Err(e) = result {
            cx.free(buf);
            // The QP is in error; the connection closes after this call.
            return Err(SessionError::new(format!("{what} of job {job}: {e}")));
        }
        match pending {
            PendingOp::Read { len, .. } => {
                let input = cx.bytes(buf)?[..len].to_vec();
                self.core.handle_input(job, input);
            }
            PendingOp::Write { .. } => self.core.handle_written(job),
        }
        cx.free(buf);
        self.drive(cx)
    }
}

// ---------------------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------------------

/// Why a lambda call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The server answered with a failure (the connection stays usable).
    #[error("lambda failed: {0}")]
    Failed(Failure),
    /// The request failed or the connection closed.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The server answered something unexpected.
    #[error("unexpected reply: {0}")]
    Protocol(String),
}

impl CallError {
    /// The failure's kind, when the server reported one.
    pub fn kind(&self) -> Option<FailureKind> {
        match self {
            CallError::Failed(f) => Some(f.kind),
            _ => None,
        }
    }
}

/// What to run and on which regions, for [`invoke`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// The lambda.
    pub lambda: LambdaRef,
    /// A region registered with `REMOTE_READ` holding the input at its start.
    pub input: RemoteRegion,
    /// Input bytes.
    pub input_len: u64,
    /// A region registered with `REMOTE_WRITE` for the output.
    pub output: RemoteRegion,
    /// Limits wished for (`None`: the server's cap).
    pub limits: Option<Limits>,
}

async fn call(conn: &ClientConnection, req: &LambdaRequest) -> Result<LambdaResponse, CallError> {
    Ok(conn.request_typed(req).await?)
}

/// Uploads a WebAssembly module; returns the hash that names it.
///
/// # Errors
/// [`CallError::Failed`] with [`FailureKind::InvalidModule`], `ImportsNotAllowed`,
/// `MissingExport`, `ModuleTooLarge`, `CacheFull` or `Busy`; [`CallError::Request`].
pub async fn upload(conn: &ClientConnection, module: &[u8]) -> Result<ModuleHash, CallError> {
    let req = LambdaRequest::Upload {
        module: module.to_vec(),
    };
    match call(conn, &req).await? {
        LambdaResponse::Loaded { hash } => Ok(hash),
        LambdaResponse::Failed(f) => Err(CallError::Failed(f)),
        other => Err(CallError::Protocol(format!("{other:?}"))),
    }
}

/// Runs a lambda on the client's input region and returns how many output bytes it
/// wrote to the start of the output region.
///
/// # Errors
/// [`CallError::Failed`] with the kind of failure (`Trap`, `OutOfFuel`, `Timeout`,
/// `MemoryLimit`, `UnknownLambda`, `OutputTooLarge`, ...); [`CallError::Request`] when
/// the connection closed (for example because a region lacked the access it needs).
pub async fn invoke(conn: &ClientConnection, inv: &Invocation) -> Result<u64, CallError> {
    let req = LambdaRequest::Invoke {
        lambda: inv.lambda.clone(),
        input: inv.input,
        input_len: inv.input_len,
        output: inv.output,
        limits: inv.limits.map(WireLimits::from),
    };
    match call(conn, &req).await? {
        LambdaResponse::Done { len } => Ok(len),
        LambdaResponse::Failed(f) => Err(CallError::Failed(f)),
        other => Err(CallError::Protocol(format!("{other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(addr: u64, len: u64) -> RemoteRegion {
        RemoteRegion { addr, len, rkey: 7 }
    }

    fn config() -> LambdaConfig {
        LambdaConfig {
            cap: Limits {
                fuel: 1000,
                max_memory_bytes: 1 << 20,
                wall_clock: Duration::from_millis(100),
                max_output: 1 << 20,
            },
            max_input: 4096,
            max_jobs_per_connection: 2,
            max_jobs: 8,
            min_wall_clock: Duration::from_millis(10),
        }
    }

    fn invoke(lambda: LambdaRef, input_len: u64, output_len: u64) -> LambdaRequest {
        LambdaRequest::Invoke {
            lambda,
            input: region(0x1000, 4096),
            input_len,
            output: region(0x9000, output_len),
            limits: None,
        }
    }

    /// [`invoke`] of the test module on an empty input, asking for `wished`.
    fn invoke_with_limits(wished: WireLimits) -> LambdaRequest {
        let mut req = invoke(LambdaRef::Module(hash()), 0, 100);
        if let LambdaRequest::Invoke { limits, .. } = &mut req {
            *limits = Some(wished);
        }
        req
    }

    fn hash() -> ModuleHash {
        ModuleHash::of(b"module")
    }

    fn actions(inv: &mut Invocations) -> Vec<Action> {
        std::iter::from_fn(|| inv.poll_action()).collect()
    }

    fn failed(tag: u32, kind: FailureKind) -> impl Fn(&Action) -> bool {
        move |a| {
            matches!(a, Action::Reply { tag: t, response: LambdaResponse::Failed(f) }
                if *t == tag && f.kind == kind)
        }
    }

    #[test]
    fn an_invocation_reads_runs_writes_and_answers() {
        let mut inv = Invocations::new(config());
        inv.handle_request(5, invoke(LambdaRef::Module(hash()), 100, 64));
        let [Action::ReadInput { job, src, len }] = actions(&mut inv)[..] else {
            panic!("expected a read");
        };
        assert_eq!((src, len), (region(0x1000, 100), 100));
        inv.handle_input(job, vec![1; 100]);
        let acts = actions(&mut inv);
        let [Action::Run {
            job: j,
            work: Work::Module(h, limits),
            input,
        }] = &acts[..]
        else {
            panic!("expected a run: {acts:?}");
        };
        assert_eq!((*j, *h, input.len()), (job, hash(), 100));
        assert_eq!(limits.max_output, 64, "the output region caps the output");
        assert_eq!(limits.fuel, 1000);
        inv.handle_outcome(job, Outcome::Ran(Ok(vec![9; 10])));
        assert_eq!(
            actions(&mut inv),
            [Action::WriteOutput {
                job,
                dst: region(0x9000, 10),
                data: vec![9; 10]
            }]
        );
        assert_eq!(inv.jobs(), 1);
        inv.handle_written(job);
        assert_eq!(
            actions(&mut inv),
            [Action::Reply {
                tag: 5,
                response: LambdaResponse::Done { len: 10 }
            }]
        );
        assert_eq!(inv.jobs(), 0);
    }

    #[test]
    fn client_limits_are_capped_by_the_server() {
        let mut inv = Invocations::new(config());
        let wished = Limits {
            fuel: 5,
            max_memory_bytes: 1 << 30,
            wall_clock: Duration::from_secs(60),
            max_output: 10,
        };
        inv.handle_request(1, invoke_with_limits(wished.into()));
        let acts = actions(&mut inv);
        let [Action::Run {
            work: Work::Module(_, limits),
            ..
        }] = &acts[..]
        else {
            panic!("{acts:?}");
        };
        assert_eq!(
            *limits,
            Limits {
                fuel: 5,
                max_memory_bytes: 1 << 20,
                wall_clock: Duration::from_millis(100),
                max_output: 10
            }
        );
    }

    /// Security issue item 6: `wall_clock_ms = 0` used to pass through (limits were only
    /// capped downwards), so every invocation timed out at once and freed its job slot.
    #[test]
    fn a_zero_wall_clock_is_raised_to_the_floor() {
        let mut inv = Invocations::new(config());
        let wished = WireLimits {
            fuel: u64::MAX,
            max_memory_bytes: 1 << 20,
            wall_clock_ms: 0,
            max_output: 10,
        };
        inv.handle_request(1, invoke_with_limits(wished));
        let acts = actions(&mut inv);
        let [Action::Run {
            work: Work::Module(_, limits),
            ..
        }] = &acts[..]
        else {
            panic!("{acts:?}");
        };
        assert_eq!(limits.wall_clock, Duration::from_millis(10));
        assert_eq!(limits.fuel, 1000, "fuel capped as before");
    }

    #[test]
    fn empty_inputs_and_outputs_skip_the_rdma() {
        let mut inv = Invocations::new(config());
        inv.handle_request(3, invoke(LambdaRef::Native("n".into()), 0, 16));
        let acts = actions(&mut inv);
        let [Action::Run { job, ref input, .. }] = acts[..] else {
            panic!("{acts:?}");
        };
        assert!(input.is_empty());
        inv.handle_outcome(job, Outcome::Ran(Ok(Vec::new())));
        assert_eq!(
            actions(&mut inv),
            [Action::Reply {
                tag: 3,
                response: LambdaResponse::Done { len: 0 }
            }]
        );
    }

    #[test]
    fn failures_are_answered_and_free_the_job() {
        let mut inv = Invocations::new(config());
        inv.handle_request(1, invoke(LambdaRef::Module(hash()), 0, 16));
        let Some(Action::Run { job, .. }) = inv.poll_action() else {
            panic!()
        };
        inv.handle_outcome(
            job,
            Outcome::Ran(Err(LambdaError::OutOfFuel { fuel: 1000 })),
        );
        let acts = actions(&mut inv);
        assert!(failed(1, FailureKind::OutOfFuel)(&acts[0]), "{acts:?}");
        assert_eq!(inv.jobs(), 0);

        // A native lambda's output larger than the region.
        inv.handle_request(2, invoke(LambdaRef::Native("n".into()), 0, 4));
        let Some(Action::Run { job, .. }) = inv.poll_action() else {
            panic!()
        };
        inv.handle_outcome(job, Outcome::Ran(Ok(vec![0; 5])));
        let acts = actions(&mut inv);
        assert!(failed(2, FailureKind::OutputTooLarge)(&acts[0]), "{acts:?}");

        inv.handle_request(3, LambdaRequest::Upload { module: vec![0] });
        let Some(Action::Run { job, .. }) = inv.poll_action() else {
            panic!()
        };
        inv.handle_outcome(
            job,
            Outcome::Loaded(Err(LambdaError::InvalidModule("junk".into()))),
        );
        let acts = actions(&mut inv);
        assert!(failed(3, FailureKind::InvalidModule)(&acts[0]), "{acts:?}");
        assert_eq!(inv.jobs(), 0);
    }

    #[test]
    fn bad_requests_are_refused_up_front() {
        let mut inv = Invocations::new(config());
        inv.handle_request(1, invoke(LambdaRef::Native("n".into()), 5000, 16));
        inv.handle_request(2, {
            let mut r = invoke(LambdaRef::Native("n".into()), 10, 16);
            if let LambdaRequest::Invoke { input, .. } = &mut r {
                input.len = 5;
            }
            r
        });
        let acts = actions(&mut inv);
        assert_eq!(acts.len(), 2, "{acts:?}");
        assert!(
            failed(1, FailureKind::BadRequest)(&acts[0]),
            "5000 bytes beyond the 4096-byte region: {acts:?}"
        );
        assert!(failed(2, FailureKind::BadRequest)(&acts[1]), "{acts:?}");
    }

    #[test]
    fn inputs_over_the_server_limit_are_refused() {
        let mut cfg = config();
        cfg.max_input = 10;
        let mut inv = Invocations::new(cfg);
        inv.handle_request(1, invoke(LambdaRef::Native("n".into()), 11, 16));
        assert!(failed(1, FailureKind::InputTooLarge)(
            &inv.poll_action().unwrap()
        ));
    }

    #[test]
    fn a_connection_has_a_bounded_number_of_jobs() {
        let mut inv = Invocations::new(config());
        for tag in 1..=3 {
            inv.handle_request(tag, invoke(LambdaRef::Native("n".into()), 1, 16));
        }
        let acts = actions(&mut inv);
        assert!(matches!(acts[0], Action::ReadInput { .. }));
        assert!(matches!(acts[1], Action::ReadInput { .. }));
        assert!(failed(3, FailureKind::Busy)(&acts[2]), "{acts:?}");
        assert_eq!(inv.jobs(), 2);
    }

    #[test]
    fn stray_events_are_ignored() {
        let mut inv = Invocations::new(config());
        inv.handle_input(7, vec![1]);
        inv.handle_written(7);
        inv.handle_outcome(7, Outcome::Ran(Ok(vec![1])));
        assert_eq!(inv.poll_action(), None);
    }

    #[test]
    fn every_lambda_error_has_its_kind() {
        let cases = [
            (
                LambdaError::InvalidModule(String::new()),
                FailureKind::InvalidModule,
            ),
            (LambdaError::Trap("t".into()), FailureKind::Trap),
            (LambdaError::OutOfFuel { fuel: 1 }, FailureKind::OutOfFuel),
            (
                LambdaError::MemoryLimit { limit: 1 },
                FailureKind::MemoryLimit,
            ),
            (
                LambdaError::Timeout {
                    limit: Duration::from_millis(1),
                },
                FailureKind::Timeout,
            ),
            (LambdaError::GuestError(-1), FailureKind::GuestError),
        ];
        for (e, kind) in cases {
            let f = Failure::from(&e);
            assert_eq!(f.kind, kind);
            assert_eq!(f.message, e.to_string());
        }
    }

    #[test]
    fn messages_round_trip() {
        let limits: WireLimits = Limits::default().into();
        assert_eq!(Limits::from(limits), Limits::default());
        for req in [
            LambdaRequest::Upload {
                module: vec![0, 97, 115, 109],
            },
            LambdaRequest::Invoke {
                lambda: LambdaRef::Module(hash()),
                input: region(1, 2),
                input_len: 2,
                output: region(3, 4),
                limits: Some(limits),
            },
        ] {
            let bytes = postcard::to_allocvec(&req).unwrap();
            assert_eq!(postcard::from_bytes::<LambdaRequest>(&bytes).unwrap(), req);
        }
        let resp = LambdaResponse::Failed(Failure::new(FailureKind::Timeout, "slow"));
        let bytes = postcard::to_allocvec(&resp).unwrap();
        assert_eq!(
            postcard::from_bytes::<LambdaResponse>(&bytes).unwrap(),
            resp
        );
    }
}
