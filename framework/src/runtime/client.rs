//! The client side, on the same machinery as the server: one CM actor, pollers and
//! connection actors, so one process can drive thousands of connections.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use actix::prelude::*;
use tokio::sync::{mpsc, oneshot};

use super::auth::{Credential, DEFAULT_AUTH_TIMEOUT};
use super::client_session::{
    AtomicOp, ClientCall, ClientEnds, ClientSession, ClosedReason, NonceSlot, Prover, RawProof,
    Reply, RequestError,
};
use super::close::CloseReason;
use super::cm::CmActor;
use super::config::NodeConfig;
use super::connect::{with_session, Connect, ConnectError, Dialer};
use super::connection::{CmNotice, ConnectionActor, ConnectionParts};
use super::handler::{Answer, CallError};
use super::node::Node;
use super::service::{Identity, Incoming, Session};
use crate::proto::hello::Welcome;
use crate::transport::{Domain, Transport, Verbs};
use crate::verbs::{Access, RemoteRegion, VerbsError};

/// A client: device resources plus a CM actor for outgoing connections, over the
/// transport `T` ([`Client::start`] for verbs, [`Client::over`] for another).
pub struct Client<T: Transport = Verbs> {
    node: Arc<Node<T>>,
    cm: Addr<CmActor<T>>,
    /// What every connect proves, when the service asks (see [`Client::with_identity`]).
    credential: Option<Prover>,
}

/// A snapshot of a client's counters ([`Client::stats`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientStats {
    /// Connections open now (connects under way included once their QP exists).
    pub connections: usize,
    /// Connections closed and released since start.
    pub closed: u64,
    /// Registered memory.
    pub pool: crate::memory::PoolStats,
}

/// Why a client could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// Opening the device or the event channel failed.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// The same, on a transport other than verbs.
    #[error("transport: {0}")]
    Transport(Box<dyn std::error::Error + Send + Sync>),
    /// The configuration is inconsistent ([`NodeConfig::validate`]).
    #[error("configuration: {0}")]
    Invalid(#[from] super::ConfigError),
}

impl ClientError {
    /// A transport's error: verbs errors keep their own variant.
    fn transport<E: std::error::Error + Send + Sync + 'static>(e: E) -> ClientError {
        super::verbs_or_boxed(e).map_or_else(ClientError::Transport, ClientError::Verbs)
    }
}

impl Client {
    /// Opens the configured RDMA device and starts the client's actors. Must run inside
    /// an actix System.
    pub fn start(config: NodeConfig) -> Result<Client, ClientError> {
        Client::over(Verbs, config)
    }
}

impl<T: Transport> Client<T> {
    /// [`start`](Client::start) over `transport` (`Client::over(Loopback, config)`: in
    /// memory, reaching the servers of this process).
    pub fn over(transport: T, config: NodeConfig) -> Result<Client<T>, ClientError> {
        let _ = transport;
        config.validate()?;
        let node = Node::<T>::start(config).map_err(ClientError::transport)?;
        Client::with_node(node)
    }

    /// Starts on `domain`, a device the caller opened (a loopback device of a test's own
    /// fabric, say).
    pub fn on(domain: T::Domain, config: NodeConfig) -> Result<Client<T>, ClientError> {
        config.validate()?;
        let node = Node::<T>::start_on(domain, config).map_err(ClientError::transport)?;
        Client::with_node(node)
    }

    fn with_node(node: Arc<Node<T>>) -> Result<Client<T>, ClientError> {
        let channel = node
            .pd
            .create_event_channel()
            .map_err(ClientError::transport)?;
        let cm = CmActor::new(
            node.clone(),
            channel,
            Arc::new(HashMap::new()),
            super::budget::QpBudget::new(usize::MAX),
            0,
        )
        .start();
        Ok(Client {
            node,
            cm,
            credential: None,
        })
    }

