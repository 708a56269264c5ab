//! The registry as a server's `members` service sees it: a watch per service, answered
//! from memory, so that clients bootstrap from a server's address and never talk to
//! etcd (issue 47, item 1's preferred way; the C and Python clients' way in).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use rdmactor_services::members::{Directory, Member, MembersError};

use crate::etcd::EtcdConfig;
use crate::membership::Membership;
use crate::pick::by_load;
use crate::Result;

/// The live nodes of the services a server watches, least loaded first.
///
/// A list is answered once it has been read at least once. While etcd is unreachable
/// from this server the last list is answered (as Kafka's brokers answer metadata from
/// their cache): a client would rather try a list that may name a dead node, each
/// bounded by its dial bound, than get no list from a cluster whose servers all serve.
#[derive(Debug)]
pub struct EtcdDirectory {
    watches: HashMap<String, Membership>,
    /// Varies the tie-break between equally loaded nodes from one answer to the next,
    /// so that clients asking at once do not all go to the same node.
    calls: AtomicU64,
}

impl EtcdDirectory {
    /// Starts watching `services` of `cluster`: only these are answered. Must be called
    /// inside a tokio runtime (an actix `System` is one).
    ///
    /// # Errors
    ///
    /// As [`Membership::watch`]: an invalid name, no endpoints.
    pub fn watch<S: AsRef<str>>(
        etcd: EtcdConfig,
        cluster: &str,
        services: impl IntoIterator<Item = S>,
    ) -> Result<EtcdDirectory> {
        let mut watches = HashMap::new();
        for service in services {
            let service = service.as_ref();
            watches.insert(
                service.to_owned(),
                Membership::watch(etcd.clone(), cluster, service)?,
            );
        }
        Ok(EtcdDirectory {
            watches,
            calls: AtomicU64::new(0),
        })
    }
}

impl Directory for EtcdDirectory {
    fn members(&self, service: &str) -> std::result::Result<Vec<Member>, MembersError> {
        let watch = self
            .watches
            .get(service)
            .ok_or_else(|| MembersError::UnknownService(service.to_owned()))?;
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
