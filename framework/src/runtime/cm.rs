//! The CM actor: owns the rdma_cm event channel, the listening ids and the bookkeeping of
//! every connection. A dedicated thread reads the (non-blocking) channel and forwards
//! each event as a message, so the actor system never blocks in `rdma_get_cm_event`.
//!
//! Passive side: CONNECT_REQUEST → admission (limit, service from the private data or
//! the listener's default, version) → QP on the shared PD, receives posted → accept, or
//! reject with a reason the client can read. Active side: resolve address → resolve route
//! → QP → connect → ESTABLISHED or a typed failure.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::oneshot;

use super::budget::QpBudget;
use super::client::{ClientSession, ConnectError};
use super::connection::{
    CmCall, CmNotice, ConnClosed, ConnectionActor, ConnectionParts, Handshake, HandshakeFailed,
};
use super::node::Node;
use super::recovery::{self, DeviceSlot, GoneDevice, Relisten};
use super::service::{Framing, PeerInfo, Service, Session};
use super::CloseReason;
use crate::proto::credits::{Advert, MIN_DEPTH};
use crate::proto::hello::{Hello, Reject, RejectCode, Welcome, PROTOCOL_VERSION};
use crate::verbs::{CmEvent, CmEventKind, CmId, CmIdKey, EventChannel};

/// Time allowed for address and route resolution.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) type Services = Arc<HashMap<String, Arc<dyn Service>>>;

struct Listening {
    _id: CmId,
    default_service: Option<String>,
}

type ClientAddr = Addr<ConnectionActor<ClientSession>>;
type Inbox = super::client::ClientEnds;

struct Connecting {
    id: CmId,
    service: String,
    reply: Option<oneshot::Sender<Result<(ClientAddr, Inbox), ConnectError>>>,
    conn: Option<ClientAddr>,
    inbox: Option<Inbox>,
    session: Option<Box<dyn Session>>,
}

/// Counters the CM actor keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CmCounters {
    pub connections: usize,
    /// QPs under the connection limit, rdma_cm and out-of-band together.
    pub qps: usize,
    pub accepted: u64,
    pub rejected: u64,
    pub closed: u64,
    /// Times the device was lost (removed or failed).
    pub device_losses: u64,
    /// Whether the device serves now.
    pub device_present: bool,
    /// The node's counters, while it exists.
    pub node: Option<NodeStats>,
}

/// Counters of the node's device resources.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NodeStats {
    pub pool: crate::memory::PoolStats,
    pub cqs: usize,
    pub shared_queues: Vec<u32>,
    pub shared_receives_posted: Vec<usize>,
    pub shared_recv_buffers: usize,
}

pub(crate) struct CmActor {
    /// The device's resources, and what became of them (see `recovery.rs`).
    device: DeviceSlot,
    /// The node's configuration, kept for timeouts while the device is absent.
    config: super::config::NodeConfig,
    /// How a server serves again once its device is back (`None`: a client's actor,
    /// which closes its connections when the device goes and serves no more).
    relisten: Option<Relisten>,
    channel: EventChannel,
    stop: Arc<AtomicBool>,
    listeners: HashMap<CmIdKey, Listening>,
    services: Services,
    conns: HashMap<CmIdKey, Recipient<CmNotice>>,
    /// The connection of each QP, for device events that name a QP (`device_watch.rs`).
    qps: HashMap<u32, CmIdKey>,
    /// The QP number of each connection in `qps`, to forget it in O(1) when it closes.
    qp_of: HashMap<CmIdKey, u32>,
    /// Passive connections accepted but not yet established, with when (see
    /// [`HandshakeTick`]).
    handshaking: HashMap<CmIdKey, Instant>,
    connecting: HashMap<CmIdKey, Connecting>,
    /// The server's connection limit, shared with its out-of-band ports.
    budget: QpBudget,
    /// Most accepted connections one peer address may hold (0: no limit), so that one
    /// host cannot take every slot under `max_connections`.
    max_per_peer: usize,
    /// Accepted connections open per peer address, and the address of each.
    per_peer: HashMap<IpAddr, usize>,
    peer_of: HashMap<CmIdKey, IpAddr>,
    shutting_down: bool,
    drained: Vec<oneshot::Sender<()>>,
    counters: CmCounters,
}

impl CmActor {
    pub fn new(
        node: Arc<Node>,
        channel: EventChannel,
        services: Services,
        budget: QpBudget,
        max_per_peer: usize,
    ) -> Self {
        CmActor {
            config: node.config.clone(),
            device: DeviceSlot::Present { node, watch: None },
            relisten: None,
            channel,
            stop: Arc::new(AtomicBool::new(false)),
            listeners: HashMap::new(),
            services,
            conns: HashMap::new(),
            qps: HashMap::new(),
            qp_of: HashMap::new(),
            handshaking: HashMap::new(),
            connecting: HashMap::new(),
            budget,
            max_per_peer,
            per_peer: HashMap::new(),
            peer_of: HashMap::new(),
            shutting_down: false,
            drained: Vec::new(),
            counters: CmCounters::default(),
        }
    }

