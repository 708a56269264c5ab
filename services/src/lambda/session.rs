//! The session: one connection's driver. It feeds the job state machine with requests,
//! completions and finished jobs, and carries out its actions (READ, run off the actor,
//! WRITE, reply).

use std::collections::HashMap;
use std::sync::{mpsc, Arc};

use rdmactor::runtime::{BufId, Message, Op, OpId, Session, SessionCx, SessionError, SessionWaker};
use rdmactor::verbs::Access;

use super::job::{Action, Invocations, Outcome, Work};
use super::native::NativeLambdas;
use super::sandbox::{LambdaError, SandboxClient};
use super::service::JobSlots;
use super::wire::LambdaRequest;

enum PendingOp {
    Read {
        job: usize,
        buf: BufId,
        offset: usize,
        len: usize,
    },
    Write {
        job: usize,
        buf: BufId,
    },
}

pub(super) struct LambdaSession {
    core: Invocations,
    /// This connection's handle on the sandbox (its own module-cache quota); job threads
    /// share it, so its holds end once the session and its last job are gone.
    sandbox: Arc<SandboxClient>,
    natives: Arc<NativeLambdas>,
    slots: JobSlots,
    ops: HashMap<OpId, PendingOp>,
    done_tx: mpsc::Sender<(usize, Outcome)>,
    done_rx: mpsc::Receiver<(usize, Outcome)>,
}

impl LambdaSession {
    pub(super) fn new(
        core: Invocations,
        sandbox: Arc<SandboxClient>,
        natives: Arc<NativeLambdas>,
        slots: JobSlots,
    ) -> Self {
        let (done_tx, done_rx) = mpsc::channel();
        LambdaSession {
            core,
            sandbox,
            natives,
            slots,
            ops: HashMap::new(),
            done_tx,
            done_rx,
        }
    }

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
                Action::ReadInput {
                    job,
                    offset,
                    src,
                    len,
                } => {
                    let buf = Self::buffer(cx, len)?;
                    let op = cx.post(Op::Read {
                        buf,
                        range: 0..len,
                        src,
                    })?;
                    self.ops.insert(
                        op,
                        PendingOp::Read {
                            job,
                            buf,
                            offset,
                            len,
                        },
                    );
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
                limit: self.slots.max(),
            };
            tracing::debug!(job, %why, "lambda job refused");
            match work {
                Work::Load(_) => Outcome::Loaded(Err(e)),
                _ => Outcome::Ran(Err(e)),
            }
        };
        let Some(slot) = self.slots.claim() else {
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
                        Outcome::Ran(counted("module", sandbox.run(&hash, &input, &limits)))
                    }
                    Work::Native(name) => {
                        Outcome::Ran(counted("native", natives.run(&name, &input)))
                    }
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
            PendingOp::Read { offset, len, .. } => {
                self.core.handle_input(job, offset, &cx.bytes(buf)?[..len]);
            }
            PendingOp::Write { .. } => self.core.handle_written(job),
        }
        cx.free(buf);
        self.drive(cx)
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
