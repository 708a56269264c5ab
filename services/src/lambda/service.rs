//! The `lambda` service: shared by every connection, it hands each one a session and
//! bounds the job threads they start together.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rdmactor::runtime::{MachineSession, PeerInfo, Service, ServiceChunks, Session};
use rdmactor::transport::Transport;

use super::config::LambdaConfig;
use super::line::Tenant;
use super::native::NativeLambdas;
use super::owner::{ClientHold, Contains, LambdaOwner, LambdaStats, Stats};
use super::sandbox::{ClientId, ModuleHash, Sandbox};
use super::session::Invocations;
use super::session::LambdaSession;
use rdmactor::shared::Owner;

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
/// # Shared state has one owner
///
/// The module cache (uploads held per client within quotas, released when the
/// connection closes) and the job slots belong to one actor per service
/// (`LambdaOwner`). A session asks it once per request, before the job starts: an
/// upload is held at once if cached, or gets a job slot to compile on (and is then
/// inserted); an invocation gets its compiled module and a job slot in one answer. The
/// input's READs, the guest's run and the output's WRITE never go through it.
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
    /// Owns the service's module cache and job slots.
    owner: Owner<LambdaOwner>,
    /// The next connection's client id in the cache (0 is the application's).
    next_client: AtomicU64,
    /// The inputs' READs in flight across the service's connections.
    reads: Arc<ServiceChunks>,
}

impl fmt::Debug for LambdaService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LambdaService")
            .field("config", &self.config)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl LambdaService {
    /// Runs modules in `sandbox` and native lambdas from `natives` (both may be shared
    /// with the application), within `config`. Modules clients upload are compiled by
    /// `sandbox` and kept in the service's own cache, within the sandbox's bounds and
    /// per-client quotas ([`SandboxConfig`](super::SandboxConfig)); the application's
    /// own [`Sandbox::load`]s are not in it.
    pub fn new(sandbox: Arc<Sandbox>, natives: Arc<NativeLambdas>, config: LambdaConfig) -> Self {
        LambdaService {
            sandbox,
            natives,
            config,
            owner: Owner::new(),
            next_client: AtomicU64::new(1),
            reads: ServiceChunks::new(config.max_reads_in_flight),
        }
    }

    /// A view of the service's module cache and job slots, usable before the first
    /// connection (it answers once the service's actor runs).
    pub fn cache(&self) -> LambdaCache {
        LambdaCache(self.owner.clone())
    }
}

impl<T: Transport> Service<T> for LambdaService {
    /// An upload carries the module: up to the sandbox's module limit, plus room for
    /// the request around it.
    fn max_message(&self) -> Option<usize> {
        Some(self.sandbox.config().max_module_bytes + crate::CONTROL_MESSAGE_MAX)
    }

    fn session(&self, peer: &PeerInfo) -> Box<dyn Session<T>> {
        let owner = self
            .owner
            .get_or_start(|| LambdaOwner::new(self.sandbox.clone(), &self.config));
        let client = ClientId(self.next_client.fetch_add(1, Ordering::Relaxed));
        // Turns in the job line follow who the client is: its identity, else its host.
        let tenant = match (peer.identity.name(), peer.addr) {
            (Some(name), _) => Tenant::Identity(name.to_owned()),
            (None, Some(addr)) => Tenant::Address(addr.ip()),
            (None, None) => Tenant::Connection(client),
        };
        let driver = LambdaSession::new(
            self.sandbox.clone(),
            self.natives.clone(),
            ClientHold::new(client, owner.clone()),
            tenant,
            owner,
            self.config.max_jobs,
            self.reads.clone(),
        );
        Box::new(MachineSession::new(Invocations::new(self.config), driver))
    }
}

/// What a lambda service's cache and job slots hold now, asked of its actor (see
/// [`LambdaService::cache`]).
#[derive(Debug, Clone)]
pub struct LambdaCache(Owner<LambdaOwner>);

impl LambdaCache {
    /// The cache's module count and the running jobs; `None` before the first
    /// connection or once the service's actor stopped.
    pub async fn stats(&self) -> Option<LambdaStats> {
        self.0.get()?.send(Stats).await.ok()
    }

    /// Modules in the service's cache (0 before the first connection).
    pub async fn cached_modules(&self) -> usize {
        self.stats().await.map_or(0, |s| s.cached_modules)
    }

    /// `true` if a module with this hash is in the service's cache.
    pub async fn contains(&self, hash: &ModuleHash) -> bool {
        match self.0.get() {
            Some(owner) => owner.send(Contains(*hash)).await.unwrap_or(false),
            None => false,
        }
    }
}