    /// Makes this a server's actor: it watches the device's async events and, when the
    /// device goes, serves again on `relisten` once it is back.
    pub fn serve_again(&mut self, relisten: Relisten) {
        self.relisten = Some(relisten);
    }

    /// The node, while the device serves.
    fn node(&self) -> Option<Arc<Node>> {
        self.device.node().cloned()
    }

    /// Adds a bound, listening id (created on this actor's channel).
    pub fn add_listener(&mut self, id: CmId, default_service: Option<String>) {
        self.listeners.insert(
            id.key(),
            Listening {
                _id: id,
                default_service,
            },
        );
    }

    fn reject(&mut self, id: &CmId, reject: Reject) {
        self.counters.rejected += 1;
        crate::metrics::rejected(reject.code);
        tracing::info!(peer = ?id.peer_addr(), reason = %reject, "rejecting connection");
        if let Err(e) = id.reject(&reject.encode()) {
            tracing::warn!(error = %e, "rdma_reject failed");
        }
    }

    fn on_connect_request(&mut self, mut ev: CmEvent, ctx: &mut Context<Self>) {
        let begun = Instant::now();
        let Some(id) = ev.take_request() else {
            return;
        };
        let default = ev
            .listen_id
            .and_then(|k| self.listeners.get(&k))
            .and_then(|l| l.default_service.clone());
        if self.shutting_down {
            return self.reject(
                &id,
                Reject::new(RejectCode::ShuttingDown, "server is shutting down"),
            );
        }
        let Some(node) = self.node() else {
            return self.reject(
                &id,
                Reject::new(RejectCode::Internal, "the server's RDMA device is gone"),
            );
        };
        let (service_name, peer_depth) = match Hello::decode(&ev.private_data) {
            Err(e) => return self.reject(&id, Reject::new(RejectCode::BadHello, e.to_string())),
            Ok(None) => match default {
                Some(name) => (name, None::<(Advert, u32)>),
                None => {
                    return self.reject(
                        &id,
                        Reject::new(
                            RejectCode::UnknownService,
                            "no default service on this port",
                        ),
                    )
                }
            },
            Ok(Some(hello)) => {
                if hello.version != PROTOCOL_VERSION {
                    return self.reject(
                        &id,
                        Reject::new(
                            RejectCode::VersionMismatch,
                            format!(
                                "client speaks version {}, server {PROTOCOL_VERSION}",
                                hello.version
                            ),
                        ),
                    );
                }
                let advert = hello.advert();
                if !advert.is_valid() {
                    return self.reject(
                        &id,
                        Reject::new(
                            RejectCode::BadHello,
                            format!(
                                "receive depth {} (at most {}) is below {MIN_DEPTH} or above its maximum",
                                advert.initial, advert.max
                            ),
                        ),
                    );
                }
                (hello.service, Some((advert, hello.recv_size)))
            }
        };
        let Some(service) = self.services.get(&service_name).cloned() else {
            return self.reject(
                &id,
                Reject::new(
                    RejectCode::UnknownService,
                    format!("unknown service {service_name:?}"),
                ),
            );
        };
        let slot = match self.budget.take(1) {
            Ok(slot) => slot,
            Err(full) => {
                return self.reject(&id, Reject::new(RejectCode::ServerFull, full.to_string()))
            }
        };
        let peer_ip = id.peer_addr().map(|a| a.ip());
        if let Some(ip) = peer_ip.filter(|_| self.max_per_peer > 0) {
            let open = self.per_peer.get(&ip).copied().unwrap_or(0);
            if open >= self.max_per_peer {
                return self.reject(
                    &id,
                    Reject::new(
                        RejectCode::ServerFull,
                        format!(
                            "per-peer connection limit of {} reached ({ip} has {open} open)",
                            self.max_per_peer
                        ),
                    ),
                );
            }
        }
        let framing = service.framing();
        if framing == Framing::Framed && peer_depth.is_none() {
            return self.reject(
                &id,
                Reject::new(
                    RejectCode::BadHello,
                    format!("service {service_name:?} needs an rdmactor client"),
                ),
            );
        }
        let mut core = match node.prepare(&id, framing, peer_depth.map(|(a, _)| a)) {
            Ok(core) => core,
            Err(e) => return self.reject(&id, Reject::new(RejectCode::Internal, e)),
        };
        core.hold_slot(slot);
        if let Some((_, recv_size)) = peer_depth {
            core.set_peer_recv_size(recv_size);
        }
        core.count_as(crate::metrics::Side::Server, &service_name);
        if let Some(max) = service.max_message() {
            core.limit_message(max);
        }
        let qp_num = core.qp_num();
        let peer = PeerInfo {
            addr: id.peer_addr(),
            qp_num,
            service: service_name.clone(),
        };
        // The service's code, on the CM actor's thread: a panic here would end the actor
        // that accepts every connection. Refused with the reason instead (the prepared
        // QP and buffers are released as `core` drops).
        let session = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            service.session(&peer)
        })) {
            Ok(session) => session,
            Err(payload) => {
                let why = crate::runtime::connection::panic_message(&*payload);
                tracing::error!(service = %service_name, panic = %why, "Service::session panicked");
                drop(core);
                return self.reject(
                    &id,
                    Reject::new(
                        RejectCode::Internal,
                        format!("service {service_name:?} panicked: {why}"),
                    ),
                );
            }
        };
        let label = format!("{}/qp{}/{}", fmt_addr(peer.addr), qp_num, service_name);
        let key = id.key();
        let private_data = match framing {
            Framing::Framed => {
                let ours = node.advert();
                Welcome {
                    recv_depth: ours.initial as u16,
                    recv_size: node.config.recv_size,
                    max_credits: ours.max as u16,
                }
                .encode()
            }
            Framing::Raw { .. } => Vec::new(),
        };
        // The actor accepts once it has registered with its poller (see `Handshake`).
        let handshake = Handshake::Accept(CmCall {
            private_data,
            responder_resources: ev.initiator_depth.clamp(1, 16),
            initiator_depth: ev.responder_resources.clamp(1, 16),
            rnr_retry_count: node.config.rnr_retry_count,
            retry_count: node.config.retry_count,
            failed: ctx.address().recipient(),
        });
        let prepared = Instant::now();
        let addr = ConnectionActor::start(ConnectionParts {
            core,
            session,
            cm: ctx.address().recipient(),
            key,
            label,
            handshake,
            handed_over: Instant::now(),
        });
        self.conns.insert(key, addr.recipient());
        if let Some(ip) = peer_ip {
            *self.per_peer.entry(ip).or_default() += 1;
            self.peer_of.insert(key, ip);
        }
        self.qps.insert(qp_num, key);
        self.qp_of.insert(key, qp_num);
        self.counters.accepted += 1;
        self.handshaking.insert(key, Instant::now());
        crate::metrics::accepted(&service_name);
        tracing::debug!(
            target: "rdmactor::setup",
            step = "request",
            prepare_us = prepared.duration_since(begun).as_micros() as u64,
            start_us = prepared.elapsed().as_micros() as u64,
        );
    }

    fn on_event(&mut self, mut ev: CmEvent, ctx: &mut Context<Self>) {
        if ev.kind == CmEventKind::ConnectRequest {
            return self.on_connect_request(ev, ctx);
        }
        if ev.kind == CmEventKind::DeviceRemoval {
            // Every id on the device hears it; the first one starts the release. The
            // event is acknowledged first: destroying an id waits for its events' acks.
            drop(ev);
            return self.device_lost("removed (RDMA_CM_EVENT_DEVICE_REMOVAL)", ctx);
        }
        if self.connecting.contains_key(&ev.id) {
            return self.on_active_event(ev, ctx);
        }
        match ev.kind {
            CmEventKind::Established => {
                self.handshaking.remove(&ev.id);
                self.notify(ev.id, CmNotice::Established { peer: None })
            }
            CmEventKind::Disconnected => self.notify(ev.id, CmNotice::Disconnected),
            CmEventKind::TimewaitExit => {}
            CmEventKind::Unreachable => {
                // The CM's own messages to the peer timed out: across a wire, a dead or
                // cut-off peer, which is what the transport's RetryExceeded says too.
                let why = format!("rdma_cm UNREACHABLE (status {})", ev.status);
                self.notify(ev.id, CmNotice::Close(CloseReason::PeerUnreachable(why)));
            }
            kind @ (CmEventKind::ConnectError | CmEventKind::Rejected) => {
                let why = format!("{kind:?} (status {})", ev.status);
                self.notify(ev.id, CmNotice::Close(CloseReason::Verbs(why)));
            }
            other => tracing::debug!(kind = ?other, "ignored rdma_cm event"),
        }
        let _ = &mut ev;
    }

    fn notify(&self, key: CmIdKey, notice: CmNotice) {
        match self.conns.get(&key) {
            Some(c) => c.do_send(notice),
            None => tracing::debug!(?notice, "event for a connection already gone"),
        }
    }

    fn fail_connect(&mut self, key: CmIdKey, err: ConnectError) {
        if let Some(mut c) = self.connecting.remove(&key) {
            if let Some(conn) = c.conn.take() {
                conn.do_send(CmNotice::Close(CloseReason::Local(err.to_string())));
            }
            if let Some(reply) = c.reply.take() {
                let _ = reply.send(Err(err));
            }
        }
    }

    fn on_active_event(&mut self, ev: CmEvent, ctx: &mut Context<Self>) {
        let key = ev.id;
        match ev.kind {
            CmEventKind::AddrResolved => {
                let c = &self.connecting[&key];
                if let Err(e) = c.id.resolve_route(RESOLVE_TIMEOUT) {
                    self.fail_connect(key, ConnectError::Verbs(e.to_string()));
                }
            }
            CmEventKind::RouteResolved => self.on_route_resolved(key, ctx),
            CmEventKind::Established => {
                let depth = Welcome::decode(&ev.private_data).map(|w| (w.advert(), w.recv_size));
                let Some(mut c) = self.connecting.remove(&key) else {
                    return;
                };
                let Some(conn) = c.conn.take() else {
                    return;
                };
                if depth.is_none() {
                    conn.do_send(CmNotice::Close(CloseReason::Protocol(
                        "accept without a welcome".into(),
                    )));
                    if let Some(reply) = c.reply.take() {
                        let _ = reply.send(Err(ConnectError::NotRdmactor));
                    }
                    return;
                }
                conn.do_send(CmNotice::Established { peer: depth });
                if let (Some(reply), Some(inbox)) = (c.reply.take(), c.inbox.take()) {
                    let _ = reply.send(Ok((conn, inbox)));
                }
            }
            CmEventKind::Rejected => {
                let err = match Reject::decode(&ev.private_data) {
                    Some(r) => ConnectError::Rejected(r),
                    None => ConnectError::RejectedByTransport(ev.status),
                };
                self.fail_connect(key, err);
            }
            kind => {
                let err = ConnectError::Failed {
                    event: format!("{kind:?}"),
                    status: ev.status,
                };
                self.fail_connect(key, err);
            }
        }
    }

    fn on_route_resolved(&mut self, key: CmIdKey, ctx: &mut Context<Self>) {
        let Some(c) = self.connecting.get_mut(&key) else {
            return;
        };
        let id = c.id.clone();
        let service = c.service.clone();
        let user = c.session.take();
        let Some(node) = self.node() else {
            return self.fail_connect(
                key,
                ConnectError::Resources("the RDMA device is gone".into()),
            );
        };
        let mut core = match node.prepare(&id, Framing::Framed, None) {
            Ok(core) => core,
            Err(e) => return self.fail_connect(key, ConnectError::Resources(e)),
        };
        core.count_as(crate::metrics::Side::Client, &service);
        let qp_num = core.qp_num();
        let label = format!(
            "client/{}/qp{}/{}",
            fmt_addr(id.peer_addr()),
            qp_num,
            service
        );
        let (session, inbox) = ClientSession::new(user);
        let ours = node.advert();
        let hello = Hello {
            version: PROTOCOL_VERSION,
            service,
            recv_depth: ours.initial as u16,
            recv_size: node.config.recv_size,
            max_credits: ours.max as u16,
        };
        let private_data = match hello.encode() {
            Ok(d) => d,
            Err(e) => return self.fail_connect(key, ConnectError::Verbs(e.to_string())),
        };
        // The actor connects once it has registered with its poller (see `Handshake`).
        let handshake = Handshake::Connect(CmCall {
            private_data,
            responder_resources: 16,
            initiator_depth: 16,
            rnr_retry_count: node.config.rnr_retry_count,
            retry_count: node.config.retry_count,
            failed: ctx.address().recipient(),
        });
        let addr = ConnectionActor::start(ConnectionParts {
            core,
            session,
            cm: ctx.address().recipient(),
            key,
            label,
            handshake,
            handed_over: Instant::now(),
        });
        self.conns.insert(key, addr.clone().recipient());
        self.qps.insert(qp_num, key);
        self.qp_of.insert(key, qp_num);
        if let Some(c) = self.connecting.get_mut(&key) {
            c.conn = Some(addr);
            c.inbox = Some(inbox);
        }
    }
}

