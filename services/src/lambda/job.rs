//! One connection's jobs as a state machine with no I/O: an invocation takes a job slot,
//! then counts its bytes against the server's heap budget, then READs its input, runs,
//! WRITEs its output and replies (or a failure reply at any step). The session drives it.
//!
//! The order is the point (issue 45): the input buffer is allocated, and the client's
//! region READ, only once the service granted a job slot (and room for the input) and
//! the heap budget counted the bytes; never before, outside any budget.
//!
//! The machine is generic over what the driver hands back for a granted slot (`G`, the
//! owner's answer, which frees the slot when dropped) and for counted bytes (`H`, a
//! [`Held`](rdmactor::runtime::Held)), so that its tests need neither an owner nor a pool.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use std::collections::VecDeque;

use rdmactor::runtime::HeapError;
use rdmactor::verbs::RemoteRegion;
use slab::Slab;

use super::config::LambdaConfig;
use super::sandbox::{LambdaError, Limits, ModuleHash};
use super::wire::{Failure, FailureKind, LambdaRef, LambdaRequest, LambdaResponse};

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
pub(crate) enum Action<G> {
    /// Answer request `tag`.
    Reply { tag: u32, response: LambdaResponse },
    /// Ask the service for a job slot, the module and room for `len` bytes of input for
    /// `job` (`work` is [`Work::Module`] or [`Work::Native`]), then `handle_started`.
    Start { job: usize, work: Work, len: usize },
    /// Count `len` bytes against the server's heap budget for `job`, then
    /// `handle_held`. Never waits: a job holds a service-wide slot meanwhile.
    Hold { job: usize, len: usize },
    /// RDMA READ the `len` bytes of `src` (the input's bytes from `offset`), then
    /// `handle_input`. A large input is read in chunks of
    /// [`LambdaConfig::read_chunk`], at most [`LambdaConfig::reads_in_flight`] at a time.
    ReadInput {
        job: usize,
        offset: usize,
        src: RemoteRegion,
        len: usize,
    },
    /// Hash the uploaded `module` off the actor, ask the service to compile it, then
    /// `handle_outcome`.
    Load { job: usize, module: Vec<u8> },
    /// Run `work` on `input` with its job slot off the actor, then `handle_outcome`.
    Run {
        job: usize,
        work: Work,
        input: Vec<u8>,
        slot: G,
    },
    /// RDMA WRITE `data` to `dst`, then `handle_written`.
    WriteOutput {
        job: usize,
        dst: RemoteRegion,
        data: Vec<u8>,
    },
}

#[derive(Debug)]
enum Stage<G, H> {
    Loading,
    /// Waiting for a job slot; nothing allocated for the input yet.
    Starting {
        work: Work,
        output: RemoteRegion,
        /// The whole input region (`input_len` bytes).
        src: RemoteRegion,
    },
    /// The slot is granted; waiting for the heap budget to count the job's bytes.
    Holding {
        work: Work,
        output: RemoteRegion,
        src: RemoteRegion,
        slot: G,
    },
    Reading {
        work: Work,
        output: RemoteRegion,
        /// The whole input region (`input_len` bytes).
        src: RemoteRegion,
        slot: G,
        /// The bytes of `input` and of the output, counted.
        held: Option<H>,
        /// The input so far: chunks land at their offsets.
        input: Vec<u8>,
        /// Offset of the next chunk to ask for.
        next: usize,
        /// Chunk reads posted and not yet handled.
        in_flight: usize,
        /// Bytes handled.
        received: usize,
        /// Why the input cannot be read (no buffer for a chunk): no more chunks are
        /// asked for, and the request is answered once those posted have come back, so
        /// the client's input region is not READ after its answer.
        refused: Option<Failure>,
    },
    Running {
        output: RemoteRegion,
        /// Counts the input (moved to the job's thread) and the output to come.
        held: Option<H>,
    },
    Writing {
        len: u64,
        /// Counts the output until it is written.
        _held: Option<H>,
    },
}