    /// Proves `credential`'s identity on every connect to a service that asks for it
    /// (the server's accept carries a nonce; the proof is the connection's first
    /// message, and `connect` returns once the server accepted it, one round trip
    /// later). Services that take anonymous clients ask nothing, and get nothing.
    /// Without a credential, a connect to an authenticated-only service fails with
    /// [`ConnectError::Auth`]("service needs authentication").
    pub fn with_identity(mut self, credential: Credential) -> Self {
        self.credential = Some(Prover::Credential(Arc::new(credential)));
        self
    }

    /// Sends `make(nonce, service)` as the proof, whatever it holds: for tests that
    /// play a hostile client (a proof captured on one connection and replayed on
    /// another, truncated, oversized). Not for real clients: use
    /// [`with_identity`](Self::with_identity).
    #[doc(hidden)]
    pub fn with_raw_proof(mut self, make: RawProof) -> Self {
        self.credential = Some(Prover::Raw(make));
        self
    }

    /// Connects to `service` at `addr`.
    ///
    /// rdma_cm resends the request to a host that does not answer for about a minute
    /// before it reports it unreachable; to wait less, drop the future (a timeout
    /// around it): the connect then ends within a second, its cm_id and QP released.
    pub async fn connect(
        &self,
        addr: SocketAddr,
        service: &str,
    ) -> Result<ClientConnection<T>, ConnectError> {
        self.connect_inner(addr, None, service, None).await
    }

    /// [`connect`](Self::connect) from the local address `from` (one of this host's),
    /// not the one the route picks: a host with several addresses is several peers to a
    /// server that limits connections per peer address.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect); an address not on this host fails to resolve.
    pub async fn connect_from(
        &self,
        from: IpAddr,
        addr: SocketAddr,
        service: &str,
    ) -> Result<ClientConnection<T>, ConnectError> {
        self.connect_inner(addr, Some(from), service, None).await
    }

    /// Connects to `service` at `addr` with the application's own [`Session`] driving the
    /// connection, exactly as a server's service does: it sees every message and the
    /// completions of the one-sided operations it posts, on the connection's own thread,
    /// with no hop through a channel per message (the lowest-latency way to run a client
    /// protocol). The returned handle closes the connection and can still run one-sided
    /// operations; `request` and `recv` are not available, as messages go to `session`.
    pub async fn connect_session(
        &self,
        addr: SocketAddr,
        service: &str,
        session: impl Session<T>,
    ) -> Result<ClientConnection<T>, ConnectError> {
        self.connect_inner(addr, None, service, Some(Box::new(session)))
            .await
    }

    async fn connect_inner(
        &self,
        addr: SocketAddr,
        from: Option<IpAddr>,
        service: &str,
        session: Option<Box<dyn Session<T>>>,
    ) -> Result<ClientConnection<T>, ConnectError> {
        let (tx, rx) = oneshot::channel();
        self.cm.do_send(Connect {
            addr,
            from,
            service: service.to_owned(),
            dialer: Box::new(ClientDialer {
                reply: tx,
                user: session,
                started: None,
                credential: self.credential.clone(),
                service: service.to_owned(),
                nonce: NonceSlot::default(),
            }),
        });
        let (conn, ends) = rx.await.map_err(|_| ConnectError::ShuttingDown)??;
        let mut handle = ClientConnection {
            last: Arc::new(CloseOnDrop {
                conn: conn.clone(),
                closed: AtomicBool::new(false),
            }),
            conn,
            inbox: Arc::new(tokio::sync::Mutex::new(ends.inbox)),
            closed: ends.closed,
            pd: self.node.pd.clone(),
            identity: Identity::Anonymous,
        };
        // The server answers the proof, or closes with its reason, within its own
        // authentication timeout; this bound only covers a server that does neither.
        let wait = self.node.config.connection.handshake_timeout + DEFAULT_AUTH_TIMEOUT;
        let refused = match tokio::time::timeout(wait, ends.authenticated).await {
            Ok(Ok(Ok(identity))) => {
                handle.identity = identity;
                return Ok(handle);
            }
            Ok(Ok(Err(why))) => why,
            Ok(Err(_)) => "the connection ended before authentication".to_owned(),
            Err(_) => format!("no answer to the proof within {wait:?}"),
        };
        // Released before the error returns, so that nothing of it outlives the connect.
        handle.close().await;
        Err(ConnectError::Auth(refused))
    }

