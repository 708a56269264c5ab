//! The server: listeners, registered services, admission limits; a handle to read
//! counters and to shut down cleanly.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;

use actix::prelude::*;

use super::auth::{AuthSetup, IdentityCounts, KeySet, Keys, KeysError, DEFAULT_AUTH_TIMEOUT};
use super::budget::QpBudget;
use super::cm::{CmActor, GetCounters, GetPd, Services};
use super::cm_auth::ReloadKeys;
use super::config::NodeConfig;
use super::handler::{HandlerService, RequestHandler};
use super::node::Node;
use super::oob::{GetOobStats, OobListener, OobPort, OobStats};
use super::recovery::{OobLink, Relisten};
use super::service::{Framing, Service};
use crate::memory::PoolStats;
use crate::transport::{CmId, Domain, Transport, Verbs};
use crate::verbs::VerbsError;

/// The connections one peer address may hold by default
/// ([`ServerBuilder::max_connections_per_peer`]).
///
/// A small fixed number, not a share of `max_connections`: a share (it was half) lets
/// two addresses take every slot, and a host has as many addresses as it likes to
/// configure. 64 is more than any one client of the tools and services here opens
/// (`client --connections 16`, a service's pool of a few), so only a host that floods
/// meets it; a server whose clients all share one address (a NAT, a benchmark) raises
/// it or lifts it with 0.
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: usize = 64;

/// Builds a [`Server`] over the transport `T`: [`Server::builder`] for verbs,
/// [`Server::over`] for another (`Server::over(Loopback)`).
pub struct ServerBuilder<T: Transport = Verbs> {
    config: NodeConfig,
    /// The device to serve on, if the caller opened it (else the configured one).
    domain: Option<T::Domain>,
    listeners: Vec<(SocketAddr, Option<String>)>,
    services: HashMap<String, Arc<dyn Service<T>>>,
    max_connections: usize,
    max_per_peer: Option<usize>,
    oob: Vec<OobStarter<T>>,
    /// The authorized keys, when the server authenticates.
    keys: Option<Keys>,
    /// Services that take anonymous clients although keys are configured.
    anonymous: HashSet<String>,
    auth_timeout: std::time::Duration,
}

/// Starts one out-of-band port on the node (verbs only: see [`ServerBuilder::oob`]).
type OobStarter<T> =
    Box<dyn FnOnce(&Arc<Node<T>>, &Services<T>, &QpBudget) -> Result<StartedOob<T>, ServerError>>;

/// An out-of-band port started.
struct StartedOob<T: Transport> {
    listener: Addr<OobListener>,
    bound: SocketAddr,
    thread: actix::Arbiter,
    link: OobLink<T>,
}

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// Opening the device, binding or listening failed.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// The same, on a transport other than verbs.
    #[error("transport: {0}")]
    Transport(Box<dyn std::error::Error + Send + Sync>),
    /// The listeners or services are inconsistent (a default service not registered,
    /// an out-of-band port that cannot be set up).
    #[error("configuration: {0}")]
    Config(String),
    /// The node's configuration is inconsistent ([`NodeConfig::validate`]).
    #[error("configuration: {0}")]
    Invalid(#[from] super::ConfigError),
    /// [`ServerBuilder::run`] could not listen for SIGINT and SIGTERM.
    #[error("cannot listen for SIGINT and SIGTERM: {0}")]
    Signals(std::io::Error),
}

impl ServerError {
    /// A transport's error: verbs errors keep their own variant, so that callers can
    /// match on them.
    fn transport<E: std::error::Error + Send + Sync + 'static>(e: E) -> ServerError {
        super::verbs_or_boxed(e).map_or_else(ServerError::Transport, ServerError::Verbs)
    }
}

impl<T: Transport> Default for ServerBuilder<T> {
    fn default() -> Self {
        ServerBuilder {
            config: NodeConfig::default(),
            domain: None,
            listeners: Vec::new(),
            services: HashMap::new(),
            max_connections: 1024,
            max_per_peer: None,
            oob: Vec::new(),
            keys: None,
            anonymous: HashSet::new(),
            auth_timeout: DEFAULT_AUTH_TIMEOUT,
        }
    }
}

