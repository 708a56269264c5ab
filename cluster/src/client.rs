//! Connecting through the registry: pick a node, connect, and on failure the next.
//!
//! # Dead nodes: the dial bound and suspicion
//!
//! A node whose host died stays listed until its lease lapses, and rdma_cm does not say
//! that a host is gone: it resends the connect request 15 times, each after about
//! 4.6 s (a minute in all), before it reports UNREACHABLE. So each connect to a node has
//! a bound of its own, the dial bound ([`DEFAULT_DIAL_TIMEOUT`], 5 s;
//! [`ClusterClient::with_dial_timeout`]): past it the connect is dropped (the rdmactor
//! client then destroys its cm_id and QP) and the next node is tried.
//!
//! A node that did not answer within the bound (or was unreachable, or had nothing
//! listening: [`Connector::not_serving`]) is then suspect for a while
//! ([`DEFAULT_SUSPICION`], 30 s; [`ClusterClient::with_suspicion`]): every connect of
//! this client tries it after every other node, so only the first connect pays the
//! bound. It is still tried, last, so a wrongly suspected node is not lost. Suspicion
//! ends when the node answers (a connection, or a refusal), when it expires, when the
//! node registers again (a new lease) and when the registry drops it. It is kept per
//! service, as the registry lists nodes per service.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::etcd::EtcdConfig;
use crate::membership::Membership;
use crate::pick::{by_load, by_rendezvous};
use crate::suspects::Suspects;
use crate::{Error, NodeInfo};

/// How long one connect to one node may take before the next node is tried. A live node
/// answers within milliseconds (address and route come from the neighbour table, the
/// reply is one round trip and an accept); a dead one never does, and the kernel CM
/// resends the request for a minute: 15 times, each after its response timeout
/// (4.096 µs × 2^20) plus twice RoCE's packet lifetime (4.096 µs × 2^16), about 4.6 s.
/// 5 s is one such wait and a little more: a live node whose first request was lost
/// may still answer the resend in time, and a dead one costs a twelfth of the minute.
pub const DEFAULT_DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a node that did not answer is tried last: longer than a lease's time to live
/// (5 s by default), so that a dead node leaves the registry before its suspicion ends
/// and no connect of this client waits for it twice.
pub const DEFAULT_SUSPICION: Duration = Duration::from_secs(30);

/// What opens a connection to one node: `rdmactor::runtime::Client` with the
/// `rdmactor` feature, or anything else (a test's fake, another transport).
pub trait Connector {
    /// An open connection.
    type Connection;
    /// Why a connect failed (its text goes into [`ClusterError`]).
    type Error: fmt::Display;
    /// Connects to `service` at `addr`. The future is dropped when the dial bound
    /// passes, and must then release whatever it started (the rdmactor client's does:
    /// the connect's cm_id and QP are destroyed).
    fn connect(
        &self,
        addr: SocketAddr,
        service: &str,
    ) -> impl Future<Output = Result<Self::Connection, Self::Error>>;

    /// Closes a connection the cluster client gives up on (its node is draining, or it
    /// failed). The default drops it, for connections that close on drop.
    fn close(&self, connection: Self::Connection) -> impl Future<Output = ()> {
        drop(connection);
        std::future::ready(())
    }

    /// Whether `error` says nothing serves at the address (no answer, unreachable,
    /// nobody listening), as opposed to a server that answered and refused: such a node
    /// becomes suspect, as one that did not answer within the dial bound does. The
    /// default says no for every error.
    fn not_serving(error: &Self::Error) -> bool {
        let _ = error;
        false
    }
}

/// A borrowed connector: a `ClusterClient<&Client>` leaves the client with its owner.
impl<C: Connector> Connector for &C {
    type Connection = C::Connection;
    type Error = C::Error;
    fn connect(
        &self,
        addr: SocketAddr,
        service: &str,
    ) -> impl Future<Output = Result<Self::Connection, Self::Error>> {
        (**self).connect(addr, service)
    }
    fn close(&self, connection: Self::Connection) -> impl Future<Output = ()> {
        (**self).close(connection)
    }
    fn not_serving(error: &Self::Error) -> bool {
        C::not_serving(error)
    }
}

#[cfg(feature = "rdmactor")]
impl Connector for rdmactor::runtime::Client {
    type Connection = rdmactor::runtime::ClientConnection;
    type Error = rdmactor::runtime::ConnectError;
    fn connect(
        &self,
        addr: SocketAddr,
        service: &str,
    ) -> impl Future<Output = Result<Self::Connection, Self::Error>> {
        rdmactor::runtime::Client::connect(self, addr, service)
    }
    /// An rdmactor connection lives until closed (its actor holds it), not until dropped.
    fn close(&self, connection: Self::Connection) -> impl Future<Output = ()> {
        connection.close()
    }
    /// rdma_cm's own failures (UNREACHABLE, ADDR_ERROR, ...) and a transport's reject
    /// (on a host that lives, no server listens): an rdmactor server refuses with a
    /// reason of its own.
    fn not_serving(error: &Self::Error) -> bool {
        matches!(
            error,
            rdmactor::runtime::ConnectError::Failed { .. }
                | rdmactor::runtime::ConnectError::RejectedByTransport(_)
        )
    }
}