    /// Registers `len` bytes on the client's PD with `access`, for regions a server reads
    /// from or writes into (its rkey is good on every connection of this client; drop
    /// the region to revoke it).
    pub fn register(&self, len: usize, access: Access) -> Result<T::Region, T::Error> {
        self.node.pd.register(len, access)
    }

    /// Runs `fut` on the first poller thread, next to the connections it polls, and
    /// returns its output. Latency-critical loops avoid a thread wake-up per reply this
    /// way (with one poller, every connection lives on that thread).
    pub async fn run_on_poller<F>(&self, fut: F) -> Option<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        self.node.first_poller().spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.await.ok()
    }

    /// Current counters: connections open and closed, and the registered memory, to see
    /// that connections given up (closed or dropped) were released.
    pub async fn stats(&self) -> ClientStats {
        let c = self
            .cm
            .send(super::cm::GetCounters)
            .await
            .unwrap_or_default();
        ClientStats {
            connections: c.connections,
            closed: c.closed,
            pool: c.node.unwrap_or_default().pool,
        }
    }

    /// Closes every connection, waits for their release, and stops the actors.
    pub async fn shutdown(self) {
        super::cm::shut_down(&self.cm).await;
        drop(self.node);
    }
}

/// A connect of this client, as the CM actor's active connect sees it (`connect.rs`):
/// it starts the connection with a [`ClientSession`], and answers `connect_inner` with
/// the connection and the ends its handle reads.
struct ClientDialer<T: Transport> {
    reply: oneshot::Sender<Result<(ClientAddr<T>, ClientEnds), ConnectError>>,
    /// The application's own session, if any (see [`Client::connect_session`]).
    user: Option<Box<dyn Session<T>>>,
    started: Option<(ClientAddr<T>, ClientEnds)>,
    credential: Option<Prover>,
    service: String,
    /// Shared with the session: the welcome's nonce, put here before the connection
    /// hears it is established.
    nonce: NonceSlot,
}

type ClientAddr<T> = Addr<ConnectionActor<ClientSession<T>, T>>;

impl<T: Transport> Dialer<T> for ClientDialer<T> {
    fn start(&mut self, parts: ConnectionParts<(), T>) -> Recipient<CmNotice> {
        let (session, ends) = ClientSession::new(
            self.user.take(),
            self.credential.clone(),
            self.service.clone(),
            self.nonce.clone(),
        );
        let addr = ConnectionActor::start(with_session(parts, session));
        self.started = Some((addr.clone(), ends));
        addr.recipient()
    }

    fn welcomed(&mut self, welcome: &Welcome) {
        *self.nonce.lock().expect("not poisoned") = welcome.nonce;
    }

    fn established(self: Box<Self>) {
        if let Some(started) = self.started {
            let _ = self.reply.send(Ok(started));
        }
    }

    fn abandoned(&self) -> bool {
        self.reply.is_closed()
    }

    fn failed(self: Box<Self>, err: ConnectError) {
        let _ = self.reply.send(Err(err));
    }
}

/// One client connection. Cheap to clone; requests from several tasks interleave.
///
/// Dropping the last handle closes the connection, as [`close`](Self::close) does
/// (the server is told goodbye if the connection still can, and everything is released
/// on both sides), without waiting for it: a program that opens connections in a loop
/// and drops them does not leave each open until the server's idle limit. Call `close`
/// to wait until the resources are released.
pub struct ClientConnection<T: Transport = Verbs> {
    conn: ClientAddr<T>,
    inbox: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Incoming>>>,
    /// Why the connection closed, once it has: what a call made afterwards fails with.
    closed: ClosedReason,
    /// The client's PD, for [`ClientConnection::register`].
    pd: T::Domain,
    /// Shared by every clone: closes the connection when the last one goes.
    last: Arc<CloseOnDrop<T>>,
    /// Who the server knows this connection as.
    identity: Identity,
}