impl<T: Transport> ServerBuilder<T> {
    /// Registers a [`RequestHandler`] under `name`, with the default limits of
    /// [`HandlerService::new`] (to set them, register a `HandlerService` with
    /// [`service`](Self::service)).
    pub fn handler(self, name: &str, handler: impl RequestHandler) -> Self {
        self.service(name, HandlerService::new(handler))
    }

    /// Serves until the process gets SIGINT or SIGTERM, then shuts down cleanly (every
    /// client disconnected, everything released), for a program that does not otherwise
    /// use actix: builds an actix `System` on the calling thread, starts the server in it
    /// and blocks. The CM actor, and owner actors started from `Service::session`, run
    /// on this thread. Inside a `System` of your own, use [`start`](Self::start) and
    /// [`Server::shutdown`] instead.
    pub fn run(self) -> Result<(), ServerError> {
        actix::System::new().block_on(async move {
            let server = self.start()?;
            let signal = wait_for_signal().await;
            tracing::info!("{}: shutting down", signal.as_deref().unwrap_or("signal"));
            server.shutdown().await;
            signal.map(drop)
        })
    }

    /// Device, pollers, pool and queue sizes.
    pub fn config(mut self, config: NodeConfig) -> Self {
        self.config = config;
        self
    }

    /// Serves on `domain`, a device the caller opened (a loopback device of a test's
    /// own [`Fabric`](crate::transport::loopback::Fabric), say), rather than opening the
    /// configured one. A server that loses it serves again on a device of the same name.
    pub fn domain(mut self, domain: T::Domain) -> Self {
        self.domain = Some(domain);
        self
    }

    /// Listens on `addr` (port 0 picks one). Clients that send no rdmactor hello (rping,
    /// plain rdma_cm programs) reach `default_service`; without one they are rejected.
    pub fn listen(mut self, addr: SocketAddr, default_service: Option<&str>) -> Self {
        self.listeners
            .push((addr, default_service.map(str::to_owned)));
        self
    }

    /// Registers `service` under `name`.
    pub fn service(mut self, name: &str, service: impl Service<T>) -> Self {
        self.services.insert(name.to_owned(), Arc::new(service));
        self
    }

    /// Authenticates clients against `keys` ([`Keys::load`] reads an authorized keys
    /// file): every service becomes authenticated-only (its sessions see the client's
    /// [`Identity`](super::Identity)), except those marked [`anonymous`](Self::anonymous).
    /// Without keys every client is anonymous, and the server says so once at start.
    pub fn authorized_keys(mut self, keys: Keys) -> Self {
        self.keys = Some(keys);
        self
    }

    /// Lets anonymous clients use `service` although keys are configured: what a
    /// service for stock rdma-core tools (rping, `ibv_*_pingpong`) needs, as they cannot
    /// authenticate. A raw service must be marked so on a server with keys.
    pub fn anonymous(mut self, service: &str) -> Self {
        self.anonymous.insert(service.to_owned());
        self
    }