/// How to choose among the nodes of a service.
#[derive(Debug, Clone, Copy)]
pub enum Placement<'a> {
    /// The least loaded first (reported connections, plus those this client opened
    /// since the node's last report; then pool use).
    LeastLoaded,
    /// Rendezvous hashing of the key: the same node for the same key on every client,
    /// while that node lives.
    Key(&'a [u8]),
}

/// One connect that failed, naming the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The node's id.
    pub node: String,
    /// Its address.
    pub addr: SocketAddr,
    /// Why.
    pub reason: String,
}

impl fmt::Display for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {} ({}): {}", self.node, self.addr, self.reason)
    }
}

/// Why [`ClusterClient::connect`] found no connection.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// No node serves the service (after waiting for the registry to answer, if it had
    /// not yet); `draining` lists the nodes left out because they are shutting down.
    #[error("cluster {cluster:?}: no live node serves {service:?}{}{}",
        if draining.is_empty() { String::new() } else { format!(" (draining: {})", draining.join(", ")) },
        if *synced { "" } else { " (the registry has not answered yet: is etcd reachable?)" })]
    NoNodes {
        /// The cluster.
        cluster: String,
        /// The service.
        service: String,
        /// Nodes listed but draining.
        draining: Vec<String>,
        /// Whether the list was current.
        synced: bool,
    },
    /// Every node tried refused or failed; each attempt names its node and reason.
    #[error("cluster {cluster:?}, service {service:?}: no node could be connected: {}",
        attempts.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    AllFailed {
        /// The cluster.
        cluster: String,
        /// The service.
        service: String,
        /// Each node tried, in order.
        attempts: Vec<Attempt>,
    },
    /// The registry could not be watched (a bad name, no endpoint).
    #[error(transparent)]
    Registry(#[from] Error),
}

/// A connection, and the node it reached.
#[derive(Debug)]
pub struct Connected<T> {
    /// The connection.
    pub connection: T,
    /// The node (as listed when it was picked).
    pub node: NodeInfo,
    /// Nodes tried before it, and why they failed.
    pub failed: Vec<Attempt>,
}

/// Connects to the services of a cluster through its registry: a watch per service,
/// a node picked per connection, the next node on a refused or failed connect.
///
/// Nodes marked draining are never picked. A connect that fails is reported in the
/// error of the connect, naming the node and the reason; the node stays listed (the
/// registry, through its lease, says whether it is alive; a refused connect may be a
/// full node). A connect to one node that does not end within the dial bound is given
/// up, and the node that did not answer is tried last for a while (see the module
/// docs: a dead node costs one bound, not one per connect). Use it on one thread (the
/// rdmactor client's futures are not `Send`).
#[derive(Debug)]
pub struct ClusterClient<C> {
    connector: C,
    etcd: EtcdConfig,
    cluster: String,
    /// How long a connect waits for the registry's first answer, or for a node.
    discovery_wait: Duration,
    /// Most nodes tried per connect.
    max_attempts: usize,
    watches: Mutex<HashMap<String, Membership>>,
    /// Connections opened to a node since its record (by revision) was written: added
    /// to its reported load, so a burst spreads before the next report.
    opened: Mutex<HashMap<String, (i64, u64)>>,
    /// Varies the tie-break of equally loaded nodes from one connect to the next.
    salt: AtomicU64,
    /// How long one connect to one node may take.
    dial_timeout: Duration,
    /// How long a node that did not answer is tried last.
    suspicion: Duration,
    /// The nodes that did not answer, per service.
    suspects: Mutex<HashMap<String, Suspects>>,
}

impl<C: Connector> ClusterClient<C> {
    /// A client of `cluster`, connecting through `connector`. Waits up to 5 s for the
    /// registry when it has no node yet, tries up to 3 nodes per connect, each for up
    /// to [`DEFAULT_DIAL_TIMEOUT`], and tries a node that did not answer last for
    /// [`DEFAULT_SUSPICION`].
    pub fn new(connector: C, etcd: EtcdConfig, cluster: impl Into<String>) -> ClusterClient<C> {
        ClusterClient {
            connector,
            etcd,
            cluster: cluster.into(),
            discovery_wait: Duration::from_secs(5),
            max_attempts: 3,
            watches: Mutex::new(HashMap::new()),
            opened: Mutex::new(HashMap::new()),
            salt: AtomicU64::new(0),
            dial_timeout: DEFAULT_DIAL_TIMEOUT,
            suspicion: DEFAULT_SUSPICION,
            suspects: Mutex::new(HashMap::new()),
        }
    }

