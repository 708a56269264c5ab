//! What a node registers, and how: names, address, lease TTL and retry pacing.

use std::net::SocketAddr;
use std::time::Duration;

use crate::record::check_name;
use crate::{Error, Result};

/// What a node registers, and how.
#[derive(Debug, Clone)]
pub struct RegistrationConfig {
    /// The cluster's name (the key's second part).
    pub cluster: String,
    /// This node's id: unique in the cluster, the same across restarts (the tools use
    /// the advertised address).
    pub node: String,
    /// Where clients connect.
    pub addr: SocketAddr,
    /// The services registered (one key each).
    pub services: Vec<String>,
    /// The version written into the records.
    pub version: String,
    /// The lease's time to live: how long a dead node stays listed at most. etcd rounds
    /// it up to its minimum (about 2 s with default election timings).
    pub ttl: Duration,
    /// Load reports are written at most this often.
    pub load_interval: Duration,
    /// The first retry's delay; each failure in a row doubles it up to `retry_max`.
    pub retry_min: Duration,
    /// The longest delay between retries.
    pub retry_max: Duration,
}

impl RegistrationConfig {
    /// `node` serving `services` at `addr` in `cluster`, with the defaults: TTL 5 s, a
    /// load report at most every 2 s, retries from 250 ms to 5 s, this crate's version.
    pub fn new<S: Into<String>>(
        cluster: impl Into<String>,
        node: impl Into<String>,
        addr: SocketAddr,
        services: impl IntoIterator<Item = S>,
    ) -> RegistrationConfig {
        RegistrationConfig {
            cluster: cluster.into(),
            node: node.into(),
            addr,
            services: services.into_iter().map(Into::into).collect(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            ttl: Duration::from_secs(5),
            load_interval: Duration::from_secs(2),
            retry_min: Duration::from_millis(250),
            retry_max: Duration::from_secs(5),
        }
    }

    /// The names, checked against the key layout.
    pub(super) fn validate(&self) -> Result<()> {
        check_name("cluster", &self.cluster)?;
        check_name("node", &self.node)?;
        if self.services.is_empty() {
            return Err(Error::InvalidName {
                what: "service",
                name: String::new(),
                why: "list is empty: a node registers at least one service",
            });
        }
        for service in &self.services {
            check_name("service", service)?;
        }
        Ok(())
    }

    pub(super) fn ttl_secs(&self) -> i64 {
        self.ttl.as_secs().max(1) as i64
    }
}
