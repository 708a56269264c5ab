//! Where etcd is, and calls to it with a deadline.

use std::future::Future;
use std::time::Duration;

use crate::{Error, Result};

/// How to reach etcd.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// Client URLs (`http://127.0.0.1:2379`; a bare `HOST:PORT` means http). The client
    /// balances over them, so one member down is no outage.
    pub endpoints: Vec<String>,
    /// How long opening a connection to an endpoint may take.
    pub connect_timeout: Duration,
    /// How long one call (a read, a transaction, a lease grant) may take before it
    /// counts as failed.
    pub request_timeout: Duration,
}

impl EtcdConfig {
    /// The endpoints, with the default timeouts (2 s to connect, 3 s per call).
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> EtcdConfig {
        EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(3),
        }
    }

    /// `URL[,URL..]`, as the tools' `--etcd` takes it.
    ///
    /// # Errors
    ///
    /// [`Error::NoEndpoints`] for an empty list.
    pub fn parse(list: &str) -> Result<EtcdConfig> {
        let endpoints: Vec<&str> = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if endpoints.is_empty() {
            return Err(Error::NoEndpoints);
        }
        Ok(EtcdConfig::new(endpoints))
    }

    /// A client. It connects lazily: this succeeds with etcd down, and calls fail until
    /// it is back.
    pub(crate) async fn connect(&self) -> Result<etcd_client::Client> {
        if self.endpoints.is_empty() {
            return Err(Error::NoEndpoints);
        }
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(self.connect_timeout)
            // HTTP/2 pings: a partitioned etcd breaks the keepalive and watch streams
            // within seconds instead of at the next TCP timeout.
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
            .with_keep_alive_while_idle(true);
        self.call(
            "connect",
            etcd_client::Client::connect(&self.endpoints, Some(options)),
        )
        .await
    }

    /// `fut`, failed with [`Error::Timeout`] after `request_timeout`.
    pub(crate) async fn call<T>(
        &self,
        op: &'static str,
        fut: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.request_timeout, fut).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(source)) => Err(Error::Etcd {
                op,
                source: Box::new(source),
            }),
            Err(_) => Err(Error::Timeout {
                op,
                timeout: self.request_timeout,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_lists() {
        let c = EtcdConfig::parse("http://a:2379, b:2379,").unwrap();
        assert_eq!(c.endpoints, ["http://a:2379", "b:2379"]);
        assert!(matches!(EtcdConfig::parse(" , "), Err(Error::NoEndpoints)));
    }
}