fn fmt_addr(addr: Option<SocketAddr>) -> String {
    addr.map_or_else(|| "?".into(), |a| a.to_string())
}

impl Actor for CmActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let channel = self.channel.clone();
        let stop = self.stop.clone();
        let addr = ctx.address();
        std::thread::Builder::new()
            .name("rdmactor-cm".into())
            .spawn(move || {
                let mut last_tick = Instant::now();
                while !stop.load(Ordering::Acquire) {
                    if last_tick.elapsed() >= HANDSHAKE_TICK {
                        last_tick = Instant::now();
                        addr.do_send(HandshakeTick(last_tick));
                    }
                    match channel.next(Some(Duration::from_millis(50))) {
                        Ok(Some(ev)) => addr.do_send(CmEventMsg(ev, Instant::now())),
                        Ok(None) => {}
                        Err(e) => {
                            tracing::error!(error = %e, "reading rdma_cm events failed");
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                }
            })
            .expect("spawn the rdma_cm event thread");
        if self.relisten.is_some() {
            self.start_watch(ctx);
            if let Some(node) = self.device.node() {
                let pd = node.pd.clone();
                self.tell_services(|s| s.on_device_up(&pd));
            }
            ctx.run_interval(recovery::POLL, |act, ctx| act.look_for_device(ctx));
        }
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        self.stop.store(true, Ordering::Release);
    }
}