/// Closes a connection when dropped, unless [`ClientConnection::close`] already did.
///
/// Held in an `Arc` by every clone of a [`ClientConnection`], so that the connection
/// closes when its last handle goes, not its first.
struct CloseOnDrop<T: Transport> {
    conn: ClientAddr<T>,
    /// `close` sent the close already: a second would find the connection closing (the
    /// actor ignores it, or is gone), but it would be a message for nothing.
    closed: AtomicBool,
}

impl<T: Transport> Drop for CloseOnDrop<T> {
    fn drop(&mut self) {
        if *self.closed.get_mut() {
            return;
        }
        // Nobody waits for the release: the receiver goes now. A connection that
        // already ended has no actor any more, and the message is dropped unread.
        let (done, _) = oneshot::channel();
        self.conn.do_send(ClientCall::Close { done });
    }
}

impl<T: Transport> Clone for ClientConnection<T> {
    fn clone(&self) -> Self {
        ClientConnection {
            conn: self.conn.clone(),
            inbox: self.inbox.clone(),
            closed: self.closed.clone(),
            pd: self.pd.clone(),
            last: self.last.clone(),
            identity: self.identity.clone(),
        }
    }
}

impl<T: Transport> std::fmt::Debug for ClientConnection<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConnection").finish()
    }
}

impl<T: Transport> ClientConnection<T> {
    async fn call<R>(
        &self,
        make: impl FnOnce(Reply<R>) -> ClientCall<T>,
    ) -> Result<R, RequestError> {
        let (tx, rx) = oneshot::channel();
        self.conn.do_send(make(tx));
        rx.await.map_err(|_| {
            let reason = self.closed.lock().expect("not poisoned").clone();
            RequestError::Closed(reason.unwrap_or(CloseReason::Local("connection gone".into())))
        })?
    }

    /// Who the server knows this connection as: the identity it proved, or anonymous
    /// on a service that asked no proof.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Why the connection closed, once it has (the server's own reason when it said
    /// one: [`CloseReason::PeerClosed`]).
    pub fn close_reason(&self) -> Option<CloseReason> {
        self.closed.lock().expect("not poisoned").clone()
    }

    /// Sends a one-way message (tag 0), for protocols that are not request/response.
    /// Queued behind earlier messages; fails only when the connection is closing.
    pub async fn send(&self, data: Vec<u8>) -> Result<(), RequestError> {
        self.call(|reply| ClientCall::Send { data, reply }).await
    }

    /// Sends several one-way messages (tag 0) in order, with one hand-off to the
    /// connection for all of them: the connection posts as many as credits allow in one
    /// turn, under one doorbell. For streams of small messages.
    pub async fn send_all(&self, data: Vec<Vec<u8>>) -> Result<(), RequestError> {
        self.call(|reply| ClientCall::SendAll { data, reply }).await
    }

    /// The next message the server sent on its own (tag 0) or delivered with an
    /// immediate (WRITE_WITH_IMM into a region this client granted). `None` once the
    /// connection is closed.
    pub async fn recv(&self) -> Option<Incoming> {
        self.inbox.lock().await.recv().await
    }

    /// Sends `data` and waits for the service's reply.
    pub async fn request(&self, data: Vec<u8>) -> Result<Vec<u8>, RequestError> {
        self.call(|reply| ClientCall::Request { data, reply }).await
    }

    /// Serializes `req` with postcard, sends it and decodes the reply.
    pub async fn request_typed<Req, Resp>(&self, req: &Req) -> Result<Resp, RequestError>
    where
        Req: serde::Serialize,
        Resp: serde::de::DeserializeOwned,
    {
        let bytes = postcard::to_allocvec(req).map_err(|e| RequestError::Invalid(e.to_string()))?;
        let resp = self.request(bytes).await?;
        postcard::from_bytes(&resp).map_err(|e| RequestError::Invalid(format!("bad reply: {e}")))
    }