    /// Time a client of an authenticated-only service has, from its accept, to prove
    /// its identity (default [`DEFAULT_AUTH_TIMEOUT`], 10 s); then it is closed with the
    /// reason and its address charged a failure.
    pub fn auth_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.auth_timeout = timeout;
        self
    }

    /// Connections (QPs) served at once, rdma_cm clients and out-of-band ones together;
    /// more are rejected with `ServerFull` (an out-of-band client, whose QPs are taken
    /// all or none, is refused with the same reason).
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n;
        self
    }

    /// Connections one peer address may hold at once; more from it are rejected with
    /// `ServerFull` and a reason naming this limit, while other peers still get in. 0
    /// lifts the limit (a test or a benchmark whose clients all share one address).
    /// With [authorized keys](Self::authorized_keys), an address's count holds its
    /// anonymous connections and those still proving who they are: a proved connection
    /// counts against its identity instead, which may hold as many (more are refused
    /// "authentication refused: identity already holds N connections").
    /// Default: [`DEFAULT_MAX_CONNECTIONS_PER_PEER`] (64). Below
    /// [`max_connections`](Self::max_connections) it changes nothing: the server's own
    /// limit refuses first.
    pub fn max_connections_per_peer(mut self, n: usize) -> Self {
        self.max_per_peer = Some(n);
        self
    }

    /// The per-peer limit in force (see
    /// [`max_connections_per_peer`](Self::max_connections_per_peer)).
    fn per_peer_limit(&self) -> usize {
        self.max_per_peer
            .unwrap_or(DEFAULT_MAX_CONNECTIONS_PER_PEER)
    }

    /// Opens the device, binds every listener and starts the actors. Must be called
    /// inside an actix `System`.
    pub fn start(mut self) -> Result<Server<T>, ServerError> {
        self.config.validate()?;
        for (addr, default) in &self.listeners {
            if let Some(name) = default {
                if !self.services.contains_key(name) {
                    return Err(ServerError::Config(format!(
                        "default service {name:?} of {addr} is not registered"
                    )));
                }
            }
        }
        let auth = self.auth_setup()?;
        let config = self.config.clone();
        let per_peer = self.per_peer_limit();
        let budget = QpBudget::new(self.max_connections);
        let node = match self.domain {
            Some(domain) => Node::<T>::start_on(domain, self.config),
            None => Node::<T>::start(self.config),
        }
        .map_err(ServerError::transport)?;
        let services: Services<T> = Arc::new(self.services);
        let mut oob = Vec::new();
        let mut oob_threads = Vec::new();
        let mut links = Vec::new();
        for start in self.oob {
            let started = start(&node, &services, &budget)?;
            oob.push((started.listener, started.bound));
            oob_threads.push(started.thread);
            links.push(started.link);
        }
        let channel = node
            .pd
            .create_event_channel()
            .map_err(ServerError::transport)?;
        let mut cm = CmActor::new(node.clone(), channel.clone(), services, budget, per_peer);
        // Every service not marked anonymous in `auth` is authenticated-only.
        cm.door = super::auth::Door::new(auth);
        let mut addrs = Vec::new();
        let mut relisten = Vec::new();
        for (addr, default) in self.listeners {
            let listen = || -> Result<T::CmId, T::Error> {
                let id = node.pd.create_id(&channel)?;
                id.bind(addr)?;
                id.listen(1024)?;
                Ok(id)
            };
            let id = listen().map_err(ServerError::transport)?;
            let bound = id.local_addr().unwrap_or(addr);
            tracing::info!(addr = %bound, default_service = ?default, "listening");
            addrs.push(bound);
            relisten.push((bound, default.clone()));
            cm.add_listener(id, default);
        }
        // From here the CM actor is the node's only long-lived owner.
        drop(node);
        cm.serve_again(Relisten {
            config,
            listeners: relisten,
            oob: links,
        });
        let cm = cm.start();
        Ok(Server {
            cm,
            addrs,
            oob,
            oob_threads,
        })
    }
}

impl<T: Transport> ServerBuilder<T> {
    /// The authentication settings, checked: a raw service cannot carry a proof, so on
    /// a server with keys it must be marked anonymous, and a service marked anonymous
    /// must exist (a typo would leave the real one authenticated-only, or the other way).
    fn auth_setup(&mut self) -> Result<Option<AuthSetup>, ServerError> {
        for name in &self.anonymous {
            if !self.services.contains_key(name) {
                return Err(ServerError::Config(format!(
                    "service {name:?} marked anonymous is not registered"
                )));
            }
        }
        let Some(keys) = self.keys.take() else {
            tracing::warn!(
                "no authorized keys configured: every client is anonymous, and every service open to anyone who reaches the port"
            );
            return Ok(None);
        };
        for (name, service) in &self.services {
            if matches!(service.framing(), Framing::Raw { .. }) && !self.anonymous.contains(name) {
                return Err(ServerError::Config(format!(
                    "raw service {name:?} cannot authenticate its clients: mark it anonymous"
                )));
            }
        }
        let identities = keys.current().len();
        tracing::info!(identities, anonymous = ?self.anonymous, "authenticating clients");
        Ok(Some(AuthSetup {
            keys: Arc::new(keys),
            anonymous: std::mem::take(&mut self.anonymous),
            timeout: self.auth_timeout,
            identities: Arc::new(IdentityCounts::new(self.per_peer_limit())),
        }))
    }
}

impl ServerBuilder<Verbs> {
    /// Also listens for `ibv_*_pingpong`-style clients on a TCP port (QPs brought up out
    /// of band, see [`OobPort`]); their QPs run `port.service`, which must be raw. Verbs
    /// only: the QPs are brought up by hand, through libibverbs.
    pub fn oob(mut self, port: OobPort) -> Self {
        self.oob.push(Box::new(move |node, services, budget| {
            start_oob(node, services, budget, port)
        }));
        self
    }
}