/// An event, with when the event thread read it (for the setup profile: how long events
/// wait for this actor).
#[derive(Message)]
#[rtype(result = "()")]
struct CmEventMsg(CmEvent, Instant);

/// How often the event thread checks for handshakes that did not finish.
const HANDSHAKE_TICK: Duration = Duration::from_secs(1);

/// Sent by the event thread once per [`HANDSHAKE_TICK`], stamped when sent. It queues
/// behind every event the thread read before it, so when the CM actor handles it, every
/// ESTABLISHED that had arrived by then has been handled: a connection still
/// handshaking whose accept is `handshake_timeout` older than the stamp has really not
/// heard from its peer. (A timer per connection fired under connect storms while the
/// ESTABLISHED events were merely waiting in this actor's mailbox.)
#[derive(Message)]
#[rtype(result = "()")]
struct HandshakeTick(Instant);

impl Handler<HandshakeTick> for CmActor {
    type Result = ();
    fn handle(&mut self, tick: HandshakeTick, _ctx: &mut Context<Self>) {
        let limit = self.config.handshake_timeout;
        let expired: Vec<CmIdKey> = self
            .handshaking
            .iter()
            .filter(|(_, &at)| tick.0.saturating_duration_since(at) >= limit)
            .map(|(&k, _)| k)
            .collect();
        for key in expired {
            self.handshaking.remove(&key);
            self.notify(key, CmNotice::Close(CloseReason::HandshakeTimeout(limit)));
        }
    }
}

