//! The `lambda` service: shared by every connection, it hands each one a session and
//! bounds the job threads they start together.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rdmactor::runtime::{PeerInfo, Service, Session};

use super::config::LambdaConfig;
use super::job::Invocations;
use super::native::NativeLambdas;
use super::sandbox::{Sandbox, SandboxClient};
use super::session::LambdaSession;

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
///                                                    RDMA READ input[..input_len] (1 MiB chunks)
///                                                    run (on a job thread, limits capped)
///                                                    RDMA WRITE output[..len]
///                   ◄───────────────── Done{len} | Failed{kind, message}
/// ```
///
/// `input` is a region the client registered with `REMOTE_READ`, `output` one with
/// `REMOTE_WRITE`; the server touches nothing else, and a region without the right
/// access fails the server's READ or WRITE, which closes the connection. The output's
/// length caps the lambda's output ([`Limits::max_output`](super::Limits::max_output)); client-requested limits are
/// capped field by field by the server's [`LambdaConfig::cap`](super::LambdaConfig::cap).
///
/// # Work happens off the connection's actor
///
/// Loading (compiling) and running go to a thread of their own, so a slow or hostile
/// lambda never stalls the other connections of a poller.
/// The thread hands its outcome over a channel and wakes the session
/// (`SessionCx::waker`, answered by `Session::on_wake` on the connection's actor), which
/// goes on with the job at once: WRITE the output, answer. The client just awaits its
/// reply. (Not `SessionCx::spawn_blocking`: jobs count against
/// [`LambdaConfig::max_jobs`](super::LambdaConfig::max_jobs), and a long compilation or run must not hold a thread of
/// the shared blocking pool.)
///
/// # Errors
///
/// Every failure comes back as `Failed` with a [`FailureKind`](super::FailureKind) (one per
/// [`LambdaError`](super::LambdaError) variant, plus the service's own) and a readable message; none closes
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
    /// An upload carries the module: up to the sandbox's module limit, plus room for
    /// the request around it.
    fn max_message(&self) -> Option<usize> {
        Some(self.sandbox.config().max_module_bytes + crate::CONTROL_MESSAGE_MAX)
    }

    fn session(&self, _peer: &PeerInfo) -> Box<dyn Session> {
        Box::new(LambdaSession::new(
            Invocations::new(self.config),
            Arc::new(SandboxClient::new(self.sandbox.clone())),
            self.natives.clone(),
            JobSlots {
                running: self.running.clone(),
                max: self.config.max_jobs,
            },
        ))
    }
}

/// The service's [`LambdaConfig::max_jobs`](super::LambdaConfig::max_jobs) job threads, counted across its sessions.
#[derive(Debug, Clone)]
pub(super) struct JobSlots {
    running: Arc<AtomicUsize>,
    max: usize,
}

impl JobSlots {
    /// The configured limit.
    pub(super) fn max(&self) -> usize {
        self.max
    }

    /// A free slot, or `None` when all are taken.
    pub(super) fn claim(&self) -> Option<JobSlot> {
        self.running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| JobSlot(self.running.clone()))
    }
}

/// One of [`LambdaConfig::max_jobs`](super::LambdaConfig::max_jobs), released when the job's thread ends.
pub(super) struct JobSlot(Arc<AtomicUsize>);

impl Drop for JobSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
