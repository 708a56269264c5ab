//! The client side, on the same machinery as the server: one CM actor, pollers and
//! connection actors, so one process can drive thousands of connections.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::sync::Arc;

use actix::prelude::*;
use tokio::sync::{mpsc, oneshot};

use super::cm::{CmActor, Connect};
use super::config::NodeConfig;
use super::connection::{BufId, ConnectionActor, Op};
use super::node::Node;
use super::service::{Message, OpId, Session, SessionError};
use super::{CloseReason, SessionCx};
use crate::proto::hello::Reject;
use crate::verbs::{
    Access, EventChannel, MemoryRegion, ProtectionDomain, RemoteRegion, VerbsError,
};

/// Why a connect failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The server rejected the connection and said why.
    #[error("rejected by the server: {0}")]
    Rejected(Reject),
    /// Rejected without an rdmactor reason: the CM's own reject status, printed with its
    /// meaning (see [`transport_reject`](crate::verbs::transport_reject)).
    #[error("rejected by the transport: {}", crate::verbs::transport_reject(*.0))]
    RejectedByTransport(i32),
    /// The server accepted but is not an rdmactor server.
    #[error("the peer is not an rdmactor server")]
    NotRdmactor,
    /// Address/route resolution or connection failed (UNREACHABLE, ADDR_ERROR, ...).
    #[error("{event} (status {status})")]
    Failed {
        /// The rdma_cm event.
        event: String,
        /// Its status.
        status: i32,
    },
    /// Local resources for the connection could not be set up.
    #[error("local resources: {0}")]
    Resources(String),
    /// A verb failed.
    #[error("{0}")]
    Verbs(String),
    /// The client is shutting down.
    #[error("client is shutting down")]
    ShuttingDown,
}

/// Why a request or one-sided operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The connection closed before the answer arrived.
    #[error("connection closed: {0}")]
    Closed(CloseReason),
    /// The server refused the message: larger than the service takes, or than the
    /// connection's budget. Nothing of it was delivered; the connection goes on.
    #[error("refused by the peer: {0}")]
    Refused(crate::proto::budget::BudgetError),
    /// The operation completed with an error status (for example a remote access error).
    #[error("operation failed: {0}")]
    Failed(String),
    /// The request could not be queued.
    #[error("{0}")]
    Invalid(String),
}

/// A client: device resources plus a CM actor for outgoing connections.
pub struct Client {
    node: Arc<Node>,
    cm: Addr<CmActor>,
}

impl Client {
    /// Opens the device and starts the client's actors. Must run inside an actix System.
    pub fn start(config: NodeConfig) -> Result<Client, VerbsError> {
        let node = Node::start(config)?;
        let channel = EventChannel::new()?;
        let cm = CmActor::new(
            node.clone(),
            channel,
            Arc::new(HashMap::new()),
            super::budget::QpBudget::new(usize::MAX),
            0,
        )
        .start();
        Ok(Client { node, cm })
    }

    /// Connects to `service` at `addr`.
    pub async fn connect(
        &self,
        addr: SocketAddr,
        service: &str,
    ) -> Result<ClientConnection, ConnectError> {
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
    ) -> Result<ClientConnection, ConnectError> {
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
        session: impl Session,
    ) -> Result<ClientConnection, ConnectError> {
        self.connect_inner(addr, None, service, Some(Box::new(session)))
            .await
    }

    async fn connect_inner(
        &self,
        addr: SocketAddr,
        from: Option<IpAddr>,
        service: &str,
        session: Option<Box<dyn Session>>,
    ) -> Result<ClientConnection, ConnectError> {
        let (tx, rx) = oneshot::channel();
        self.cm.do_send(Connect {
            addr,
            from,
            service: service.to_owned(),
            reply: tx,
            session,
        });
        let (conn, ends) = rx.await.map_err(|_| ConnectError::ShuttingDown)??;
        Ok(ClientConnection {
            conn,
            inbox: Arc::new(tokio::sync::Mutex::new(ends.inbox)),
            closed: ends.closed,
            pd: self.node.pd.clone(),
        })
    }

    /// Registers `len` bytes on the client's PD with `access`, for regions a server reads
    /// from or writes into (its rkey is good on every connection of this client; drop
    /// the region to revoke it).
    pub fn register(&self, len: usize, access: Access) -> Result<MemoryRegion, VerbsError> {
        MemoryRegion::register(&self.node.pd, len, access)
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

    /// Closes every connection, waits for their release, and stops the actors.
    pub async fn shutdown(self) {
        super::cm::shut_down(&self.cm).await;
        drop(self.node);
    }
}

/// One client connection. Cheap to clone; requests from several tasks interleave.
#[derive(Clone)]
pub struct ClientConnection {
    conn: Addr<ConnectionActor<ClientSession>>,
    inbox: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Message>>>,
    /// Why the connection closed, once it has: what a call made afterwards fails with.
    closed: ClosedReason,
    /// The client's PD, for [`ClientConnection::register`].
    pd: ProtectionDomain,
}

impl std::fmt::Debug for ClientConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConnection").finish()
    }
}