impl Handler<CmEventMsg> for CmActor {
    type Result = ();
    fn handle(&mut self, msg: CmEventMsg, ctx: &mut Context<Self>) {
        let (kind, begun) = (msg.0.kind, Instant::now());
        self.on_event(msg.0, ctx);
        tracing::debug!(
            target: "rdmactor::setup",
            step = "event",
            ?kind,
            queued_us = begun.duration_since(msg.1).as_micros() as u64,
            handle_us = begun.elapsed().as_micros() as u64,
        );
    }
}

impl Handler<ConnClosed> for CmActor {
    type Result = ();
    fn handle(&mut self, msg: ConnClosed, ctx: &mut Context<Self>) {
        if self.conns.remove(&msg.key).is_some() {
            self.counters.closed += 1;
        }
        if let Some(ip) = self.peer_of.remove(&msg.key) {
            if let Some(open) = self.per_peer.get_mut(&ip) {
                *open -= 1;
                if *open == 0 {
                    self.per_peer.remove(&ip);
                }
            }
        }
        if let Some(qp) = self.qp_of.remove(&msg.key) {
            // rxe reuses QP numbers: only if it still names this connection.
            if self.qps.get(&qp) == Some(&msg.key) {
                self.qps.remove(&qp);
            }
        }
        self.handshaking.remove(&msg.key);
        tracing::debug!(reason = %msg.reason, "connection released");
        if self.conns.is_empty() {
            for w in self.drained.drain(..) {
                let _ = w.send(());
            }
        }
        self.try_release(ctx);
    }
}

impl Handler<HandshakeFailed> for CmActor {
    type Result = ();
    fn handle(&mut self, msg: HandshakeFailed, _ctx: &mut Context<Self>) {
        if self.connecting.contains_key(&msg.key) {
            self.fail_connect(msg.key, ConnectError::Verbs(msg.error));
        } else {
            self.notify(msg.key, CmNotice::Close(CloseReason::Verbs(msg.error)));
        }
    }
}

