//! The cluster tests' helpers: a real etcd ([`rdmactor_testkit::etcd::Etcd`]), a config
//! and a raw client for it, and polling until a condition holds.
#![allow(dead_code)] // each test file uses part of it

use std::time::{Duration, Instant};

use rdmactor_cluster::EtcdConfig;
pub use rdmactor_testkit::etcd::Etcd;

/// What the cluster's tests need of an [`Etcd`] besides its URL.
pub trait EtcdExt {
    /// A config for the crate, with short timeouts (loopback answers at once).
    fn config(&self) -> EtcdConfig;
    /// A raw client, to look at or tamper with the registry.
    async fn client(&self) -> etcd_client::Client;
}

impl EtcdExt for Etcd {
    fn config(&self) -> EtcdConfig {
        let mut config = EtcdConfig::new([self.url()]);
        config.connect_timeout = Duration::from_millis(500);
        config.request_timeout = Duration::from_secs(2);
        config
    }

    async fn client(&self) -> etcd_client::Client {
        etcd_client::Client::connect([self.url()], None)
            .await
            .expect("connecting to etcd")
    }
}

/// Polls `cond` every 20 ms for at most `timeout`; returns how long it took, or panics
/// naming `what`.
pub async fn eventually(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if cond() {
            return start.elapsed();
        }
        if start.elapsed() > timeout {
            panic!("{what}: not within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