    /// Calls the [`RequestHandler`](super::RequestHandler) the connection's service runs
    /// (a [`HandlerService`](super::HandlerService)): sends `req` and returns the
    /// handler's answer, or its error typed as it returned it
    /// ([`CallError::Handler`]). The types must be the handler's `Req`, `Resp` and
    /// `Error`; name them in the result's type, or in a typed helper of your service's
    /// client, as postcard cannot tell one type from another on the wire.
    pub async fn call_typed<Req, Resp, E>(&self, req: &Req) -> Result<Resp, CallError<E>>
    where
        Req: serde::Serialize,
        Resp: serde::de::DeserializeOwned,
        E: serde::de::DeserializeOwned,
    {
        let bytes = postcard::to_allocvec(req)
            .map_err(|e| RequestError::Invalid(format!("request not encoded: {e}")))?;
        let answer = self.request(bytes).await?;
        match postcard::from_bytes(&answer) {
            Ok(Answer::Ok(resp)) => Ok(resp),
            Ok(Answer::Err(e)) => Err(CallError::Handler(e)),
            Ok(Answer::Refused(why)) => Err(CallError::Refused(why)),
            Err(e) => Err(CallError::BadAnswer(e.to_string())),
        }
    }

    /// RDMA READs `len` bytes of `remote`.
    pub async fn read(&self, remote: RemoteRegion, len: usize) -> Result<Vec<u8>, RequestError> {
        self.call(|reply| ClientCall::Read { remote, len, reply })
            .await
    }

    /// RDMA WRITEs `data` to `remote` (with an immediate when `imm` is set).
    pub async fn write(
        &self,
        remote: RemoteRegion,
        data: Vec<u8>,
        imm: Option<u32>,
    ) -> Result<(), RequestError> {
        self.call(|reply| ClientCall::Write {
            remote,
            data,
            imm,
            reply,
        })
        .await
    }

    /// Registers `len` bytes on the PD this connection uses (the client's), with
    /// `access`: what [`Client::register`] does, for code that only holds a connection.
    pub fn register(&self, len: usize, access: Access) -> Result<T::Region, T::Error> {
        self.pd.register(len, access)
    }

    /// RDMA WRITEs `src[range]` to `remote` in place (with an immediate when `imm` is
    /// set), without the copy into a pool buffer that [`write`](Self::write) makes, and
    /// hands `src` back once the WRITE completed, to be refilled. `src` must be registered
    /// on this client's PD ([`Client::register`]; no access flags are needed for the NIC
    /// to read it). On an error the region is dropped (deregistered).
    pub async fn write_from(
        &self,
        src: T::Region,
        range: Range<usize>,
        remote: RemoteRegion,
        imm: Option<u32>,
    ) -> Result<T::Region, RequestError> {
        self.call(|reply| ClientCall::WriteFrom {
            src,
            range,
            remote,
            imm,
            reply,
        })
        .await
    }

    /// Compare-and-swap; returns the old value.
    pub async fn compare_swap(
        &self,
        remote: RemoteRegion,
        compare: u64,
        swap: u64,
    ) -> Result<u64, RequestError> {
        self.call(|reply| ClientCall::Atomic {
            op: AtomicOp::CompareSwap { compare, swap },
            remote,
            reply,
        })
        .await
    }

    /// Fetch-and-add; returns the old value.
    pub async fn fetch_add(&self, remote: RemoteRegion, add: u64) -> Result<u64, RequestError> {
        self.call(|reply| ClientCall::Atomic {
            op: AtomicOp::FetchAdd { add },
            remote,
            reply,
        })
        .await
    }

    /// Closes the connection (for every clone of this handle) and waits until its
    /// resources are released. Dropping the last handle closes it too, without waiting.
    pub async fn close(self) {
        self.last.closed.store(true, Ordering::Release);
        let (tx, rx) = oneshot::channel();
        self.conn.do_send(ClientCall::Close { done: tx });
        let _ = rx.await;
    }
}
