//! rdmactor-cluster: past one server. rdmactor servers register in etcd; clients find
//! a live server for a service there, spread their connections over the servers, and
//! go to another when one refuses, fails or shuts down.
//!
//! Why etcd, and not a membership protocol of our own: systems built on RDMA keep their
//! membership in a coordination service that already solves it (Mooncake and 3FS
//! register nodes in etcd or FoundationDB; Kubernetes keeps its state in etcd). etcd's
//! leases say whether a node is alive, its watches tell clients at once, and its
//! transactions fence a node that lost its lease. A single server needs none of it:
//! this crate is used only when a server is started with `--cluster`.
//!
//! Nothing here touches verbs: the registry, the watcher and the node choice are tested
//! natively against a real etcd. The `rdmactor` feature adds [`Connector`] for
//! `rdmactor::runtime::Client`.
//!
//! # The parts
//!
//! - [`Registrar`]: a server's registration, one key per service under one lease, kept
//!   alive, its [`Load`] reported, withdrawn at shutdown (the module docs of
//!   [`registrar`] say how leases, fencing and outages are handled).
//! - [`Membership`]: the nodes of one service, read and then watched.
//! - [`pick`]: least-loaded and rendezvous-hash orders of nodes (plain functions).
//! - [`ClusterClient`]: connects to a service through the registry, trying another node
//!   on failure or when one does not answer within the dial bound (it is then tried
//!   last for a while), with errors that name each node and its reason.
//! - `EtcdDirectory` (with `rdmactor`): a server's view of the registry for its
//!   `members` service, so that clients bootstrap from a server's address instead of
//!   reading etcd (`rdmactor_services::members`).
//! - [`ClusterSession`]: one connection that moves to another node when its node drains
//!   or the connection is lost, sending again the requests marked [`Idempotency::Idempotent`].
//!
//! # Layout in etcd
//!
//! `/rdmactor/<cluster>/services/<service>/<node-id>`, a JSON [`NodeRecord`]
//! (see [`record`]): `etcdctl get --prefix /rdmactor/` shows the whole registry.
//!
//! # Example
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use rdmactor_cluster::{EtcdConfig, Load, Membership, Registrar, RegistrationConfig};
//!
//! let etcd = EtcdConfig::parse("http://127.0.0.1:2379")?;
//! // A server: register after listening, report load, withdraw before draining.
//! let addr = "192.0.2.1:7471".parse()?;
//! let config = RegistrationConfig::new("lab", "192.0.2.1:7471", addr, ["echo", "files"]);
//! let registrar = Registrar::start(etcd.clone(), config)?;
//! registrar.set_load(Load { connections: 12, ..Load::default() });
//! // A client: the live nodes of `echo`.
//! let echo = Membership::watch(etcd, "lab", "echo")?;
//! let listed = echo.wait_for(std::time::Duration::from_secs(5), |n| !n.is_empty()).await;
//! println!("{listed:?}");
//! registrar.withdraw().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Thread safety
//!
//! [`Registrar`] and [`Membership`] each run one task on the tokio runtime they were
//! started on (an actix `System` is one) and are `Send + Sync`. [`ClusterClient`] is
//! as `Send` as its connector; the rdmactor client's is used on its own thread.
#![deny(missing_docs)]

mod client;
#[cfg(feature = "rdmactor")]
mod directory;
mod error;
mod etcd;
pub mod files;
mod membership;
pub mod pick;
pub mod record;
pub mod registrar;
mod session;
mod suspects;
mod table;

pub use client::{
    Attempt, ClusterClient, ClusterError, Connected, Connector, Placement, DEFAULT_DIAL_TIMEOUT,
    DEFAULT_SUSPICION,
};
#[cfg(feature = "rdmactor")]
pub use directory::EtcdDirectory;
pub use error::{Error, Result};
pub use etcd::{EtcdConfig, EtcdTls, EtcdUser};
pub use membership::Membership;
pub use record::{Load, NodeRecord};
pub use registrar::{Registrar, RegistrationConfig, RegistrationState};
pub use session::{ClusterSession, ConnectionFault, Idempotency, Idempotent, SessionError};
pub use table::NodeInfo;

/// The gauge: 1 while the node is registered, 0 otherwise. Labels `cluster`, `node`.
pub const METRIC_REGISTERED: &str = "rdmactor_cluster_registered";
/// The counter of failed registration attempts and lost leases. Labels `cluster`, `node`.
pub const METRIC_FAILURES: &str = "rdmactor_cluster_registration_failures_total";