#[derive(Debug)]
struct Job<G, H> {
    tag: u32,
    stage: Stage<G, H>,
}

/// One connection's requests, from arrival to answer, with no I/O: the session feeds it
/// (`handle_*`) and carries out its [`Action`]s (`poll_action`, in order).
#[derive(Debug)]
pub(crate) struct Invocations<G, H> {
    config: LambdaConfig,
    jobs: Slab<Job<G, H>>,
    actions: VecDeque<Action<G>>,
}

impl<G: std::fmt::Debug, H: std::fmt::Debug> Invocations<G, H> {
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

    /// Removes `job` (its slot and held bytes go with it) and answers it with `failure`.
    fn end_failed(&mut self, job: usize, failure: Failure) {
        if let Some(j) = self.jobs.try_remove(job) {
            self.fail(j.tag, failure);
        }
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
                self.actions.push_back(Action::Load { job, module });
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
                let len = usize::try_from(input_len).unwrap_or(usize::MAX);
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
                // The slot first: nothing is allocated for a job the service cannot run.
                let job = self.jobs.insert(Job {
                    tag,
                    stage: Stage::Starting {
                        work: work.clone(),
                        output,
                        src,
                    },
                });
                self.actions.push_back(Action::Start { job, work, len });
            }
        }
    }

    /// The service answered `job`'s [`Action::Start`]: its slot, or why not.
    pub fn handle_started(&mut self, job: usize, granted: Result<G, LambdaError>) {
        let Some(j) = self.jobs.get_mut(job) else {
            return;
        };
        if !matches!(j.stage, Stage::Starting { .. }) {
            debug_assert!(false, "a slot for job {job} in {:?}", j.stage);
            return;
        }
        let slot = match granted {
            Ok(slot) => slot,
            Err(e) => return self.end_failed(job, (&e).into()),
        };
        let Stage::Starting { work, output, src } = std::mem::replace(&mut j.stage, Stage::Loading)
        else {
            unreachable!("matched above");
        };
        let len = held_len(&self.config, &src, &output);
        j.stage = Stage::Holding {
            work,
            output,
            src,
            slot,
        };
        self.actions.push_back(Action::Hold { job, len });
    }

    /// The heap budget answered `job`'s [`Action::Hold`]: the bytes are counted (then the
    /// input is allocated and READ), or the job is refused with
    /// [`FailureKind::HeapFull`] and its slot given back; the connection goes on.
    pub fn handle_held(&mut self, job: usize, held: Result<H, HeapError>) {
        let Some(j) = self.jobs.get_mut(job) else {
            return;
        };
        if !matches!(j.stage, Stage::Holding { .. }) {
            debug_assert!(false, "held bytes for job {job} in {:?}", j.stage);
            return;
        }
        let held = match held {
            Ok(held) => held,
            Err(e) => {
                let failure = Failure::new(
                    FailureKind::HeapFull,
                    format!("no room for the job's input and output: {e}"),
                );
                return self.end_failed(job, failure);
            }
        };
        let Stage::Holding {
            work,
            output,
            src,
            slot,
        } = std::mem::replace(&mut j.stage, Stage::Loading)
        else {
            unreachable!("matched above");
        };
        if src.len == 0 {
            j.stage = Stage::Running {
                output,
                held: Some(held),
            };
            return self.actions.push_back(Action::Run {
                job,
                work,
                input: Vec::new(),
                slot,
            });
        }
        // Within `max_input` (checked on arrival), and counted just now.
        let len = usize::try_from(src.len).unwrap_or(usize::MAX);
        j.stage = Stage::Reading {
            work,
            output,
            src,
            slot,
            held: Some(held),
            input: vec![0; len],
            next: 0,
            in_flight: 0,
            received: 0,
            refused: None,
        };
        self.request_chunks(job);
    }

    /// Asks for the next chunks of `job`'s input, up to the window.
    fn request_chunks(&mut self, job: usize) {
        let (chunk, window) = (
            self.config.read_chunk.max(1),
            self.config.reads_in_flight.max(1),
        );
        let Some(Job {
            stage:
                Stage::Reading {
                    src,
                    input,
                    next,
                    in_flight,
                    ..
                },
            ..
        }) = self.jobs.get_mut(job)
        else {
            return;
        };
        while *in_flight < window && *next < input.len() {
            // Below `input.len()` (the loop's condition): our own buffer, sized to the
            // checked input region.
            let len = chunk.min(input.len().saturating_sub(*next));
            let piece = src
                .slice(*next as u64, len as u64)
                .expect("chunks lie within the checked input region");
            self.actions.push_back(Action::ReadInput {
                job,
                offset: *next,
                src: piece,
                len,
            });
            // At most `input.len()`; at most `window` in flight.
            *next = next.saturating_add(len);
            *in_flight = in_flight.saturating_add(1);
        }
    }

    /// The chunk of `job`'s input at `offset` was read: `data`.
    pub fn handle_input(&mut self, job: usize, offset: usize, data: &[u8]) {
        let Some(j) = self.jobs.get_mut(job) else {
            return;
        };
        let Stage::Reading {
            input,
            in_flight,
            received,
            refused,
            ..
        } = &mut j.stage
        else {
            return;
        };
        // Every chunk that completes was counted in `in_flight` when posted.
        if refused.is_some() {
            *in_flight = in_flight.saturating_sub(1);
            return self.finish_refused(job);
        }
        let Some(slot) = offset
            .checked_add(data.len())
            .and_then(|end| input.get_mut(offset..end))
        else {
            debug_assert!(false, "chunk {offset}+{} outside the input", data.len());
            return;
        };
        slot.copy_from_slice(data);
        *in_flight = in_flight.saturating_sub(1);
        // Within the input (the slot above), so at most `input.len()` in all.
        *received = received.saturating_add(data.len());
        if *received < input.len() {
            return self.request_chunks(job);
        }
        match std::mem::replace(&mut j.stage, Stage::Loading) {
            Stage::Reading {
                work,
                output,
                input,
                slot,
                held,
                ..
            } => {
                j.stage = Stage::Running { output, held };
                self.actions.push_back(Action::Run {
                    job,
                    work,
                    input,
                    slot,
                });
            }
            other => j.stage = other,
        }
    }

    /// `job` could not be carried on for a reason of the server's (no room to run it:
    /// its blocking work was refused): answered [`FailureKind::Busy`] with `reason`.
    pub fn handle_busy(&mut self, job: usize, reason: &str) {
        self.end_failed(job, Failure::new(FailureKind::Busy, reason));
    }

    /// The thread of `job` finished (or could not start).
    pub fn handle_outcome(&mut self, job: usize, outcome: Outcome) {
        let Some(j) = self.jobs.get_mut(job) else {
            return;
        };
        let tag = j.tag;
        let (output, held) = match &mut j.stage {
            Stage::Running { output, held } => (Some(*output), held.take()),
            _ => (None, None),
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
                    limit: usize::try_from(output.len).unwrap_or(usize::MAX),
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
                self.jobs[job].stage = Stage::Writing { len, _held: held };
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

    /// No buffer could be had for a chunk of `job`'s input (the registered-memory pool at
    /// its cap): the request is answered [`FailureKind::Busy`] with `reason` once the
    /// chunks already posted are back, and the connection goes on. The chunks asked for
    /// and not yet posted are dropped.
    pub fn input_refused(&mut self, job: usize, reason: &str) {
        let Some(Job {
            stage: Stage::Reading {
                in_flight, refused, ..
            },
            ..
        }) = self.jobs.get_mut(job)
        else {
            return;
        };
        if refused.is_none() {
            *refused = Some(no_memory("input", reason));
        }
        // This chunk, and the ones queued behind it, were counted as posted.
        let before = self.actions.len();
        self.actions
            .retain(|a| !matches!(a, Action::ReadInput { job: j, .. } if *j == job));
        // Those chunks were all counted in `in_flight`; `retain` only removes.
        let dropped = before.saturating_sub(self.actions.len());
        *in_flight = in_flight.saturating_sub(dropped.saturating_add(1));
        self.finish_refused(job);
    }

    /// Answers a refused job whose posted chunks are all back.
    fn finish_refused(&mut self, job: usize) {
        if let Some(Job {
            stage:
                Stage::Reading {
                    in_flight: 0,
                    refused: Some(_),
                    ..
                },
            ..
        }) = self.jobs.get(job)
        {
            let j = self.jobs.remove(job);
            if let Stage::Reading {
                refused: Some(failure),
                ..
            } = j.stage
            {
                self.fail(j.tag, failure);
            }
        }
    }

    /// No buffer could be had for `job`'s output (the registered-memory pool at its cap):
    /// the request is answered [`FailureKind::Busy`] with `reason`, and the job is gone.
    /// The output was computed; the client may ask again once the server has room.
    pub fn output_refused(&mut self, job: usize, reason: &str) {
        if let Some(Job {
            stage: Stage::Writing { .. },
            ..
        }) = self.jobs.get(job)
        {
            self.end_failed(job, no_memory("output", reason));
        }
    }

    /// The output of `job` was written.
    pub fn handle_written(&mut self, job: usize) {
        if let Some(Job {
            stage: Stage::Writing { .. },
            ..
        }) = self.jobs.get(job)
        {
            if let Some(Job {
                tag,
                stage: Stage::Writing { len, .. },
            }) = self.jobs.try_remove(job)
            {
                self.actions.push_back(Action::Reply {
                    tag,
                    response: LambdaResponse::Done { len },
                });
            }
        }
    }

    /// The next thing to do.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action<G>> {
        self.actions.pop_front()
    }
}

