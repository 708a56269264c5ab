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

    /// [`call`](Self::call) of the future `make` gives, made and sent again while a call
    /// fails [unsent](unsent): the client balances calls over the endpoints and keeps a
    /// member whose host is down among them, so with one of three members gone about a
    /// third of all calls failed to connect (seen across the wire: 9 of 20 uploads after
    /// a host was killed failed in their create transaction). A call that never left
    /// this process is safe to send again, transactions included; at most twice as many
    /// tries as endpoints.
    pub(crate) async fn call_retrying<T, F, Fut>(&self, op: &'static str, mut make: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let tries = 2 * self.endpoints.len().max(1);
        let mut tried = 1;
        loop {
            match self.call(op, make()).await {
                Err(Error::Etcd { ref source, .. }) if tried < tries && unsent(source) => {
                    tracing::debug!(op, tried, err = %source, "etcd: call not sent, trying again");
                    tried += 1;
                }
                other => return other,
            }
        }
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

/// Whether a failed call never reached etcd: the connection to the endpoint it was
/// given to could not be opened (no route to the member's host, refused). A reset or a
/// timeout is not: the call may have been sent.
pub(crate) fn unsent(err: &etcd_client::Error) -> bool {
    // etcd-client's error has no `source`: start from what each variant wraps.
    let mut next: Option<&(dyn std::error::Error + 'static)> = match err {
        etcd_client::Error::IoError(e) => Some(e),
        etcd_client::Error::GRpcStatus(e) => Some(e),
        etcd_client::Error::TransportError(e) => Some(e),
        _ => None,
    };
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(
                io.kind(),
                HostUnreachable | NetworkUnreachable | ConnectionRefused | AddrNotAvailable
            ) {
                return true;
            }
        }
        next = e.source();
    }
    // tonic names a failed connect so; its source chain may not reach the io::Error.
    err.to_string().contains("tcp connect error")
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

    #[tokio::test]
    async fn a_call_that_could_not_connect_is_sent_again_and_others_are_not() {
        let config = EtcdConfig::new(["http://a:2379", "http://b:2379"]);
        let refused = || {
            etcd_client::Error::IoError(std::io::Error::from(std::io::ErrorKind::HostUnreachable))
        };
        let mut made = 0;
        let got = config
            .call_retrying("get", || {
                made += 1;
                let answer = if made < 3 { Err(refused()) } else { Ok(made) };
                async move { answer }
            })
            .await;
        assert!(matches!(got, Ok(3)), "{got:?}");
        // Four tries for two endpoints, then the error.
        let mut made = 0;
        let got: Result<()> = config
            .call_retrying("get", || {
                made += 1;
                async { Err(refused()) }
            })
            .await;
        assert!(
            matches!(got, Err(Error::Etcd { .. })) && made == 4,
            "{made}"
        );
        // A reset may have been sent: no second try.
        let mut made = 0;
        let got: Result<()> = config
            .call_retrying("txn", || {
                made += 1;
                async {
                    Err(etcd_client::Error::IoError(std::io::Error::from(
                        std::io::ErrorKind::ConnectionReset,
                    )))
                }
            })
            .await;
        assert!(got.is_err() && made == 1, "{made}");
    }
}