    /// How long one connect to one node may take before the next node is tried (default
    /// [`DEFAULT_DIAL_TIMEOUT`]). Shorter finds a dead node sooner; too short gives up
    /// live nodes that are slow to accept (they are then tried last for a while).
    pub fn with_dial_timeout(mut self, bound: Duration) -> Self {
        self.dial_timeout = bound;
        self
    }

    /// How long a node that did not answer is tried after the others (default
    /// [`DEFAULT_SUSPICION`]), unless it answers first.
    pub fn with_suspicion(mut self, hold: Duration) -> Self {
        self.suspicion = hold;
        self
    }

    /// The nodes of `service` tried last now, because they did not answer (sorted).
    pub fn suspected(&self, service: &str) -> Vec<String> {
        let suspects = self.suspects.lock().expect("suspects lock");
        suspects
            .get(service)
            .map(|s| s.suspected(Instant::now()))
            .unwrap_or_default()
    }

    /// How long a connect waits for a live node to be listed (default 5 s).
    pub fn with_discovery_wait(mut self, wait: Duration) -> Self {
        self.discovery_wait = wait;
        self
    }

    /// Most nodes tried per connect (default 3; at least 1).
    pub fn with_max_attempts(mut self, attempts: usize) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// Most nodes tried per connect, and per request of a session.
    pub(crate) fn max_attempts(&self) -> usize {
        self.max_attempts
    }

    /// The connector (to shut an rdmactor client down, say).
    pub fn connector(&self) -> &C {
        &self.connector
    }

    /// The connector back, the watches stopped.
    pub fn into_connector(self) -> C {
        self.connector
    }

    /// The watch of `service`'s nodes, started on first use. Must be called inside a
    /// tokio runtime.
    ///
    /// # Errors
    ///
    /// A name that breaks the key layout; no etcd endpoint.
    pub fn membership(&self, service: &str) -> Result<Membership, Error> {
        let mut watches = self.watches.lock().expect("watches lock");
        if let Some(m) = watches.get(service) {
            return Ok(m.clone());
        }
        let m = Membership::watch(self.etcd.clone(), &self.cluster, service)?;
        watches.insert(service.to_owned(), m.clone());
        Ok(m)
    }

    /// Connects to `service` on a node chosen by `placement`, trying the next on a
    /// failed, refused or unanswered connect, up to the configured number of attempts.
    ///
    /// # Errors
    ///
    /// [`ClusterError::NoNodes`] when no live node is listed within the discovery wait;
    /// [`ClusterError::AllFailed`] with each node tried and its reason.
    pub async fn connect(
        &self,
        service: &str,
        placement: Placement<'_>,
    ) -> Result<Connected<C::Connection>, ClusterError> {
        self.connect_avoiding(service, placement, &[]).await
    }

    /// [`connect`](Self::connect), opening each connection with `dial(addr)` instead of
    /// the connector (same bound, same suspicion, same errors): for connections the
    /// connector does not make, such as the rdmactor client's `connect_session` with a
    /// session of the caller's. `dial` is called once per node tried.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect).
    pub async fn connect_with<T, F, Fut>(
        &self,
        service: &str,
        placement: Placement<'_>,
        dial: F,
    ) -> Result<Connected<T>, ClusterError>
    where
        F: FnMut(SocketAddr) -> Fut,
        Fut: Future<Output = Result<T, C::Error>>,
    {
        self.dial(service, placement, &[], dial).await
    }

    /// [`connect`](Self::connect), with the nodes in `avoid` moved to the end of the
    /// order, the first of `avoid` first: a [`ClusterSession`](crate::ClusterSession)
    /// avoids the nodes it lost a connection to while it has others, and goes back to
    /// the one it lost longest ago when it has not.
    pub(crate) async fn connect_avoiding(
        &self,
        service: &str,
        placement: Placement<'_>,
        avoid: &[String],
    ) -> Result<Connected<C::Connection>, ClusterError> {
        let connector = &self.connector;
        self.dial(service, placement, avoid, |addr| {
            connector.connect(addr, service)
        })
        .await
    }

