//! Active connect, on the CM actor's event channel: resolve the address, resolve the
//! route, prepare the QP and start the connection (which makes the `rdma_connect` call
//! itself, see `Handshake`), then ESTABLISHED with the server's welcome, or a typed
//! failure.
//!
//! Whoever asked (a [`Dialer`]: the client) makes the connection's session and starts
//! its actor, so this module knows no client type: `client.rs` depends on it, never the
//! reverse.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use actix::prelude::*;

use super::close::CloseReason;
use super::conn_set::{fmt_addr, ConnSet};
use super::connection::{
    CmCall, CmNotice, ConnClosed, ConnectionParts, Handshake, HandshakeFailed,
};
use super::node::Node;
use super::service::Framing;
use crate::proto::hello::{Hello, Reject, Welcome, PROTOCOL_VERSION};
use crate::transport::{CmEvent, CmEventKind, CmId, Domain, Transport, Verbs};

/// Time allowed for address and route resolution.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// Its caller stopped waiting (the connect future was dropped): the connect was
    /// ended and its cm_id and QP released, not left to rdma_cm's own verdict.
    #[error("given up by its caller")]
    Abandoned,
    /// The service is authenticated-only and refused this client's proof (or its lack
    /// of one); the text is the server's reason ("unknown identity", "bad proof",
    /// "service needs authentication", ...).
    #[error("authentication refused: {0}")]
    Auth(String),
}

/// The side that asked for an active connection: it makes the connection's session and
/// hears how the connect ended. Exactly one of `established` and `failed` is called.
pub(crate) trait Dialer<T: Transport = Verbs>: Send + 'static {
    /// Starts the connection's actor on `parts` with a session of its own (see
    /// [`with_session`]); returns where the CM actor's notices for it go.
    fn start(&mut self, parts: ConnectionParts<(), T>) -> Recipient<CmNotice>;

    /// The server's welcome arrived (after `start`), before the connection hears it is
    /// established: what it carries for the session (an authentication nonce) is in
    /// place when the session's `on_established` runs.
    fn welcomed(&mut self, _welcome: &Welcome) {}

    /// The connection is established (after `start`).
    fn established(self: Box<Self>);

    /// The connect failed; a connection already started has been told to close.
    fn failed(self: Box<Self>, err: ConnectError);

    /// Whether the side that asked stopped waiting. rdma_cm gives a connect to a dead
    /// host up only after resending its request for about a minute; a caller that
    /// bounds its wait drops the connect sooner, and then the connect ends (its cm_id
    /// and QP released) at the CM actor's next tick, and a connection it would have
    /// made is closed rather than left open with no handle.
    fn abandoned(&self) -> bool {
        false
    }
}

/// `parts` with the dialer's `session`.
pub(crate) fn with_session<S, T: Transport>(
    parts: ConnectionParts<(), T>,
    session: S,
) -> ConnectionParts<S, T> {
    ConnectionParts {
        session,
        core: parts.core,
        cm: parts.cm,
        key: parts.key,
        label: parts.label,
        handshake: parts.handshake,
        handed_over: parts.handed_over,
    }
}

/// Starts an active connection (client side).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Connect<T: Transport = Verbs> {
    pub addr: SocketAddr,
    /// The local address to connect from (`None`: the route's).
    pub from: Option<IpAddr>,
    pub service: String,
    pub dialer: Box<dyn Dialer<T>>,
}

struct Connecting<T: Transport> {
    id: T::CmId,
    service: String,
    dialer: Box<dyn Dialer<T>>,
    /// The connection, once started (route resolved).
    conn: Option<Recipient<CmNotice>>,
}

impl<T: Transport> Connecting<T> {
    /// Ends the connect: the connection (if started) closes for `close`, the dialer
    /// hears `err`. The cm_id is handed back, to be destroyed by the caller.
    fn fail(self, close: CloseReason, err: ConnectError) -> T::CmId {
        if let Some(conn) = &self.conn {
            conn.do_send(CmNotice::Close(close));
        }
        self.dialer.failed(err);
        self.id
    }
}

/// Where a started connection reports to: the CM actor.
pub(crate) struct Reports<T: Transport = Verbs> {
    pub closed: Recipient<ConnClosed<T::CmIdKey>>,
    pub failed: Recipient<HandshakeFailed<T::CmIdKey>>,
}

/// The active connects under way, by cm_id.
pub(crate) struct Dialing<T: Transport = Verbs> {
    connecting: HashMap<T::CmIdKey, Connecting<T>>,
}

impl<T: Transport> Default for Dialing<T> {
    fn default() -> Self {
        Dialing {
            connecting: HashMap::new(),
        }
    }
}

impl<T: Transport> Dialing<T> {
    /// Whether the event's id is one of ours.
    pub fn has(&self, key: T::CmIdKey) -> bool {
        self.connecting.contains_key(&key)
    }

    /// Starts resolving `msg.addr` on a new id of `channel`, made on `node`'s device
    /// (`None`: the device is gone); a failure is answered now.
    pub fn begin(&mut self, node: Option<&Node<T>>, channel: &T::EventChannel, msg: Connect<T>) {
        let Some(node) = node else {
            let gone = ConnectError::Resources("the RDMA device is gone".into());
            return msg.dialer.failed(gone);
        };
        let id = match node.pd.create_id(channel) {
            Ok(id) => id,
            Err(e) => return msg.dialer.failed(ConnectError::Verbs(e.to_string())),
        };
        let src = msg.from.map(|ip| SocketAddr::new(ip, 0));
        if let Err(e) = id.resolve_addr(src, msg.addr, RESOLVE_TIMEOUT) {
            return msg.dialer.failed(ConnectError::Verbs(e.to_string()));
        }
        self.connecting.insert(
            id.key(),
            Connecting {
                id,
                service: msg.service,
                dialer: msg.dialer,
                conn: None,
            },
        );
    }

