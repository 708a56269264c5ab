//! Where etcd is, and calls to it with a deadline.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::{Error, Result};

mod credentials;
pub use credentials::{EtcdTls, EtcdUser};

/// How to reach etcd.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// Client URLs (`http://127.0.0.1:2379`; a bare `HOST:PORT` means http). Calls go
    /// to the first, and move to the next when a member fails one (see `Members`), so
    /// one member down or cut off from the quorum is no outage. List the nearest first.
    pub endpoints: Vec<String>,
    /// How long opening a connection to an endpoint may take.
    pub connect_timeout: Duration,
    /// How long one call (a read, a transaction, a lease grant) may take before it
    /// counts as failed.
    pub request_timeout: Duration,
    /// TLS for `https://` endpoints, with this process's client certificate where etcd
    /// asks for one (see [`EtcdTls`]).
    pub tls: Option<EtcdTls>,
    /// A user and password, where etcd's auth takes them instead of (or besides) a
    /// client certificate.
    pub user: Option<EtcdUser>,
}

impl EtcdConfig {
    /// The endpoints, with the default timeouts (2 s to connect, 3 s per call).
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> EtcdConfig {
        EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(3),
            tls: None,
            user: None,
        }
    }

    /// With TLS (see [`EtcdTls`]).
    pub fn with_tls(mut self, tls: EtcdTls) -> EtcdConfig {
        self.tls = Some(tls);
        self
    }

    /// With a user and password (see [`EtcdUser`]).
    pub fn with_user(mut self, user: EtcdUser) -> EtcdConfig {
        self.user = Some(user);
        self
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

    /// The members' clients, one per endpoint (see [`Members`]). They connect lazily:
    /// this succeeds with etcd down, and calls fail until it is back. With a
    /// [`user`](Self::user) it does not: etcd-client asks each member for a token at
    /// once, so this fails while one is unreachable and the caller's loop tries again.
    pub(crate) async fn connect(&self) -> Result<Members> {
        if self.endpoints.is_empty() {
            return Err(Error::NoEndpoints);
        }
        let mut options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(self.connect_timeout)
            // HTTP/2 pings: a partitioned etcd breaks the keepalive and watch streams
            // within seconds instead of at the next TCP timeout. Within etcd's ping
            // policy, or it ends the connection (GOAWAY `too_many_pings`, failing the
            // calls in flight; seen in a nemesis run): no closer than its
            // `--grpc-keepalive-min-time` (5 s by default), and none while no stream is
            // open (it does not permit pings without one). A partition is thus noticed
            // within 6 + 3 s on a connection with a stream open, and an idle one finds
            // out at its next call.
            .with_keep_alive(Duration::from_secs(6), Duration::from_secs(3))
            .with_keep_alive_while_idle(false)
            // gRPC metadata `hasleader=true` on every call, as etcd's own clients set
            // it for watches (`clientv3.WithRequireLeader`): a member that has lost its
            // leader refuses a call at once (`etcdserver: no leader`) instead of
            // holding it until it times out, and cancels the watches and keepalive
            // streams opened through it a few election timeouts after it lost the
            // leader, instead of keeping them open and silent.
            .with_require_leader(true);
        if let Some(tls) = &self.tls {
            options = options.with_tls(tls.options());
        }
        if let Some(user) = &self.user {
            // A token etcd let expire (5 minutes idle by default) is fetched again
            // instead of failing every later call.
            options = options
                .with_user(user.name.clone(), user.password.clone())
                .with_auto_token_refresh(true);
        }
        let mut clients = Vec::with_capacity(self.endpoints.len());
        for endpoint in &self.endpoints {
            clients.push(
                self.call(
                    "connect",
                    etcd_client::Client::connect([endpoint], Some(options.clone())),
                )
                .await?,
            );
        }
        Ok(Members {
            config: self.clone(),
            clients: clients.into(),
            current: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// `fut`, failed with [`Error::Timeout`] after `request_timeout`.
    pub(crate) async fn call<T>(
        &self,
        op: &'static str,
        fut: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        self.call_within(op, self.request_timeout, fut).await
    }

    async fn call_within<T>(
        &self,
        op: &'static str,
        timeout: Duration,
        fut: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        match tokio::time::timeout(timeout, fut).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(source)) => Err(match refused_for_auth(&source) {
                Some(why) => Error::PermissionDenied { op, why },
                None => Error::Etcd {
                    op,
                    source: Box::new(source),
                },
            }),
            Err(_) => Err(Error::Timeout { op, timeout }),
        }
    }
}

/// The etcd members, one client each, used one at a time: every call goes to the
/// current member, and a call that fails there for a reason of the member's (no
/// leader, unreachable, a broken connection, no answer in time) moves every later call
/// to the next member in the list, round and round.
///
/// Why not etcd-client's own balancing over all endpoints: it spreads calls over every
/// endpoint at random (tower's power of two choices) and keeps a member that cannot
/// serve among them, so with one member cut off from the quorum about a third of all
/// calls went to it and failed (across the wire: 14 of 111 fetches), however often
/// they were made again. Nor reconnecting with the list rotated: the balancer would
/// still spread over the whole list. One client per member, the failing one left, is
/// what etcd's Go client did up to 3.3 (one pinned endpoint, switched on failure);
/// the load of a few registry readers on one member is no concern.
///
/// Which calls are made again after such a failure, on the next member:
/// - [`idempotent`](Self::idempotent): reads (linearizable: etcd-client's `get` is not
///   serializable unless asked, so a member without the quorum cannot answer one from
///   its stale copy), watch creation, and transactions whose compare makes a second
///   application harmless (the file catalog's create-if-absent: a retry finds its own
///   record and takes it as created);
/// - [`unrepeated`](Self::unrepeated): the rest (a lease grant, a lock, an unfenced
///   put) only when the call never left this process ([`unsent`]). A reset or a
///   timeout may come after etcd applied the call, and a second one would apply it
///   twice (a second lease, a second lock waiter). Such a call still moves later calls
///   off the member.
#[derive(Clone)]
pub(crate) struct Members {
    config: EtcdConfig,
    clients: Arc<[etcd_client::Client]>,
    current: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Members {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Members")
            .field("endpoints", &self.config.endpoints)
            .field("current", &self.current.load(Ordering::Relaxed))
            .finish()
    }
}

impl Members {
    /// The current member's index and client.
    pub(crate) fn current(&self) -> (usize, etcd_client::Client) {
        let at = self.current.load(Ordering::Acquire) % self.clients.len();
        (at, self.clients[at].clone())
    }

    /// After a call through member `at` failed with `err`: if the failure is the
    /// member's ([`member_fault`]), later calls go to the next member (unless another
    /// call has moved them already).
    pub(crate) fn leave(&self, at: usize, err: &Error) {
        // A lease lost for want of keepalive answers is the member's too: it stopped
        // answering before etcd ended the stream.
        let lapsed =
            matches!(err, Error::LeaseLost { why, .. } if why.starts_with("no keepalive answer"));
        if !(member_fault(err) || lapsed) || self.clients.len() < 2 {
            return;
        }
        let next = (at + 1) % self.clients.len();
        if self
            .current
            .compare_exchange(at, next, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            tracing::warn!(
                from = %self.config.endpoints[at],
                to = %self.config.endpoints[next],
                %err,
                "etcd: leaving a member that failed a call"
            );
        }
    }

    /// A call that may be made again: on the current member, then, while it fails for
    /// a member's reason, on the next ones, pausing after each round, for at most twice
    /// the request timeout in all.
    pub(crate) async fn idempotent<T, F, Fut>(&self, op: &'static str, make: F) -> Result<T>
    where
        F: FnMut(etcd_client::Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        Ok(self.calls(op, make, member_fault).await?.1)
    }

    /// [`idempotent`](Self::idempotent), with the index of the member that answered (a
    /// stream's: to [`leave`](Self::leave) it when the stream fails).
    pub(crate) async fn idempotent_at<T, F, Fut>(
        &self,
        op: &'static str,
        make: F,
    ) -> Result<(usize, T)>
    where
        F: FnMut(etcd_client::Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        self.calls(op, make, member_fault).await
    }

    /// A call that must not be applied twice: made again only while it fails
    /// [unsent](unsent); a failure of the member's still moves later calls off it.
    pub(crate) async fn unrepeated<T, F, Fut>(&self, op: &'static str, make: F) -> Result<T>
    where
        F: FnMut(etcd_client::Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        Ok(self
            .calls(
                op,
                make,
                |err| matches!(err, Error::Etcd { source, .. } if unsent(source)),
            )
            .await?
            .1)
    }

    async fn calls<T, F, Fut>(
        &self,
        op: &'static str,
        mut make: F,
        again: impl Fn(&Error) -> bool,
    ) -> Result<(usize, T)>
    where
        F: FnMut(etcd_client::Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let request_timeout = self.config.request_timeout;
        let deadline = tokio::time::Instant::now() + request_timeout.saturating_mul(2);
        let members = self.clients.len();
        let mut tried = 0usize;
        loop {
            let (at, client) = self.current();
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let err = match self
                .config
                .call_within(op, request_timeout.min(left), make(client))
                .await
            {
                Ok(value) => return Ok((at, value)),
                Err(err) => err,
            };
            self.leave(at, &err);
            tried += 1;
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if !again(&err) || left.is_zero() || tried >= 4 * members {
                return Err(err);
            }
            tracing::debug!(op, tried, %err, "etcd: call failed; trying the next member");
            if tried % members == 0 {
                // Every member failed once: an election under way, or etcd restarting.
                let pause = Duration::from_millis(100 * (tried / members) as u64);
                tokio::time::sleep(pause.min(left)).await;
            }
        }
    }
}

/// Whether etcd refused a call for who made it: permission denied (7) by its RBAC, an
/// unauthenticated call (16: a bad or expired token), or no user at all where auth is
/// on (etcd answers that one as an invalid argument).
/// Returns etcd's words then.
fn refused_for_auth(err: &etcd_client::Error) -> Option<String> {
    let etcd_client::Error::GRpcStatus(status) = err else {
        return None;
    };
    let why = status.message();
    (matches!(i32::from(status.code()), 7 | 16) || why.contains("user name is empty"))
        .then(|| why.to_owned())
}

/// Whether a failed call says nothing against the request, only against the member it
/// went to: no answer in time, the connection failed or broke, or etcd's "unavailable"
/// (no leader, leader changed, request timed out, stopping). Such a call is better made
/// on another member. An answer that judges the request (not found, compacted, a
/// permission, an invalid argument) is not.
pub(crate) fn member_fault(err: &Error) -> bool {
    match err {
        Error::Timeout { .. } => true,
        Error::Etcd { source, .. } => match source.as_ref() {
            // gRPC codes: 1 cancelled, 2 unknown, 4 deadline exceeded, 13 internal (h2
            // protocol errors), 14 unavailable (etcd's no leader, and transport errors).
            etcd_client::Error::GRpcStatus(status) => {
                matches!(i32::from(status.code()), 1 | 2 | 4 | 13 | 14)
            }
            etcd_client::Error::IoError(_)
            | etcd_client::Error::TransportError(_)
            | etcd_client::Error::WatchError(_)
            | etcd_client::Error::LeaseKeepAliveError(_) => true,
            _ => false,
        },
        _ => false,
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

    /// A gRPC status as etcd-client reports it, made without naming tonic: tonic
    /// turns an `io::Error` into a status, its code by the error's kind (connection
    /// refused: unavailable; not found; unexpected EOF: out of range; invalid input:
    /// invalid argument; other: unknown).
    fn status(kind: std::io::ErrorKind, message: &str) -> etcd_client::Error {
        fn via<S: From<std::io::Error>>(
            wrap: fn(S) -> etcd_client::Error,
            io: std::io::Error,
        ) -> etcd_client::Error {
            wrap(S::from(io))
        }
        via(
            etcd_client::Error::GRpcStatus,
            std::io::Error::new(kind, message.to_owned()),
        )
    }

    fn etcd(source: etcd_client::Error) -> Error {
        Error::Etcd {
            op: "test",
            source: Box::new(source),
        }
    }

    #[test]
    fn a_member_fault_is_told_from_an_answer_on_the_request() {
        let io = |kind| etcd(etcd_client::Error::IoError(std::io::Error::from(kind)));
        use std::io::ErrorKind::*;
        for fault in [
            io(BrokenPipe),
            io(ConnectionReset),
            io(HostUnreachable),
            etcd(status(ConnectionRefused, "etcdserver: no leader")),
            etcd(status(ConnectionRefused, "etcdserver: request timed out")),
            etcd(status(Other, "h2 protocol error")),
            Error::Timeout {
                op: "get",
                timeout: Duration::from_secs(3),
            },
        ] {
            assert!(member_fault(&fault), "{fault}");
        }
        for answer in [
            etcd(status(InvalidInput, "etcdserver: key is not provided")),
            etcd(status(
                std::io::ErrorKind::NotFound,
                "etcdserver: requested lease not found",
            )),
            etcd(status(
                UnexpectedEof,
                "etcdserver: mvcc: required revision has been compacted",
            )),
            Error::NoEndpoints,
        ] {
            assert!(!member_fault(&answer), "{answer}");
        }
    }

    #[tokio::test]
    async fn a_read_moves_to_the_next_member_and_a_write_only_when_unsent() {
        let mut config = EtcdConfig::new(["http://a:2379", "http://b:2379", "http://c:2379"]);
        config.request_timeout = Duration::from_millis(200);
        let members = config.connect().await.unwrap();
        let broken =
            || etcd_client::Error::IoError(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        // A read broken on a is made again on b, and later calls stay on b.
        let mut made = 0;
        let got = members
            .idempotent("get", |_| {
                made += 1;
                let answer = if made < 2 { Err(broken()) } else { Ok(made) };
                async move { answer }
            })
            .await;
        assert!(matches!(got, Ok(2)), "{got:?}");
        assert_eq!(members.current().0, 1);
        // No answer in time: the next member.
        let mut made = 0;
        let got = members
            .idempotent("get", |_| {
                made += 1;
                async move {
                    if made < 2 {
                        std::future::pending::<()>().await;
                    }
                    Ok(made)
                }
            })
            .await;
        assert!(matches!(got, Ok(2)), "{got:?}");
        assert_eq!(members.current().0, 2);
        // A write broken on c may have been applied: not made again, but the next call
        // goes to a.
        let mut made = 0;
        let got: Result<()> = members
            .unrepeated("txn", |_| {
                made += 1;
                async { Err(broken()) }
            })
            .await;
        assert!(got.is_err() && made == 1, "{made}");
        assert_eq!(members.current().0, 0);
        // A write that could not connect is made again, on the next member.
        let mut made = 0;
        let got = members
            .unrepeated("txn", |_| {
                made += 1;
                let answer = if made < 3 {
                    Err(etcd_client::Error::IoError(std::io::Error::from(
                        std::io::ErrorKind::HostUnreachable,
                    )))
                } else {
                    Ok(made)
                };
                async move { answer }
            })
            .await;
        assert!(matches!(got, Ok(3)), "{got:?}");
        assert_eq!(members.current().0, 2);
        // An answer on the request itself is not the member's: no second try, no move.
        let mut made = 0;
        let got: Result<()> = members
            .idempotent("get", |_| {
                made += 1;
                async {
                    Err(status(
                        std::io::ErrorKind::NotFound,
                        "etcdserver: requested lease not found",
                    ))
                }
            })
            .await;
        assert!(got.is_err() && made == 1, "{made}");
        assert_eq!(members.current().0, 2);
    }
}