/// Checks `port`'s service and starts its listener on a thread of its own.
fn start_oob(
    node: &Arc<Node>,
    services: &Services,
    budget: &QpBudget,
    port: OobPort,
) -> Result<StartedOob<Verbs>, ServerError> {
    let service = match services.get(&port.service) {
        None => {
            return Err(ServerError::Config(format!(
                "service {:?} of out-of-band port {} is not registered",
                port.service, port.addr
            )))
        }
        Some(s) if matches!(s.framing(), Framing::Framed) => {
            return Err(ServerError::Config(format!(
                "service {:?} of out-of-band port {} is framed; it needs a raw one",
                port.service, port.addr
            )))
        }
        Some(s) => s.clone(),
    };
    let (listener, bound) = OobListener::bind(node.clone(), port.clone(), service, budget.clone())
        .map_err(|e| ServerError::Config(format!("out-of-band port {}: {e}", port.addr)))?;
    tracing::info!(addr = %bound, transport = %port.transport, service = %port.service, "listening out of band");
    // Its own thread: bringing a client's QPs up (up to 255 of them, address handles
    // that may wait on neighbour resolution) blocks in the kernel, and on the CM actor's
    // thread it would hold up every accept and teardown. One thread per port also
    // bounds bring-ups to one at a time per port.
    let thread = actix::Arbiter::new();
    let listener = OobListener::start_in_arbiter(&thread.handle(), move |_| listener);
    Ok(StartedOob {
        link: OobLink {
            gone: listener.clone().recipient(),
            back: listener.clone().recipient(),
        },
        listener,
        bound,
        thread,
    })
}

/// A running server.
///
/// When its RDMA device goes (`rdma link delete`, hot unplug, a device failure) the
/// server stays up: every connection closes with
/// [`CloseReason::DeviceLost`](super::CloseReason::DeviceLost), the listeners go,
/// everything opened on the device is released so that the kernel can finish the
/// removal, and once the device is back the server listens again on the same addresses
/// ([`ServerStats::device_present`] says which it is).
pub struct Server<T: Transport = Verbs> {
    cm: Addr<CmActor<T>>,
    addrs: Vec<SocketAddr>,
    oob: Vec<(Addr<OobListener>, SocketAddr)>,
    /// The threads the out-of-band listeners run on, stopped at shutdown.
    oob_threads: Vec<actix::Arbiter>,
}

/// A snapshot of a server's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections open now.
    pub connections: usize,
    /// QPs held under `max_connections` now: the rdma_cm connections and every
    /// out-of-band client's QPs.
    pub qps: usize,
    /// Connections accepted since start.
    pub accepted: u64,
    /// Connect requests rejected since start.
    pub rejected: u64,
    /// Connections closed and released since start.
    pub closed: u64,
    /// Whether the RDMA device serves now (false after it went, until it is back and the
    /// server listens again; the device's counters below are zero meanwhile).
    pub device_present: bool,
    /// Times the device went (removed or failed) since start.
    pub device_losses: u64,
    /// Open connections whose client proved an identity.
    pub authenticated: usize,
    /// Registered memory.
    pub pool: PoolStats,
    /// CQs the pollers own.
    pub cqs: usize,
    /// Members of each shared receive queue of framed connections (one entry per queue).
    pub shared_queues: Vec<u32>,
    /// Receive buffers (pool leases of `recv_size`) the shared queues hold, members or
    /// not: empty queues up to `SharedRecvConfig::keep_empty` are kept for the next
    /// connections.
    pub shared_recv_buffers: usize,
    /// Receives posted in each shared queue now (one entry per queue, as
    /// `shared_queues`): the queue's depth, less the buffers consumed and not yet
    /// reposted. Counted, not computed: a buffer that never comes back shows here.
    pub shared_receives_posted: Vec<usize>,
    /// Each shared queue's credit reserve (as `shared_queues`): free now, its low-water
    /// mark, and the most one peer address held.
    pub shared_reserves: Vec<super::ReserveStats>,
}

impl Server {
    /// A builder of a server on RDMA verbs.
    pub fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }
}

impl<T: Transport> Server<T> {
    /// A builder of a server over `transport` (`Server::over(Loopback)`: in memory, for
    /// one process).
    pub fn over(transport: T) -> ServerBuilder<T> {
        let _ = transport;
        ServerBuilder::default()
    }