    /// The nodes to try, best first: by `placement`, then those in `avoid`, then the
    /// suspects (each part in its order); `Err` when none is live.
    async fn order(
        &self,
        members: &Membership,
        service: &str,
        placement: Placement<'_>,
        avoid: &[String],
    ) -> Result<Vec<NodeInfo>, ClusterError> {
        let listed = members
            .wait_for(self.discovery_wait, |nodes| {
                nodes.iter().any(|n| !n.record.draining)
            })
            .await
            .unwrap_or_else(|| members.nodes());
        let order: Vec<NodeInfo> = match placement {
            Placement::LeastLoaded => {
                let salt = self.salt.fetch_add(1, Ordering::Relaxed).to_le_bytes();
                let opened = self.opened.lock().expect("opened lock");
                by_load(&listed, |n| self.opened_since_report(&opened, n), &salt)
                    .into_iter()
                    .cloned()
                    .collect()
            }
            Placement::Key(key) => by_rendezvous(key, &listed).into_iter().cloned().collect(),
        };
        let rank = |n: &NodeInfo| avoid.iter().position(|a| *a == n.node);
        let (mut order, mut avoided): (Vec<NodeInfo>, Vec<NodeInfo>) =
            order.into_iter().partition(|n| rank(n).is_none());
        avoided.sort_by_key(|n| rank(n));
        order.extend(avoided);
        if order.is_empty() {
            return Err(ClusterError::NoNodes {
                cluster: self.cluster.clone(),
                service: service.to_owned(),
                draining: listed
                    .iter()
                    .filter(|n| n.record.draining)
                    .map(|n| n.node.clone())
                    .collect(),
                synced: members.is_synced(),
            });
        }
        let now = Instant::now();
        let mut suspects = self.suspects.lock().expect("suspects lock");
        let suspects = suspects
            .entry(service.to_owned())
            .or_insert_with(|| Suspects::new(self.suspicion));
        if members.is_synced() {
            suspects.forget_unlisted(&listed, now);
        }
        Ok(suspects.to_back(order, now))
    }

    /// Tries the nodes in order with `dial`, each for up to the dial bound.
    async fn dial<T, F, Fut>(
        &self,
        service: &str,
        placement: Placement<'_>,
        avoid: &[String],
        mut dial: F,
    ) -> Result<Connected<T>, ClusterError>
    where
        F: FnMut(SocketAddr) -> Fut,
        Fut: Future<Output = Result<T, C::Error>>,
    {
        let members = self.membership(service)?;
        let order = self.order(&members, service, placement, avoid).await?;
        let mut failed = Vec::new();
        for node in order.into_iter().take(self.max_attempts) {
            // Listed when the order was made; it may have started draining since.
            if let Some(now) = members.nodes().into_iter().find(|n| n.node == node.node) {
                if now.record.draining {
                    failed.push(Attempt {
                        node: node.node.clone(),
                        addr: node.record.addr,
                        reason: "draining (shutting down)".into(),
                    });
                    continue;
                }
            }
            // Dropped at the bound: the connector releases what it started.
            let outcome = tokio::time::timeout(self.dial_timeout, dial(node.record.addr)).await;
            let reason = match outcome {
                Ok(Ok(connection)) => {
                    self.heard(service, &node, true);
                    self.count_opened(&node);
                    return Ok(Connected {
                        connection,
                        node,
                        failed,
                    });
                }
                Ok(Err(err)) => {
                    self.heard(service, &node, !C::not_serving(&err));
                    err.to_string()
                }
                Err(_) => {
                    self.heard(service, &node, false);
                    format!(
                        "no answer within {:?} (tried last for {:?})",
                        self.dial_timeout, self.suspicion
                    )
                }
            };
            tracing::info!(node = %node.node, addr = %node.record.addr, %reason, "cluster: connect failed; trying another node");
            failed.push(Attempt {
                node: node.node.clone(),
                addr: node.record.addr,
                reason,
            });
        }
        Err(ClusterError::AllFailed {
            cluster: self.cluster.clone(),
            service: service.to_owned(),
            attempts: failed,
        })
    }

    /// Notes whether `node` answered a connect (a connection or a refusal) or not.
    fn heard(&self, service: &str, node: &NodeInfo, answered: bool) {
        let mut suspects = self.suspects.lock().expect("suspects lock");
        let suspects = suspects
            .entry(service.to_owned())
            .or_insert_with(|| Suspects::new(self.suspicion));
        if answered {
            suspects.answered(&node.node);
        } else {
            suspects.suspect(node, Instant::now());
        }
    }

    fn opened_since_report(&self, opened: &HashMap<String, (i64, u64)>, node: &NodeInfo) -> u64 {
        match opened.get(&node.node) {
            Some(&(revision, n)) if revision == node.mod_revision => n,
            _ => 0,
        }
    }

    fn count_opened(&self, node: &NodeInfo) {
        let mut opened = self.opened.lock().expect("opened lock");
        let entry = opened
            .entry(node.node.clone())
            .or_insert((node.mod_revision, 0));
        if entry.0 != node.mod_revision {
            *entry = (node.mod_revision, 0);
        }
        entry.1 += 1;
    }
}