    /// Ends connect `key` with `err` (its connection, if started, closes with it).
    pub fn fail(&mut self, key: T::CmIdKey, err: ConnectError) {
        if let Some(c) = self.connecting.remove(&key) {
            drop(c.fail(CloseReason::Local(err.to_string()), err));
        }
    }

    /// Ends the connects whose dialer stopped waiting ([`Dialer::abandoned`]).
    pub fn end_abandoned(&mut self) {
        let gone: Vec<T::CmIdKey> = self
            .connecting
            .iter()
            .filter(|(_, c)| c.dialer.abandoned())
            .map(|(&key, _)| key)
            .collect();
        for key in gone {
            self.fail(key, ConnectError::Abandoned);
        }
    }

    /// Ends every connect: started connections close for `close`, dialers hear what
    /// `err` makes. The ids are handed back, to be destroyed by the caller.
    pub fn fail_all(
        &mut self,
        close: &CloseReason,
        err: impl Fn() -> ConnectError,
    ) -> Vec<T::CmId> {
        self.connecting
            .drain()
            .map(|(_, c)| c.fail(close.clone(), err()))
            .collect()
    }

    /// An event of one of our ids. A connection started on a resolved route joins
    /// `conns`; `node` is the node while the device serves.
    pub fn on_event<G: Default>(
        &mut self,
        ev: T::CmEvent,
        node: Option<&Node<T>>,
        reports: Reports<T>,
        conns: &mut ConnSet<G, T::CmIdKey>,
    ) {
        let key = ev.id();
        match ev.kind() {
            CmEventKind::AddrResolved => {
                let c = &self.connecting[&key];
                if let Err(e) = c.id.resolve_route(RESOLVE_TIMEOUT) {
                    self.fail(key, ConnectError::Verbs(e.to_string()));
                }
            }
            CmEventKind::RouteResolved => self.on_route_resolved(key, node, reports, conns),
            CmEventKind::Established => {
                let welcome = Welcome::decode(ev.private_data());
                let Some(mut c) = self.connecting.remove(&key) else {
                    return;
                };
                if c.dialer.abandoned() {
                    let why = CloseReason::Local(ConnectError::Abandoned.to_string());
                    drop(c.fail(why, ConnectError::Abandoned));
                    return;
                }
                let Some(conn) = c.conn.clone() else {
                    return;
                };
                let Some(welcome) = welcome else {
                    let why = CloseReason::Protocol("accept without a welcome".into());
                    drop(c.fail(why, ConnectError::NotRdmactor));
                    return;
                };
                c.dialer.welcomed(&welcome);
                let depth = Some((welcome.advert(), welcome.recv_size));
                conn.do_send(CmNotice::Established { peer: depth });
                c.dialer.established();
            }
            CmEventKind::Rejected => {
                let err = match Reject::decode(ev.private_data()) {
                    Some(r) => ConnectError::Rejected(r),
                    None => ConnectError::RejectedByTransport(ev.status()),
                };
                self.fail(key, err);
            }
            kind => {
                let err = ConnectError::Failed {
                    event: format!("{kind:?}"),
                    status: ev.status(),
                };
                self.fail(key, err);
            }
        }
    }

    fn on_route_resolved<G: Default>(
        &mut self,
        key: T::CmIdKey,
        node: Option<&Node<T>>,
        reports: Reports<T>,
        conns: &mut ConnSet<G, T::CmIdKey>,
    ) {
        let Some(c) = self.connecting.get_mut(&key) else {
            return;
        };
        let id = c.id.clone();
        let service = c.service.clone();
        let Some(node) = node else {
            return self.fail(
                key,
                ConnectError::Resources("the RDMA device is gone".into()),
            );
        };
        let mut core = match node.prepare(&id, Framing::Framed, None) {
            Ok(core) => core,
            Err(e) => return self.fail(key, ConnectError::Resources(e)),
        };
        core.count_as(crate::metrics::Side::Client, &service);
        let qp_num = core.qp_num();
        let label = format!(
            "client/{}/qp{}/{}",
            fmt_addr(id.peer_addr()),
            qp_num,
            service
        );
        let ours = node.advert();
        let hello = Hello {
            version: PROTOCOL_VERSION,
            service,
            recv_depth: ours.initial as u16,
            recv_size: node.config.receives.size,
            max_credits: ours.max as u16,
        };
        let private_data = match hello.encode() {
            Ok(d) => d,
            Err(e) => return self.fail(key, ConnectError::Verbs(e.to_string())),
        };
        // The actor connects once it has registered with its poller (see `Handshake`).
        let handshake = Handshake::Connect(CmCall {
            private_data,
            responder_resources: 16,
            initiator_depth: 16,
            rnr_retry_count: node.config.connection.rnr_retry_count,
            retry_count: node.config.connection.retry_count,
            failed: reports.failed,
        });
        let conn = c.dialer.start(ConnectionParts {
            core,
            session: (),
            cm: reports.closed,
            key,
            label,
            handshake,
            handed_over: Instant::now(),
        });
        conns.insert(key, qp_num, conn.clone(), G::default());
        c.conn = Some(conn);
    }
}