    /// The bound listener addresses, in the order given to the builder.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The bound out-of-band TCP addresses, in the order given to the builder.
    pub fn oob_addrs(&self) -> Vec<SocketAddr> {
        self.oob.iter().map(|(_, a)| *a).collect()
    }

    /// Counters of each out-of-band port, in the order given to the builder.
    pub async fn oob_stats(&self) -> Vec<OobStats> {
        let mut out = Vec::with_capacity(self.oob.len());
        for (l, _) in &self.oob {
            out.push(l.send(GetOobStats).await.unwrap_or_default());
        }
        out
    }

    /// The protection domain every connection shares, while the device serves: register
    /// [`SharedRegion`](crate::verbs::SharedRegion)s on it for data all clients read, then
    /// let sessions [`grant`](super::SessionCx::grant) them per connection.
    ///
    /// Whatever is registered on it keeps the device open: if the device goes, the kernel
    /// cannot finish removing it while such objects live. State that must survive a
    /// removal belongs to a service, registered in
    /// [`Service::on_device_up`](super::Service::on_device_up) and dropped in
    /// [`Service::on_device_down`](super::Service::on_device_down).
    pub async fn protection_domain(&self) -> Option<T::Domain> {
        self.cm.send(GetPd::new()).await.ok().flatten()
    }

    /// Current counters.
    pub async fn stats(&self) -> ServerStats {
        let c = self.cm.send(GetCounters).await.unwrap_or_default();
        let node = c.node.unwrap_or_default();
        ServerStats {
            connections: c.connections,
            qps: c.qps,
            accepted: c.accepted,
            rejected: c.rejected,
            closed: c.closed,
            device_present: c.device_present,
            device_losses: c.device_losses,
            authenticated: c.authenticated,
            pool: node.pool,
            cqs: node.cqs,
            shared_queues: node.shared_queues,
            shared_recv_buffers: node.shared_recv_buffers,
            shared_receives_posted: node.shared_receives_posted,
            shared_reserves: node.shared_reserves,
        }
    }

    /// Reads the authorized keys file again and swaps the keys in whole (on an error
    /// the old keys stay and the error says why): connections proved with a key that is
    /// gone close with "key removed"; every other connection goes on. What the server
    /// binary does on SIGHUP. Answers how many connections it closed.
    pub async fn reload_keys(&self) -> Result<usize, KeysError> {
        self.cm
            .send(ReloadKeys(None))
            .await
            .unwrap_or(Err(KeysError::NotAuthenticating))
    }

    /// [`reload_keys`](Self::reload_keys) with keys given in memory.
    pub async fn replace_keys(&self, set: KeySet) -> Result<usize, KeysError> {
        self.cm
            .send(ReloadKeys(Some(set)))
            .await
            .unwrap_or(Err(KeysError::NotAuthenticating))
    }

    /// Stops accepting, disconnects every client, waits until every connection released
    /// its resources, and stops the actors and threads.
    pub async fn shutdown(self) {
        for (l, _) in &self.oob {
            super::conn_set::drain(l).await;
        }
        for thread in self.oob_threads {
            thread.stop();
            // The listener (its TCP socket included) is gone once the thread is.
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        super::cm::shut_down(&self.cm).await;
    }
}

/// Waits for SIGINT or SIGTERM and names the one that came.
async fn wait_for_signal() -> Result<&'static str, ServerError> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt()).map_err(ServerError::Signals)?;
    let mut term = signal(SignalKind::terminate()).map_err(ServerError::Signals)?;
    Ok(tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::loopback::Loopback;

    #[test]
    fn the_per_peer_limit_is_64_by_default_whatever_max_connections_is() {
        let limit = |b: ServerBuilder<Loopback>| b.per_peer_limit();
        assert_eq!(
            limit(Server::over(Loopback)),
            DEFAULT_MAX_CONNECTIONS_PER_PEER
        );
        assert_eq!(limit(Server::over(Loopback).max_connections(10_000)), 64);
        assert_eq!(limit(Server::over(Loopback).max_connections(2)), 64);
        let set = Server::over(Loopback)
            .max_connections(10_000)
            .max_connections_per_peer(5);
        assert_eq!(limit(set), 5);
        assert_eq!(limit(Server::over(Loopback).max_connections_per_peer(0)), 0);
    }
}