/// Starts an active connection (client side).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Connect {
    pub addr: SocketAddr,
    /// The local address to connect from (`None`: the route's).
    pub from: Option<IpAddr>,
    pub service: String,
    pub reply: oneshot::Sender<Result<(ClientAddr, Inbox), ConnectError>>,
    /// The application's own session for this connection, if any.
    pub session: Option<Box<dyn Session>>,
}

impl Handler<Connect> for CmActor {
    type Result = ();
    fn handle(&mut self, msg: Connect, _ctx: &mut Context<Self>) {
        if self.shutting_down {
            let _ = msg.reply.send(Err(ConnectError::ShuttingDown));
            return;
        }
        if self.device.node().is_none() {
            let _ = msg.reply.send(Err(ConnectError::Resources(
                "the RDMA device is gone".into(),
            )));
            return;
        }
        let id = match CmId::new(&self.channel) {
            Ok(id) => id,
            Err(e) => {
                let _ = msg.reply.send(Err(ConnectError::Verbs(e.to_string())));
                return;
            }
        };
        let src = msg.from.map(|ip| SocketAddr::new(ip, 0));
        if let Err(e) = id.resolve_addr(src, msg.addr, RESOLVE_TIMEOUT) {
            let _ = msg.reply.send(Err(ConnectError::Verbs(e.to_string())));
            return;
        }
        self.connecting.insert(
            id.key(),
            Connecting {
                id,
                service: msg.service,
                reply: Some(msg.reply),
                conn: None,
                inbox: None,
                session: msg.session,
            },
        );
    }
}

/// Stops accepting, closes every connection, and answers once all are released.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Shutdown(pub oneshot::Sender<()>);

impl Handler<Shutdown> for CmActor {
    type Result = ();
    fn handle(&mut self, msg: Shutdown, _ctx: &mut Context<Self>) {
        self.shutting_down = true;
        self.listeners.clear();
        let keys: Vec<CmIdKey> = self.connecting.keys().copied().collect();
        for k in keys {
            self.fail_connect(k, ConnectError::ShuttingDown);
        }
        for c in self.conns.values() {
            c.do_send(CmNotice::Close(CloseReason::Shutdown));
        }
        if self.conns.is_empty() {
            let _ = msg.0.send(());
        } else {
            self.drained.push(msg.0);
        }
    }
}

/// Stops the actor and its event thread (after `Shutdown`).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Stop;

impl Handler<Stop> for CmActor {
    type Result = ();
    fn handle(&mut self, _msg: Stop, ctx: &mut Context<Self>) {
        self.stop.store(true, Ordering::Release);
        // The node goes now, so that its device resources are released when the
        // shutdown is answered (every connection released already).
        self.device = DeviceSlot::Absent {
            gone: GoneDevice::default(),
            since: Instant::now(),
            said_empty: true,
        };
        ctx.stop();
    }
}

/// Reads the counters.
#[derive(Message)]
#[rtype(result = "CmCounters")]
pub(crate) struct GetCounters;

impl Handler<GetCounters> for CmActor {
    type Result = MessageResult<GetCounters>;
    fn handle(&mut self, _msg: GetCounters, _ctx: &mut Context<Self>) -> Self::Result {
        let mut c = self.counters.clone();
        c.connections = self.conns.len();
        c.qps = self.budget.used();
        c.device_present = self.device.node().is_some();
        c.node = self.device.any_node().map(|n| NodeStats {
            pool: n.pool_stats(),
            cqs: n.cq_count(),
            shared_queues: n.shared_queues(),
            shared_receives_posted: n.shared_receives_posted(),
            shared_recv_buffers: n.shared_recv_buffers(),
        });
        MessageResult(c)
    }
}

/// The node's protection domain, while the device serves.
#[derive(Message)]
#[rtype(result = "Option<crate::verbs::ProtectionDomain>")]
pub(crate) struct GetPd;

impl Handler<GetPd> for CmActor {
    type Result = Option<crate::verbs::ProtectionDomain>;
    fn handle(&mut self, _msg: GetPd, _ctx: &mut Context<Self>) -> Self::Result {
        self.device.node().map(|n| n.pd.clone())
    }
}

/// Closes every connection of `cm`, waits until they released their resources, then
/// stops the actor and its event thread (the end of a server's or client's life).
pub(crate) async fn shut_down(cm: &Addr<CmActor>) {
    let (tx, rx) = oneshot::channel();
    cm.do_send(Shutdown(tx));
    let _ = rx.await;
    let _ = cm.send(Stop).await;
}

