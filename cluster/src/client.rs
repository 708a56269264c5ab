//! Connecting through the registry: pick a node, connect, and on failure the next.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::etcd::EtcdConfig;
use crate::membership::Membership;
use crate::pick::{by_load, by_rendezvous};
use crate::{Error, NodeInfo};

/// What opens a connection to one node: `rdmactor::runtime::Client` with the
/// `rdmactor` feature, or anything else (a test's fake, another transport).
pub trait Connector {
    /// An open connection.
    type Connection;
    /// Why a connect failed (its text goes into [`ClusterError`]).
    type Error: fmt::Display;
    /// Connects to `service` at `addr`.
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
/// full node). Use it on one thread (the rdmactor client's futures are not `Send`).
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
}

impl<C: Connector> ClusterClient<C> {
    /// A client of `cluster`, connecting through `connector`. Waits up to 5 s for the
    /// registry when it has no node yet, and tries up to 3 nodes per connect.
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
        }
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
    /// failed or refused connect, up to the configured number of attempts.
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
        let members = self.membership(service)?;
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
            match self.connector.connect(node.record.addr, service).await {
                Ok(connection) => {
                    self.count_opened(&node);
                    return Ok(Connected {
                        connection,
                        node,
                        failed,
                    });
                }
                Err(err) => {
                    tracing::info!(node = %node.node, addr = %node.record.addr, %err, "cluster: connect failed; trying another node");
                    failed.push(Attempt {
                        node: node.node.clone(),
                        addr: node.record.addr,
                        reason: err.to_string(),
                    });
                }
            }
        }
        Err(ClusterError::AllFailed {
            cluster: self.cluster.clone(),
            service: service.to_owned(),
            attempts: failed,
        })
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
