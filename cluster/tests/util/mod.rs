//! The cluster tests' helpers: a real etcd ([`rdmactor_testkit::etcd::Etcd`]), a config
//! and a raw client for it, and polling until a condition holds.
#![allow(dead_code)] // each test file uses part of it

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rdmactor_cluster::{EtcdConfig, Registrar, RegistrationConfig, RegistrationState};
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

/// Node `i`'s address (TEST-NET-1: nothing listens there; connectors are fakes).
pub fn addr(i: u8) -> SocketAddr {
    SocketAddr::from(([192, 0, 2, i], 7471))
}

/// `node` registered at `at` for `service` in cluster `test` with a 2 s lease, once its
/// registration is confirmed.
pub async fn register(etcd: &Etcd, node: &str, at: SocketAddr, service: &str) -> Registrar {
    let mut config = RegistrationConfig::new("test", node, at, [service]);
    config.ttl = Duration::from_secs(2);
    let registrar = Registrar::start(etcd.config(), config).unwrap();
    let mut states = registrar.states();
    tokio::time::timeout(
        Duration::from_secs(10),
        states.wait_for(RegistrationState::is_registered),
    )
    .await
    .unwrap()
    .unwrap();
    registrar
}
pub mod trio;
