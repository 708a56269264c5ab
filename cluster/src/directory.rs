//! The registry as a server's `members` service sees it: a watch per service, answered
//! from memory, so that clients bootstrap from a server's address and never talk to
//! etcd (issue 47, item 1's preferred way; the C and Python clients' way in).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use rdmactor_services::members::{Directory, Member, MembersError};

use crate::etcd::EtcdConfig;
use crate::membership::Membership;
use crate::pick::by_load;

/// The live nodes of the services a server registers, least loaded first.
///
/// A service's watch starts when a client first asks about it, on the runtime the
/// directory was made on: each watch is an etcd client of its own (a connection per
/// member), so a server whose clients never bootstrap through it adds nothing to
/// etcd's load, and one that is asked watches only what it is asked about. Until a
/// watch has read the registry once it answers `NotSynced` (the `members` service
/// waits that out, briefly). While etcd is unreachable from this server the last list
/// is answered (as Kafka's brokers answer metadata from their cache): a client would
/// rather try a list that may name a dead node, each bounded by its dial bound, than
/// get no list from a cluster whose servers all serve.
#[derive(Debug)]
pub struct EtcdDirectory {
    etcd: EtcdConfig,
    cluster: String,
    /// The services answered: those the server registers, and no others, so that a
    /// client cannot make it watch (and hold) names of its choosing.
    services: HashSet<String>,
    watches: Mutex<HashMap<String, Membership>>,
    /// Where the watches run: the server's own runtime, not the poller thread that
    /// happens to answer the first question.
    runtime: tokio::runtime::Handle,
    /// Varies the tie-break between equally loaded nodes from one answer to the next,
    /// so that clients asking at once do not all go to the same node.
    calls: AtomicU64,
}

impl EtcdDirectory {
    /// Answers for `services` of `cluster`. Must be called inside a tokio runtime (an
    /// actix `System` is one), where the watches will run.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn new<S: AsRef<str>>(
        etcd: EtcdConfig,
        cluster: &str,
        services: impl IntoIterator<Item = S>,
    ) -> EtcdDirectory {
        EtcdDirectory {
            etcd,
            cluster: cluster.to_owned(),
            services: services
                .into_iter()
                .map(|s| s.as_ref().to_owned())
                .collect(),
            watches: Mutex::new(HashMap::new()),
            runtime: tokio::runtime::Handle::current(),
            calls: AtomicU64::new(0),
        }
    }

    /// `service`'s watch, started now if this is the first question about it.
    fn watch(&self, service: &str) -> Result<Membership, MembersError> {
        let mut watches = self
            .watches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(w) = watches.get(service) {
            return Ok(w.clone());
        }
        let _on = self.runtime.enter();
        let watch = Membership::watch(self.etcd.clone(), &self.cluster, service).map_err(|e| {
            tracing::warn!(%e, service, "members: cannot watch the registry");
            MembersError::NotSynced
        })?;
        watches.insert(service.to_owned(), watch.clone());
        Ok(watch)
    }
}

impl Directory for EtcdDirectory {
    fn members(&self, service: &str) -> Result<Vec<Member>, MembersError> {
        if !self.services.contains(service) {
            return Err(MembersError::UnknownService(service.to_owned()));
        }
        let watch = self.watch(service)?;
        if watch.revision() == 0 {
            return Err(MembersError::NotSynced);
        }
        let nodes = watch.live();
        let salt = self.calls.fetch_add(1, Ordering::Relaxed).to_le_bytes();
        Ok(by_load(&nodes, |_| 0, &salt)
            .into_iter()
            .map(|n| Member {
                node: n.node.clone(),
                addr: n.record.addr,
                connections: n.record.load.connections,
            })
            .collect())
    }
}