/// Bytes a job makes the server hold: its input, and its output (at most the smaller of
/// the client's output region and the service's cap; counted up front, since the lambda
/// allocates it while it runs).
fn held_len(config: &LambdaConfig, src: &RemoteRegion, output: &RemoteRegion) -> usize {
    let input = usize::try_from(src.len).unwrap_or(usize::MAX);
    let output = usize::try_from(output.len)
        .unwrap_or(usize::MAX)
        .min(config.cap.max_output);
    input.saturating_add(output)
}

/// The answer to a request whose `what` (input or output) found no buffer: `Busy`, since
/// the memory is the server's and the client may ask again once there is room.
fn no_memory(what: &str, reason: &str) -> Failure {
    Failure::new(
        FailureKind::Busy,
        format!("no memory for the {what}: {reason}"),
    )
}

// The tests' own numbers, not a peer's.
#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use std::time::Duration;

    use super::super::wire::WireLimits;
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
            read_chunk: 1 << 20,
            reads_in_flight: 4,
            ..LambdaConfig::default()
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

    /// What the driver hands back for a granted job slot.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct Slot;

    /// Counted bytes: their number.
    type Inv = Invocations<Slot, usize>;

    fn actions(inv: &mut Inv) -> Vec<Action<Slot>> {
        std::iter::from_fn(|| inv.poll_action()).collect()
    }

    /// Grants every job slot and every heap hold asked for, as a driver with room would,
    /// and leaves the other actions queued in order.
    fn grant(inv: &mut Inv) {
        let mut kept = Vec::new();
        loop {
            let mut granted = false;
            for a in actions(inv) {
                match a {
                    Action::Start { job, .. } => inv.handle_started(job, Ok(Slot)),
                    Action::Hold { job, len } => inv.handle_held(job, Ok(len)),
                    other => {
                        kept.push(other);
                        continue;
                    }
                }
                granted = true;
            }
            if !granted {
                break;
            }
        }
        inv.actions.extend(kept);
    }

    fn failed(tag: u32, kind: FailureKind) -> impl Fn(&Action<Slot>) -> bool {
        move |a| {
            matches!(a, Action::Reply { tag: t, response: LambdaResponse::Failed(f) }
                if *t == tag && f.kind == kind)
        }
    }

    #[test]
    fn an_invocation_reads_runs_writes_and_answers() {
        let mut inv = Inv::new(config());
        inv.handle_request(5, invoke(LambdaRef::Module(hash()), 100, 64));
        grant(&mut inv);
        let [Action::ReadInput {
            job,
            offset,
            src,
            len,
        }] = actions(&mut inv)[..]
        else {
            panic!("expected a read");
        };
        assert_eq!((offset, src, len), (0, region(0x1000, 100), 100));
        inv.handle_input(job, 0, &[1; 100]);
        let acts = actions(&mut inv);
        let [Action::Run {
            job: j,
            work: Work::Module(h, limits),
            input,
            ..
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

    /// A large input is read in chunks, a window of them at a time; chunks may complete
    /// in any order and land at their offsets.
    #[test]
    fn large_inputs_are_read_in_chunks() {
        let mut cfg = config();
        cfg.read_chunk = 4;
        cfg.reads_in_flight = 2;
        let mut inv = Inv::new(cfg);
        inv.handle_request(1, invoke(LambdaRef::Native("n".into()), 10, 16));
        grant(&mut inv);
        let reads = |acts: Vec<Action<Slot>>| -> Vec<(usize, u64, usize)> {
            acts.into_iter()
                .map(|a| match a {
                    Action::ReadInput {
                        offset, src, len, ..
                    } => {
                        assert_eq!(src.len, len as u64);
                        (offset, src.addr, len)
                    }
                    other => panic!("expected a read, got {other:?}"),
                })
                .collect()
        };
        assert_eq!(
            reads(actions(&mut inv)),
            [(0, 0x1000, 4), (4, 0x1004, 4)],
            "two chunks in flight"
        );
        inv.handle_input(0, 4, b"4567");
        assert_eq!(reads(actions(&mut inv)), [(8, 0x1008, 2)]);
        inv.handle_input(0, 8, b"89");
        assert!(actions(&mut inv).is_empty(), "chunk 0 still missing");
        inv.handle_input(0, 0, b"0123");
        let acts = actions(&mut inv);
        let [Action::Run { input, .. }] = &acts[..] else {
            panic!("{acts:?}");
        };
        assert_eq!(input, b"0123456789");
    }

    #[test]
    fn client_limits_are_capped_by_the_server() {
        let mut inv = Inv::new(config());
        let wished = Limits {
            fuel: 5,
            max_memory_bytes: 1 << 30,
            wall_clock: Duration::from_secs(60),
            max_output: 10,
        };
        inv.handle_request(1, invoke_with_limits(wished.into()));
        grant(&mut inv);
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
        let mut inv = Inv::new(config());
        let wished = WireLimits {
            fuel: u64::MAX,
            max_memory_bytes: 1 << 20,
            wall_clock_ms: 0,
            max_output: 10,
        };
        inv.handle_request(1, invoke_with_limits(wished));
        grant(&mut inv);
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
        let mut inv = Inv::new(config());
        inv.handle_request(3, invoke(LambdaRef::Native("n".into()), 0, 16));
        grant(&mut inv);
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
    fn an_output_without_a_buffer_is_answered_busy_and_frees_the_job() {
        let mut inv = Inv::new(config());
        inv.handle_request(4, invoke(LambdaRef::Module(hash()), 0, 16));
        grant(&mut inv);
        let Some(Action::Run { job, .. }) = inv.poll_action() else {
            panic!()
        };
        inv.handle_outcome(job, Outcome::Ran(Ok(vec![1, 2, 3])));
        assert!(matches!(
            inv.poll_action(),
            Some(Action::WriteOutput { job: j, .. }) if j == job
        ));
        inv.output_refused(job, "registering 3 B would pass the pool's cap");
        let acts = actions(&mut inv);
        assert!(acts.iter().any(failed(4, FailureKind::Busy)), "{acts:?}");
        match &acts[..] {
            [Action::Reply {
                response: LambdaResponse::Failed(f),
                ..
            }] => assert!(f.message.contains("pool's cap"), "{}", f.message),
            other => panic!("one answer expected: {other:?}"),
        }
        assert_eq!(inv.jobs(), 0);
        inv.handle_written(job);
        assert!(actions(&mut inv).is_empty(), "no second answer");
    }

    #[test]
    fn an_input_chunk_without_a_buffer_is_answered_busy_once_the_posted_chunks_are_back() {
        let mut inv = Inv::new(LambdaConfig {
            read_chunk: 4,
            reads_in_flight: 3,
            ..config()
        });
        inv.handle_request(6, invoke(LambdaRef::Native("checksum".into()), 20, 16));
        grant(&mut inv);
        // The driver takes one action at a time: the first chunk is posted, the second
        // finds no buffer, and the third is still queued behind it.
        let Some(Action::ReadInput { job, offset: 0, .. }) = inv.poll_action() else {
            panic!("the first chunk is asked for")
        };
        let Some(Action::ReadInput { offset: 4, .. }) = inv.poll_action() else {
            panic!("the second chunk is asked for")
        };
        inv.handle_request(7, invoke(LambdaRef::Native("checksum".into()), 0, 16));
        grant(&mut inv);
        inv.input_refused(job, "registering 4 B would pass the pool's cap");
        let acts = actions(&mut inv);
        assert!(
            !acts.iter().any(|a| matches!(a, Action::ReadInput { .. })),
            "no chunk asked for after the refusal: {acts:?}"
        );
        assert!(
            !acts.iter().any(failed(6, FailureKind::Busy)),
            "answered while a READ of the client's input is still posted: {acts:?}"
        );
        // The posted chunk comes back: now the answer, and the job is gone.
        inv.handle_input(job, 0, &[1, 2, 3, 4]);
        let acts = actions(&mut inv);
        match &acts[..] {
            [Action::Reply {
                tag: 6,
                response: LambdaResponse::Failed(f),
            }] => {
                assert_eq!(f.kind, FailureKind::Busy);
                assert!(
                    f.message.contains("no memory for the input"),
                    "{}",
                    f.message
                );
                assert!(f.message.contains("pool's cap"), "{}", f.message);
            }
            other => panic!("one Busy answer expected: {other:?}"),
        }
        assert_eq!(inv.jobs(), 1, "the other request's job goes on");
        inv.handle_input(job, 4, &[5, 6, 7, 8]);
        assert!(
            actions(&mut inv).is_empty(),
            "a stray chunk changes nothing"
        );
    }

    #[test]
    fn an_input_refused_with_nothing_posted_is_answered_at_once() {
        let mut inv = Inv::new(config());
        inv.handle_request(2, invoke(LambdaRef::Native("checksum".into()), 8, 16));
        grant(&mut inv);
        let Some(Action::ReadInput { job, .. }) = inv.poll_action() else {
            panic!()
        };
        inv.input_refused(job, "the pool is at its cap");
        let acts = actions(&mut inv);
        assert!(acts.iter().any(failed(2, FailureKind::Busy)), "{acts:?}");
        assert_eq!(acts.len(), 1, "{acts:?}");
        assert_eq!(inv.jobs(), 0);
    }

    #[test]
    fn failures_are_answered_and_free_the_job() {
        let mut inv = Inv::new(config());
        inv.handle_request(1, invoke(LambdaRef::Module(hash()), 0, 16));
        grant(&mut inv);
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
        grant(&mut inv);
        let Some(Action::Run { job, .. }) = inv.poll_action() else {
            panic!()
        };
        inv.handle_outcome(job, Outcome::Ran(Ok(vec![0; 5])));
        let acts = actions(&mut inv);
        assert!(failed(2, FailureKind::OutputTooLarge)(&acts[0]), "{acts:?}");

        inv.handle_request(3, LambdaRequest::Upload { module: vec![0] });
        let Some(Action::Load { job, .. }) = inv.poll_action() else {
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
        let mut inv = Inv::new(config());
        inv.handle_request(1, invoke(LambdaRef::Native("n".into()), 5000, 16));
        grant(&mut inv);
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
        let mut inv = Inv::new(cfg);
        inv.handle_request(1, invoke(LambdaRef::Native("n".into()), 11, 16));
        grant(&mut inv);
        assert!(failed(1, FailureKind::InputTooLarge)(
            &inv.poll_action().unwrap()
        ));
    }

    #[test]
    fn a_connection_has_a_bounded_number_of_jobs() {
        let mut inv = Inv::new(config());
        for tag in 1..=3 {
            inv.handle_request(tag, invoke(LambdaRef::Native("n".into()), 1, 16));
            grant(&mut inv);
        }
        let acts = actions(&mut inv);
        assert!(matches!(acts[0], Action::ReadInput { .. }));
        assert!(matches!(acts[1], Action::ReadInput { .. }));
        assert!(failed(3, FailureKind::Busy)(&acts[2]), "{acts:?}");
        assert_eq!(inv.jobs(), 2);
    }

    /// Issue 45: the input is allocated and READ only once the service granted a job slot
    /// and the heap budget counted the input and the output.
    #[test]
    fn the_slot_then_the_heap_budget_then_the_input() {
        let mut inv = Inv::new(config());
        inv.handle_request(5, invoke(LambdaRef::Native("n".into()), 100, 64));
        let acts = actions(&mut inv);
        let [Action::Start {
            job,
            work: Work::Native(ref name),
            ..
        }] = acts[..]
        else {
            panic!("a slot is asked for first, nothing read: {acts:?}");
        };
        assert_eq!(name, "n");
        assert!(
            matches!(inv.jobs[job].stage, Stage::Starting { .. }),
            "no input buffer before the slot: {:?}",
            inv.jobs[job].stage
        );
        inv.handle_started(job, Ok(Slot));
        assert_eq!(
            actions(&mut inv),
            [Action::Hold { job, len: 100 + 64 }],
            "then the input and the output are counted, still nothing read"
        );
        assert!(matches!(inv.jobs[job].stage, Stage::Holding { .. }));
        inv.handle_held(job, Ok(164));
        let acts = actions(&mut inv);
        assert!(
            matches!(acts[..], [Action::ReadInput { job: j, offset: 0, len: 100, .. }] if j == job),
            "only now the READ: {acts:?}"
        );
        inv.handle_input(job, 0, &[1; 100]);
        let acts = actions(&mut inv);
        assert!(
            matches!(&acts[..], [Action::Run { job: j, input, slot: Slot, .. }]
                if *j == job && input.len() == 100),
            "the run takes the slot with it: {acts:?}"
        );
    }

    #[test]
    fn without_a_slot_the_job_is_refused_and_nothing_is_read() {
        let mut inv = Inv::new(config());
        inv.handle_request(2, invoke(LambdaRef::Native("n".into()), 100, 64));
        let Some(Action::Start { job, .. }) = inv.poll_action() else {
            panic!("a slot is asked for");
        };
        inv.handle_started(job, Err(LambdaError::Busy { limit: 8 }));
        let acts = actions(&mut inv);
        assert!(
            matches!(&acts[..], [a] if failed(2, FailureKind::Busy)(a)),
            "{acts:?}"
        );
        assert_eq!(inv.jobs(), 0);
    }

    /// Past the server's heap budget the job is refused with its own kind, its slot given
    /// back (dropped with the job), and the connection's next request goes on.
    #[test]
    fn past_the_heap_budget_the_job_is_refused_as_heap_full() {
        let mut inv = Inv::new(config());
        inv.handle_request(3, invoke(LambdaRef::Native("n".into()), 4000, 16));
        let Some(Action::Start { job, .. }) = inv.poll_action() else {
            panic!("a slot is asked for");
        };
        inv.handle_started(job, Ok(Slot));
        let Some(Action::Hold { len, .. }) = inv.poll_action() else {
            panic!("the bytes are counted");
        };
        inv.handle_held(
            job,
            Err(HeapError::Full {
                len,
                in_use: 1000,
                limit: 4096,
            }),
        );
        let acts = actions(&mut inv);
        match &acts[..] {
            [Action::Reply {
                tag: 3,
                response: LambdaResponse::Failed(f),
            }] => {
                assert_eq!(f.kind, FailureKind::HeapFull);
                assert!(f.message.contains("heap budget is full"), "{}", f.message);
            }
            other => panic!("one HeapFull answer and no READ expected: {other:?}"),
        }
        assert_eq!(inv.jobs(), 0);
        inv.handle_request(4, invoke(LambdaRef::Native("n".into()), 10, 16));
        grant(&mut inv);
        assert!(
            matches!(inv.poll_action(), Some(Action::ReadInput { len: 10, .. })),
            "the next request goes on"
        );
    }

    /// The bytes stay counted while the input is read, while the lambda runs and until
    /// its output is written.
    #[test]
    fn held_bytes_last_until_the_output_is_written() {
        let counted = std::rc::Rc::new(());
        let mut inv = Invocations::<Slot, std::rc::Rc<()>>::new(config());
        inv.handle_request(1, invoke(LambdaRef::Native("n".into()), 8, 16));
        let Some(Action::Start { job, .. }) = inv.poll_action() else {
            panic!()
        };
        inv.handle_started(job, Ok(Slot));
        assert!(matches!(inv.poll_action(), Some(Action::Hold { .. })));
        inv.handle_held(job, Ok(std::rc::Rc::clone(&counted)));
        assert!(matches!(inv.poll_action(), Some(Action::ReadInput { .. })));
        inv.handle_input(job, 0, &[0; 8]);
        assert!(matches!(inv.poll_action(), Some(Action::Run { .. })));
        assert_eq!(std::rc::Rc::strong_count(&counted), 2, "held while it runs");
        inv.handle_outcome(job, Outcome::Ran(Ok(vec![1; 4])));
        assert!(matches!(
            inv.poll_action(),
            Some(Action::WriteOutput { .. })
        ));
        assert_eq!(
            std::rc::Rc::strong_count(&counted),
            2,
            "held while it is written"
        );
        inv.handle_written(job);
        assert_eq!(std::rc::Rc::strong_count(&counted), 1, "given back");
    }

    #[test]
    fn an_upload_without_room_to_hash_is_answered_busy() {
        let mut inv = Inv::new(config());
        inv.handle_request(9, LambdaRequest::Upload { module: vec![0] });
        let Some(Action::Load { job, .. }) = inv.poll_action() else {
            panic!()
        };
        inv.handle_busy(job, "no room to hash the module");
        let acts = actions(&mut inv);
        assert!(
            matches!(&acts[..], [a] if failed(9, FailureKind::Busy)(a)),
            "{acts:?}"
        );
        assert_eq!(inv.jobs(), 0);
    }

    #[test]
    fn stray_events_are_ignored() {
        let mut inv = Inv::new(config());
        inv.handle_input(7, 0, &[1]);
        inv.handle_written(7);
        inv.handle_outcome(7, Outcome::Ran(Ok(vec![1])));
        assert_eq!(inv.poll_action(), None);
    }
}