type Reply<T> = oneshot::Sender<Result<T, RequestError>>;

impl ClientConnection {
    async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> ClientCall) -> Result<T, RequestError> {
        let (tx, rx) = oneshot::channel();
        self.conn.do_send(make(tx));
        rx.await.map_err(|_| {
            let reason = self.closed.lock().expect("not poisoned").clone();
            RequestError::Closed(reason.unwrap_or(CloseReason::Local("connection gone".into())))
        })?
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
    pub async fn recv(&self) -> Option<Message> {
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
    pub fn register(&self, len: usize, access: Access) -> Result<MemoryRegion, VerbsError> {
        MemoryRegion::register(&self.pd, len, access)
    }

    /// RDMA WRITEs `src[range]` to `remote` in place (with an immediate when `imm` is
    /// set), without the copy into a pool buffer that [`write`](Self::write) makes, and
    /// hands `src` back once the WRITE completed, to be refilled. `src` must be registered
    /// on this client's PD ([`Client::register`]; no access flags are needed for the NIC
    /// to read it). On an error the region is dropped (deregistered).
    pub async fn write_from(
        &self,
        src: MemoryRegion,
        range: Range<usize>,
        remote: RemoteRegion,
        imm: Option<u32>,
    ) -> Result<MemoryRegion, RequestError> {
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

    /// Closes the connection and waits until its resources are released.
    pub async fn close(self) {
        let (tx, rx) = oneshot::channel();
        self.conn.do_send(ClientCall::Close { done: tx });
        let _ = rx.await;
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum AtomicOp {
    CompareSwap { compare: u64, swap: u64 },
    FetchAdd { add: u64 },
}

#[derive(Message)]
#[rtype(result = "()")]
pub(crate) enum ClientCall {
    Send {
        data: Vec<u8>,
        reply: Reply<()>,
    },
    SendAll {
        data: Vec<Vec<u8>>,
        reply: Reply<()>,
    },
    Request {
        data: Vec<u8>,
        reply: Reply<Vec<u8>>,
    },
    Read {
        remote: RemoteRegion,
        len: usize,
        reply: Reply<Vec<u8>>,
    },
    Write {
        remote: RemoteRegion,
        data: Vec<u8>,
        imm: Option<u32>,
        reply: Reply<()>,
    },
    WriteFrom {
        src: MemoryRegion,
        range: Range<usize>,
        remote: RemoteRegion,
        imm: Option<u32>,
        reply: Reply<MemoryRegion>,
    },
    Atomic {
        op: AtomicOp,
        remote: RemoteRegion,
        reply: Reply<u64>,
    },
    Close {
        done: oneshot::Sender<()>,
    },
}

enum PendingOp {
    Read(BufId, usize, Reply<Vec<u8>>),
    Write(BufId, Reply<()>),
    WriteFrom(BufId, Reply<MemoryRegion>),
    Atomic(BufId, Reply<u64>),
}

/// Where a client connection's close reason is kept for its handles.
type ClosedReason = Arc<std::sync::Mutex<Option<CloseReason>>>;

/// What a [`ClientConnection`] reads from its session: unsolicited messages, and the
/// close reason.
pub(crate) struct ClientEnds {
    inbox: mpsc::UnboundedReceiver<Message>,
    closed: ClosedReason,
}

/// The session behind a [`ClientConnection`]: matches replies to requests by tag and
/// completions to one-sided operations by id.
pub(crate) struct ClientSession {
    next_tag: u32,
    requests: HashMap<u32, Reply<Vec<u8>>>,
    ops: HashMap<OpId, PendingOp>,
    inbox: mpsc::UnboundedSender<Message>,
    closed: ClosedReason,
    /// The application's session (see [`Client::connect_session`]), which then gets
    /// every message and the completions of its own operations.
    user: Option<Box<dyn Session>>,
}

impl ClientSession {
    /// A session and the ends its [`ClientConnection`] reads.
    pub(crate) fn new(user: Option<Box<dyn Session>>) -> (ClientSession, ClientEnds) {
        let (tx, rx) = mpsc::unbounded_channel();
        let closed = ClosedReason::default();
        let session = ClientSession {
            // Tag 0 is reserved for one-way messages in both directions.
            next_tag: 1,
            requests: HashMap::new(),
            ops: HashMap::new(),
            inbox: tx,
            closed: closed.clone(),
            user,
        };
        (session, ClientEnds { inbox: rx, closed })
    }
}

impl Session for ClientSession {
    fn on_established(&mut self, cx: &mut SessionCx<'_>) -> Result<(), SessionError> {
        match &mut self.user {
            Some(user) => user.on_established(cx),
            None => Ok(()),
        }
    }

    fn on_message(&mut self, cx: &mut SessionCx<'_>, msg: Message) -> Result<(), SessionError> {
        if let Some(user) = &mut self.user {
            return user.on_message(cx, msg);
        }
        if msg.tag == 0 {
            // Unsolicited (one-way message or WRITE_WITH_IMM); nobody listening is fine.
            let _ = self.inbox.send(msg);
            return Ok(());
        }
        match self.requests.remove(&msg.tag) {
            Some(reply) => {
                let _ = reply.send(Ok(msg.data));
                Ok(())
            }
            None => Err(SessionError::new(format!(
                "reply with unknown tag {}",
                msg.tag
            ))),
        }
    }

    fn on_op(
        &mut self,
        cx: &mut SessionCx<'_>,
        op: OpId,
        result: crate::verbs::Result<()>,
    ) -> Result<(), SessionError> {
        let Some(pending) = self.ops.remove(&op) else {
            return match &mut self.user {
                Some(user) => user.on_op(cx, op, result),
                None => Err(SessionError::new(format!("completion of unknown {op:?}"))),
            };
        };
        let fail = |e: &VerbsError| RequestError::Failed(e.to_string());
        match pending {
            PendingOp::Read(buf, len, reply) => {
                let out = match &result {
                    Ok(()) => Ok(cx.bytes(buf)?[..len].to_vec()),
                    Err(e) => Err(fail(e)),
                };
                cx.free(buf);
                let _ = reply.send(out);
            }
            PendingOp::Write(buf, reply) => {
                cx.free(buf);
                let _ = reply.send(result.as_ref().map(|_| ()).map_err(fail));
            }
            PendingOp::WriteFrom(buf, reply) => {
                let out = match &result {
                    Ok(()) => cx.take_back(buf).ok_or_else(|| {
                        RequestError::Invalid("the written region could not be handed back".into())
                    }),
                    Err(e) => Err(fail(e)),
                };
                if out.is_err() {
                    // Not handed back: the connection keeps (and drops) it.
                    cx.free(buf);
                }
                let _ = reply.send(out);
            }
            PendingOp::Atomic(buf, reply) => {
                let out = match &result {
                    Ok(()) => Ok(u64::from_ne_bytes(
                        cx.bytes(buf)?[..8].try_into().expect("8 bytes"),
                    )),
                    Err(e) => Err(fail(e)),
                };
                cx.free(buf);
                let _ = reply.send(out);
            }
        }
        Ok(())
    }

    fn on_refused(
        &mut self,
        cx: &mut SessionCx<'_>,
        tag: u32,
        why: crate::proto::budget::BudgetError,
    ) -> Result<(), SessionError> {
        if let Some(user) = &mut self.user {
            return user.on_refused(cx, tag, why);
        }
        match self.requests.remove(&tag) {
            Some(reply) => drop(reply.send(Err(RequestError::Refused(why)))),
            // A one-way message: nobody waits for it, so the log is where it shows.
            None => tracing::warn!(tag, %why, "the peer refused a message"),
        }
        Ok(())
    }

    fn on_close(&mut self, reason: &CloseReason) {
        *self.closed.lock().expect("not poisoned") = Some(reason.clone());
        if let Some(user) = &mut self.user {
            user.on_close(reason);
        }
        // Replies will not come any more. One-sided operations still get their own
        // completion (their real status, or a flush) while the connection drains; any
        // left unanswered end with the session, as "connection gone".
        for (_, reply) in self.requests.drain() {
            let _ = reply.send(Err(RequestError::Closed(reason.clone())));
        }
    }
}

impl ClientSession {
    fn handle(&mut self, call: ClientCall, cx: &mut SessionCx<'_>) -> Result<(), SessionError> {
        let invalid = |e: SessionError| RequestError::Invalid(e.0);
        match call {
            ClientCall::Send { data, reply } => {
                let _ = reply.send(cx.send(0, data).map_err(invalid));
            }
            ClientCall::SendAll { data, reply } => {
                let sent = data.into_iter().try_for_each(|d| cx.send(0, d));
                let _ = reply.send(sent.map_err(invalid));
            }
            ClientCall::Request { reply, .. } if self.user.is_some() => {
                let why = "this connection's messages go to its own session";
                drop(reply.send(Err(RequestError::Invalid(why.into()))));
            }
            ClientCall::Request { data, reply } => {
                let tag = self.next_tag;
                self.next_tag = self.next_tag.checked_add(1).unwrap_or(1);
                match cx.send(tag, data) {
                    Ok(()) => {
                        self.requests.insert(tag, reply);
                    }
                    Err(e) => drop(reply.send(Err(invalid(e)))),
                }
            }
            ClientCall::Read { remote, len, reply } => {
                let started = cx.alloc(len.max(1)).and_then(|buf| {
                    cx.post(Op::Read {
                        buf,
                        range: 0..len,
                        src: remote,
                    })
                    .map(|op| (op, buf))
                });
                match started {
                    Ok((op, buf)) => drop(self.ops.insert(op, PendingOp::Read(buf, len, reply))),
                    Err(e) => drop(reply.send(Err(invalid(e)))),
                }
            }
            ClientCall::Write {
                remote,
                data,
                imm,
                reply,
            } => {
                let started = cx.alloc(data.len().max(1)).and_then(|buf| {
                    cx.bytes_mut(buf)?[..data.len()].copy_from_slice(&data);
                    cx.post(Op::Write {
                        buf,
                        range: 0..data.len(),
                        dst: remote,
                        imm,
                    })
                    .map(|op| (op, buf))
                });
                match started {
                    Ok((op, buf)) => drop(self.ops.insert(op, PendingOp::Write(buf, reply))),
                    Err(e) => drop(reply.send(Err(invalid(e)))),
                }
            }
            ClientCall::WriteFrom {
                src,
                range,
                remote,
                imm,
                reply,
            } => {
                let started = cx.adopt(src).and_then(|buf| {
                    let posted = cx.post(Op::Write {
                        buf,
                        range,
                        dst: remote,
                        imm,
                    });
                    if posted.is_err() {
                        cx.free(buf);
                    }
                    posted.map(|op| (op, buf))
                });
                match started {
                    Ok((op, buf)) => drop(self.ops.insert(op, PendingOp::WriteFrom(buf, reply))),
                    Err(e) => drop(reply.send(Err(invalid(e)))),
                }
            }
            ClientCall::Atomic { op, remote, reply } => {
                let started = cx.alloc(8).and_then(|buf| {
                    let spec = match op {
                        AtomicOp::CompareSwap { compare, swap } => Op::CompareSwap {
                            buf,
                            offset: 0,
                            remote,
                            compare,
                            swap,
                        },
                        AtomicOp::FetchAdd { add } => Op::FetchAdd {
                            buf,
                            offset: 0,
                            remote,
                            add,
                        },
                    };
                    cx.post(spec).map(|op| (op, buf))
                });
                match started {
                    Ok((op, buf)) => drop(self.ops.insert(op, PendingOp::Atomic(buf, reply))),
                    Err(e) => drop(reply.send(Err(invalid(e)))),
                }
            }
            ClientCall::Close { .. } => unreachable!("handled by the actor"),
        }
        Ok(())
    }
}

impl Handler<ClientCall> for ConnectionActor<ClientSession> {
    type Result = ();

    fn handle(&mut self, call: ClientCall, _: &mut Context<Self>) {
        let _guard = super::poller::AbortOnUnwind::new("client connection actor");
        let mut conn = self.conn();
        if let ClientCall::Close { done } = call {
            conn.when_released(done);
            conn.begin_close(CloseReason::Local("closed by the client".into()));
            return;
        }
        let mut call = Some(call);
        conn.with_session(|s, cx| s.handle(call.take().expect("once"), cx));
        if let Some(call) = call {
            // The connection is closing: answer instead of dropping the caller.
            let reason = conn.close_reason().cloned();
            let err = RequestError::Closed(
                reason.unwrap_or_else(|| CloseReason::Local("connection closing".into())),
            );
            match call {
                ClientCall::Request { reply, .. } | ClientCall::Read { reply, .. } => {
                    drop(reply.send(Err(err)))
                }
                ClientCall::Write { reply, .. }
                | ClientCall::Send { reply, .. }
                | ClientCall::SendAll { reply, .. } => drop(reply.send(Err(err))),
                ClientCall::Atomic { reply, .. } => drop(reply.send(Err(err))),
                ClientCall::WriteFrom { reply, .. } => drop(reply.send(Err(err))),
                ClientCall::Close { .. } => {}
            }
        }
    }
}