impl Handler<super::device_watch::DeviceNotice> for CmActor {
    type Result = ();
    fn handle(&mut self, msg: super::device_watch::DeviceNotice, ctx: &mut Context<Self>) {
        use super::device_watch::DeviceNotice;
        match msg {
            DeviceNotice::QpFailed { qp_num, event } => match self.qps.get(&qp_num) {
                Some(key) => self.notify(
                    *key,
                    CmNotice::Close(CloseReason::Verbs(format!(
                        "the device reported {event} for this connection's QP"
                    ))),
                ),
                None => tracing::debug!(qp_num, %event, "device event for a QP no connection has"),
            },
            DeviceNotice::DeviceFatal => self.device_lost("failed (IBV_EVENT_DEVICE_FATAL)", ctx),
        }
    }
}

/// An out-of-band listener has closed its connections after the device went and let go
/// of the node (`OobDeviceGone`).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct OobReleased;

impl Handler<OobReleased> for CmActor {
    type Result = ();
    fn handle(&mut self, _msg: OobReleased, ctx: &mut Context<Self>) {
        if let DeviceSlot::Releasing { oob_pending, .. } = &mut self.device {
            *oob_pending = oob_pending.saturating_sub(1);
        }
        self.try_release(ctx);
    }
}

/// Losing the device and serving again (the order is in `recovery.rs`).
impl CmActor {
    /// The device was removed or failed (`how`): closes everything on it and waits for
    /// the connections to release before the node goes. Once per loss.
    fn device_lost(&mut self, how: &str, ctx: &mut Context<Self>) {
        // Every id on the device reports the removal: only the first one acts (taking a
        // releasing node out of its slot here would drop it under its connections).
        if self.device.node().is_none() {
            return;
        }
        let DeviceSlot::Present { node, watch } = std::mem::replace(
            &mut self.device,
            DeviceSlot::Absent {
                gone: GoneDevice::default(),
                since: Instant::now(),
                said_empty: false,
            },
        ) else {
            return;
        };
        drop(watch);
        self.counters.device_losses += 1;
        let gone = GoneDevice {
            name: node.ctx.name().to_owned(),
            index: node.ctx.index(),
        };
        let reason = CloseReason::DeviceLost(format!("RDMA device {} {how}", gone.name));
        tracing::error!(
            device = %gone.name,
            connections = self.conns.len(),
            out_of_band_listeners = self.relisten.as_ref().map_or(0, |r| r.oob.len()),
            "RDMA device {how}: closing every connection and listener; its resources are \
             released once the connections have let go"
        );
        for c in self.conns.values() {
            c.do_send(CmNotice::Close(reason.clone()));
        }
        // Destroying an id waits until its events are acknowledged, and events of these
        // ids may be queued behind this one for this very actor: destroyed on a thread
        // of their own, which waits for this actor to read them.
        let mut ids: Vec<CmId> = self.listeners.drain().map(|(_, l)| l._id).collect();
        for (_, mut c) in self.connecting.drain() {
            if let Some(conn) = c.conn.take() {
                conn.do_send(CmNotice::Close(reason.clone()));
            }
            if let Some(reply) = c.reply.take() {
                let _ = reply.send(Err(ConnectError::Resources(reason.to_string())));
            }
            ids.push(c.id);
        }
        if !ids.is_empty() {
            let spawned = std::thread::Builder::new()
                .name("rdmactor-cm-drop".into())
                .spawn(move || drop(ids));
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start the thread destroying the lost device's cm ids");
            }
        }
        self.tell_services(|s| s.on_device_down());
        let mut oob_pending = 0;
        if let Some(r) = &self.relisten {
            for l in &r.oob {
                l.do_send(super::oob::OobDeviceGone {
                    reason: reason.clone(),
                    released: ctx.address().recipient(),
                });
                oob_pending += 1;
            }
        }
        self.device = DeviceSlot::Releasing {
            node,
            gone,
            since: Instant::now(),
            oob_pending,
        };
        self.try_release(ctx);
    }

    /// Drops the node once nothing uses it any more.
    fn try_release(&mut self, _ctx: &mut Context<Self>) {
        let DeviceSlot::Releasing {
            oob_pending: 0,
            since,
            ..
        } = &self.device
        else {
            return;
        };
        if !self.conns.is_empty() {
            return;
        }
        let since = *since;
        let DeviceSlot::Releasing { node, gone, .. } = std::mem::replace(
            &mut self.device,
            DeviceSlot::Absent {
                gone: GoneDevice::default(),
                since,
                said_empty: false,
            },
        ) else {
            return;
        };
        // The pollers' threads are joined here; every connection they ran has ended.
        drop(node);
        let waits = match &self.relisten {
            Some(r) => format!(
                "waiting for {} to return (looking every {:?})",
                r.config.device.as_deref().unwrap_or("an RDMA device"),
                recovery::POLL
            ),
            None => "this client's connections are closed; it serves no more".into(),
        };
        tracing::warn!(
            device = %gone.name,
            released_in = ?since.elapsed(),
            "every connection released; the device's resources are closed; {waits}"
        );
        self.device = DeviceSlot::Absent {
            gone,
            since,
            said_empty: false,
        };
    }

    /// Every [`recovery::POLL`] while absent: lists the devices (which also lets
    /// librdmacm close its handle of the removed one) and serves again on a returned one.
    fn look_for_device(&mut self, ctx: &mut Context<Self>) {
        let (
            DeviceSlot::Absent {
                gone, said_empty, ..
            },
            Some(relisten),
        ) = (&mut self.device, &self.relisten)
        else {
            return;
        };
        if self.shutting_down {
            return;
        }
        let listed = match crate::verbs::Context::listed() {
            Ok(listed) => listed,
            Err(e) => {
                // librdmacm compares its list with the kernel's only when the kernel lists
                // some device; until then it keeps the removed one open, and the kernel's
                // removal waits for it. Tried on every look: a PD an application still
                // held may have gone since.
                let released = crate::verbs::release_removed_devices();
                match released {
                    Ok(n) if n > 0 => tracing::warn!(
                        device = %gone.name,
                        handles = n,
                        "no RDMA device is listed: released the handles librdmacm kept of \
                         the removed device, so the kernel's removal can finish"
                    ),
                    Ok(_) if !*said_empty => tracing::warn!(
                        device = %gone.name,
                        error = %e,
                        "no RDMA device is listed"
                    ),
                    Ok(_) => {}
                    Err(release) if !*said_empty => tracing::warn!(
                        device = %gone.name,
                        error = %e,
                        %release,
                        "no RDMA device is listed, and releasing librdmacm's handles of the \
                         removed device failed: the kernel's removal waits for this process \
                         to exit"
                    ),
                    Err(_) => {}
                }
                *said_empty = true;
                return;
            }
        };
        let want = relisten.config.device.as_deref();
        let Some(found) = recovery::returned(want, gone, &listed) else {
            return;
        };
        let found = found.name.clone();
        if let Err(e) = self.serve_on(&found, ctx) {
            tracing::warn!(device = %found, error = %e, "the device is back but serving on it failed; trying again");
        }
    }

    /// Rebuilds the node on `device`, listens again, tells the services and the
    /// out-of-band listeners.
    fn serve_on(&mut self, device: &str, ctx: &mut Context<Self>) -> Result<(), String> {
        let Some(relisten) = &self.relisten else {
            return Ok(());
        };
        let since = match &self.device {
            DeviceSlot::Absent { since, .. } => *since,
            _ => return Ok(()),
        };
        let mut config = relisten.config.clone();
        config.device = Some(device.to_owned());
        let node = Node::start(config).map_err(|e| format!("opening the device: {e}"))?;
        let mut listening = Vec::new();
        for (addr, default) in &relisten.listeners {
            let id = CmId::new(&self.channel).map_err(|e| e.to_string())?;
            id.bind(*addr).map_err(|e| format!("binding {addr}: {e}"))?;
            id.listen(1024)
                .map_err(|e| format!("listening on {addr}: {e}"))?;
            listening.push((id, default.clone()));
        }
        for l in &relisten.oob {
            l.do_send(super::oob::OobDeviceBack(node.clone()));
        }
        for (id, default) in listening {
            self.add_listener(id, default);
        }
        let pd = node.pd.clone();
        self.device = DeviceSlot::Present { node, watch: None };
        self.start_watch(ctx);
        self.tell_services(|s| s.on_device_up(&pd));
        tracing::warn!(
            device,
            absent_for = ?since.elapsed(),
            listeners = ?self.relisten.as_ref().map(|r| r.listeners.iter().map(|(a, _)| *a).collect::<Vec<_>>()),
            "RDMA device is back: serving again"
        );
        Ok(())
    }

    /// Starts reading the present device's async events (servers).
    fn start_watch(&mut self, ctx: &mut Context<Self>) {
        let recipient = ctx.address().recipient();
        if let DeviceSlot::Present { node, watch } = &mut self.device {
            match super::device_watch::start(&node.ctx, recipient) {
                Ok(w) => *watch = Some(w),
                Err(e) => {
                    tracing::error!(device = %node.ctx.name(), error = %e, "cannot watch the device's events")
                }
            }
        }
    }

    /// Calls `f` on every service, a panic caught and logged.
    fn tell_services(&self, f: impl Fn(&dyn Service)) {
        for (name, service) in self.services.iter() {
            let called = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&**service)));
            if let Err(payload) = called {
                let why = crate::runtime::connection::panic_message(&*payload);
                tracing::error!(service = %name, panic = %why, "a service's device hook panicked");
            }
        }
    }
}
