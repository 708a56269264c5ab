//! The CM actor: owns the rdma_cm event channel, the listening ids and the bookkeeping of
//! every connection. A dedicated thread reads the (non-blocking) channel and forwards
//! each event as a message, so the actor system never blocks in `rdma_get_cm_event`.
//!
//! Passive side: CONNECT_REQUEST → admission (`admission.rs`: limits, service from the
//! private data or the listener's default, version) → QP on the shared PD, receives
//! posted → accept, or reject with a reason the client can read; an accepted connection
//! that never becomes ESTABLISHED is closed (`handshakes.rs`). Active side
//! (`connect.rs`): resolve address → resolve route → QP → connect → ESTABLISHED or a
//! typed failure. The device's loss and return are in `recovery.rs`, the connections
//! and their drain in `conn_set.rs`; this file gathers the facts, applies the outcomes,
//! keeps the counters and shuts down.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use super::admission::{self, PeerCounts};
use super::auth::{Door, MAX_PROOF};
use super::budget::QpBudget;
use super::close::CloseReason;
use super::cm_counters::{CmCounters, NodeStats};
use super::conn_set::{self, fmt_addr, ConnSet, Drain};
use super::connect::{Connect, ConnectError, Dialing, Reports};
use super::connection::{
    panic_message, CmCall, CmNotice, ConnClosed, ConnectionParts, Handshake, HandshakeFailed,
};
use super::device_watch::DeviceNotice;
use super::handshakes::{HandshakeTick, Handshakes, HANDSHAKE_TICK};
use super::node::Node;
use super::recovery::{self, OobReleased, Recovery, Relisten};
use super::service::{Framing, Identity, PeerInfo, Service};
use crate::proto::hello::{Reject, RejectCode, Welcome};
use crate::transport::{CmEvent, CmEventKind, CmId, EventChannel, Transport, Verbs};

pub(crate) type Services<T = Verbs> = Arc<HashMap<String, Arc<dyn Service<T>>>>;

struct Listening<T: Transport> {
    _id: T::CmId,
    default_service: Option<String>,
}

pub(crate) struct CmActor<T: Transport = Verbs> {
    /// The device's resources, and what became of them (see `recovery.rs`).
    recovery: Recovery<T>,
    /// The node's configuration, kept for timeouts while the device is absent.
    config: super::config::NodeConfig,
    channel: T::EventChannel,
    stop: Arc<AtomicBool>,
    listeners: HashMap<T::CmIdKey, Listening<T>>,
    services: Services<T>,
    /// Every connection, passive and active, with the peer address a passive one is
    /// counted under in `per_peer`.
    pub(super) conns: ConnSet<Option<IpAddr>, T::CmIdKey>,
    /// Passive connections accepted but not yet established.
    handshaking: Handshakes<T::CmIdKey>,
    dialing: Dialing<T>,
    /// The server's connection limit, shared with its out-of-band ports.
    budget: QpBudget,
    /// Most accepted connections one peer address may hold (0: no limit), so that one
    /// host cannot take every slot under `max_connections`.
    max_per_peer: usize,
    /// Accepted connections open per peer address.
    pub(super) per_peer: PeerCounts,
    shutting_down: bool,
    /// `accepted` and `rejected`; the rest is read from where it is kept.
    counters: CmCounters,
    /// Which services need a proof of identity, and what the proofs did (`auth/door.rs`).
    pub(super) door: Door<T::CmIdKey>,
}

impl<T: Transport> CmActor<T> {
    pub fn new(
        node: Arc<Node<T>>,
        channel: T::EventChannel,
        services: Services<T>,
        budget: QpBudget,
        max_per_peer: usize,
    ) -> Self {
        CmActor {
            config: node.config.clone(),
            recovery: Recovery::new(node),
            channel,
            stop: Arc::new(AtomicBool::new(false)),
            listeners: HashMap::new(),
            services,
            conns: ConnSet::default(),
            handshaking: Handshakes::default(),
            dialing: Dialing::default(),
            budget,
            max_per_peer,
            per_peer: PeerCounts::default(),
            shutting_down: false,
            counters: CmCounters::default(),
            door: Door::new(None),
        }
    }

    /// Makes this a server's actor: it watches the device's async events and, when the
    /// device goes, serves again on `relisten` once it is back.
    pub fn serve_again(&mut self, relisten: Relisten<T>) {
        self.recovery.serve_again(relisten);
    }

    /// Adds a bound, listening id (created on this actor's channel).
    pub fn add_listener(&mut self, id: T::CmId, default_service: Option<String>) {
        self.listeners.insert(
            id.key(),
            Listening {
                _id: id,
                default_service,
            },
        );
    }

    fn reject(&mut self, id: &T::CmId, reject: Reject) {
        self.counters.rejected += 1;
        crate::metrics::rejected(reject.code);
        tracing::info!(peer = ?id.peer_addr(), reason = %reject, "rejecting connection");
        if let Err(e) = id.reject(&reject.encode()) {
            tracing::warn!(error = %e, "rdma_reject failed");
        }
    }

    /// Gathers the facts of a connect request, has [`admission::decide`] decide, and
    /// applies the decision: the connection prepared and started, or the reject sent.
    fn on_connect_request(&mut self, mut ev: T::CmEvent, ctx: &mut Context<Self>) {
        let begun = Instant::now();
        let Some(id) = ev.take_request() else {
            return;
        };
        let default = ev
            .listen_id()
            .and_then(|k| self.listeners.get(&k))
            .and_then(|l| l.default_service.as_deref());
        let peer_ip = id.peer_addr().map(|a| a.ip());
        let request = admission::Request {
            shutting_down: self.shutting_down,
            node: self.recovery.node().cloned(),
            private_data: ev.private_data(),
            default_service: default,
            services: &self.services,
            peer: peer_ip,
            max_per_peer: self.max_per_peer,
            per_peer: &self.per_peer,
        };
        let admitted = match admission::decide(request, || self.budget.take(1)) {
            Ok(admitted) => admitted,
            Err(reject) => return self.reject(&id, reject),
        };
        let (node, service, framing) = (admitted.node, admitted.service, admitted.framing);
        let (service_name, peer_depth) = (admitted.service_name, admitted.peer_depth);
        let slot = admitted.slot;
        // An address out of tokens (too many unproven attempts, failed or in flight) is
        // turned away here, before any QP is made: it costs this actor one lookup, and
        // no other address waits. An accepted attempt takes its token below
        // (`door.begin`, in this same call: no other request passes on it meanwhile).
        if !self.door.allows(&service_name, peer_ip, begun) {
            drop(slot);
            let why =
                "too many failed or unfinished authentications from this address; try again later";
            return self.reject(&id, Reject::new(RejectCode::Throttled, why));
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
        node.gate_blocking(&mut core, &service_name);
        if let Some(max) = service.max_message() {
            core.limit_message(max);
        }
        let qp_num = core.qp_num();
        let peer = PeerInfo {
            addr: id.peer_addr(),
            qp_num,
            service: service_name.clone(),
            identity: Identity::Anonymous,
        };
        let key = id.key();
        // An authenticated-only service's session is made only once the proof is good:
        // until then the connection runs a gate holding this connection's fresh nonce.
        let gate = match self.door.gate(&service_name) {
            Ok(gate) => gate,
            Err(e) => return self.reject(&id, Reject::new(RejectCode::Internal, e)),
        };
        // Until the proof is good the connection reads no message larger than a proof,
        // so a peer that proved nothing cannot make the server hold the service's
        // largest message; the gate opens it to the service's limit once proved.
        if gate.is_some() {
            core.gate_messages(MAX_PROOF);
        }
        // The service's code, on the CM actor's thread: a panic here would end the actor
        // that accepts every connection. Refused with the reason instead (the prepared
        // QP and buffers are released as `core` drops).
        let session = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match &gate {
            Some(g) => g.session(&service, &peer, key, ctx.address().recipient()),
            None => service.session(&peer),
        })) {
            Ok(session) => session,
            Err(payload) => {
                let why = panic_message(&*payload);
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
        let private_data = match framing {
            Framing::Framed => {
                let ours = node.advert();
                Welcome {
                    recv_depth: ours.initial as u16,
                    recv_size: node.config.receives.size,
                    max_credits: ours.max as u16,
                    nonce: gate.as_ref().map(|g| g.nonce),
                }
                .encode()
            }
            Framing::Raw { .. } => Vec::new(),
        };
        // The actor accepts once it has registered with its poller (see `Handshake`).
        let handshake = Handshake::Accept(CmCall {
            private_data,
            responder_resources: ev.initiator_depth().clamp(1, 16),
            initiator_depth: ev.responder_resources().clamp(1, 16),
            rnr_retry_count: node.config.connection.rnr_retry_count,
            retry_count: node.config.connection.retry_count,
            failed: ctx.address().recipient(),
        });
        let prepared = Instant::now();
        let parts = ConnectionParts {
            core,
            session,
            cm: ctx.address().recipient(),
            key,
            label,
            handshake,
            handed_over: Instant::now(),
        };
        self.conns.start(parts, peer_ip);
        if let Some(ip) = peer_ip {
            self.per_peer.add(ip);
        }
        self.counters.accepted += 1;
        self.handshaking.begin(key, Instant::now());
        if gate.is_some() {
            self.door.begin(key, peer_ip, &service_name, Instant::now());
        }
        crate::metrics::accepted(&service_name);
        tracing::debug!(
            target: "rdmactor::setup",
            step = "request",
            prepare_us = prepared.duration_since(begun).as_micros() as u64,
            start_us = prepared.elapsed().as_micros() as u64,
        );
    }

    fn on_event(&mut self, ev: T::CmEvent, ctx: &mut Context<Self>) {
        let key = ev.id();
        if ev.kind() == CmEventKind::ConnectRequest {
            return self.on_connect_request(ev, ctx);
        }
        if ev.kind() == CmEventKind::DeviceRemoval {
            // Every id on the device hears it; the first one starts the release. The
            // event is acknowledged first: destroying an id waits for its events' acks.
            drop(ev);
            return self.device_lost("removed (RDMA_CM_EVENT_DEVICE_REMOVAL)", ctx);
        }
        if self.dialing.has(key) {
            let reports = Reports {
                closed: ctx.address().recipient(),
                failed: ctx.address().recipient(),
            };
            let node = self.recovery.node().cloned();
            return self
                .dialing
                .on_event(ev, node.as_deref(), reports, &mut self.conns);
        }
        match ev.kind() {
            CmEventKind::Established => {
                self.handshaking.done(key);
                self.conns.notify(key, CmNotice::Established { peer: None })
            }
            CmEventKind::Disconnected => self.conns.notify(key, CmNotice::Disconnected),
            CmEventKind::TimewaitExit => {}
            CmEventKind::Unreachable => {
                // The CM's own messages to the peer timed out: across a wire, a dead or
                // cut-off peer, which is what the transport's RetryExceeded says too.
                let why = format!("rdma_cm UNREACHABLE (status {})", ev.status());
                let reason = CloseReason::PeerUnreachable(why);
                self.conns.notify(key, CmNotice::Close(reason));
            }
            kind @ (CmEventKind::ConnectError | CmEventKind::Rejected) => {
                let why = format!("{kind:?} (status {})", ev.status());
                self.conns
                    .notify(key, CmNotice::Close(CloseReason::Verbs(why)));
            }
            other => tracing::debug!(kind = ?other, "ignored rdma_cm event"),
        }
    }

    /// Calls `f` on every service, a panic caught and logged.
    fn tell_services(&self, f: impl Fn(&dyn Service<T>)) {
        for (name, service) in self.services.iter() {
            let called = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&**service)));
            if let Err(payload) = called {
                let why = panic_message(&*payload);
                tracing::error!(service = %name, panic = %why, "a service's device hook panicked");
            }
        }
    }
}

impl<T: Transport> Actor for CmActor<T> {
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
        if self.recovery.is_server() {
            self.recovery.start_watch(ctx.address().recipient());
            if let Some(node) = self.recovery.node() {
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
struct CmEventMsg<T: Transport>(T::CmEvent, Instant);

impl<T: Transport> Handler<CmEventMsg<T>> for CmActor<T> {
    type Result = ();
    fn handle(&mut self, msg: CmEventMsg<T>, ctx: &mut Context<Self>) {
        let (kind, begun) = (msg.0.kind(), Instant::now());
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

impl<T: Transport> Handler<HandshakeTick> for CmActor<T> {
    type Result = ();
    fn handle(&mut self, tick: HandshakeTick, _ctx: &mut Context<Self>) {
        self.dialing.end_abandoned();
        let limit = self.config.connection.handshake_timeout;
        for key in self.handshaking.expired(tick.0, limit) {
            let reason = CloseReason::HandshakeTimeout(limit);
            self.conns.notify(key, CmNotice::Close(reason));
        }
        for (key, why) in self.door.expired(tick.0) {
            self.conns
                .notify(key, CmNotice::Close(CloseReason::Local(why)));
        }
    }
}

impl<T: Transport> Handler<ConnClosed<T::CmIdKey>> for CmActor<T> {
    type Result = ();
    fn handle(&mut self, msg: ConnClosed<T::CmIdKey>, _ctx: &mut Context<Self>) {
        if let Some(Some(ip)) = self.conns.release(msg.key) {
            self.per_peer.remove(ip);
        }
        self.handshaking.done(msg.key);
        self.door.released(msg.key);
        tracing::debug!(reason = %msg.reason, "connection released");
        self.conns.answer_if_drained();
        self.recovery.try_release(!self.conns.is_empty());
    }
}

impl<T: Transport> Handler<HandshakeFailed<T::CmIdKey>> for CmActor<T> {
    type Result = ();
    fn handle(&mut self, msg: HandshakeFailed<T::CmIdKey>, _ctx: &mut Context<Self>) {
        if self.dialing.has(msg.key) {
            self.dialing.fail(msg.key, ConnectError::Verbs(msg.error));
        } else {
            let reason = CloseReason::Verbs(msg.error);
            self.conns.notify(msg.key, CmNotice::Close(reason));
        }
    }
}

impl<T: Transport> Handler<Connect<T>> for CmActor<T> {
    type Result = ();
    fn handle(&mut self, msg: Connect<T>, _ctx: &mut Context<Self>) {
        if self.shutting_down {
            return msg.dialer.failed(ConnectError::ShuttingDown);
        }
        let node = self.recovery.node().cloned();
        self.dialing.begin(node.as_deref(), &self.channel, msg);
    }
}

/// Stops accepting, closes every connection, and answers once all are released.
impl<T: Transport> Handler<Drain> for CmActor<T> {
    type Result = ();
    fn handle(&mut self, msg: Drain, _ctx: &mut Context<Self>) {
        self.shutting_down = true;
        self.listeners.clear();
        let why = CloseReason::Local(ConnectError::ShuttingDown.to_string());
        drop(self.dialing.fail_all(&why, || ConnectError::ShuttingDown));
        self.conns.drain(msg.0);
    }
}

/// Stops the actor and its event thread (after `Drain`).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Stop;

impl<T: Transport> Handler<Stop> for CmActor<T> {
    type Result = ();
    fn handle(&mut self, _msg: Stop, ctx: &mut Context<Self>) {
        self.stop.store(true, Ordering::Release);
        // The node goes now, so that its device resources are released when the
        // shutdown is answered (every connection released already).
        self.recovery.let_go();
        ctx.stop();
    }
}

/// Reads the counters.
#[derive(Message)]
#[rtype(result = "CmCounters")]
pub(crate) struct GetCounters;

impl<T: Transport> Handler<GetCounters> for CmActor<T> {
    type Result = MessageResult<GetCounters>;
    fn handle(&mut self, _msg: GetCounters, _ctx: &mut Context<Self>) -> Self::Result {
        let mut c = self.counters.clone();
        c.connections = self.conns.len();
        c.closed = self.conns.closed();
        c.qps = self.budget.used();
        c.device_losses = self.recovery.losses();
        c.device_present = self.recovery.node().is_some();
        c.authenticated = self.door.proved();
        c.node = self.recovery.any_node().map(|n| NodeStats {
            pool: n.pool_stats(),
            cqs: n.cq_count(),
            shared_queues: n.shared_queues(),
            shared_receives_posted: n.shared_receives_posted(),
            shared_reserves: n.shared_reserves(),
            shared_recv_buffers: n.shared_recv_buffers(),
        });
        MessageResult(c)
    }
}

/// The node's protection domain, while the device serves.
pub(crate) struct GetPd<T: Transport = Verbs>(std::marker::PhantomData<T>);

impl<T: Transport> GetPd<T> {
    pub fn new() -> Self {
        GetPd(std::marker::PhantomData)
    }
}

impl<T: Transport> Message for GetPd<T> {
    type Result = Option<T::Domain>;
}

impl<T: Transport> Handler<GetPd<T>> for CmActor<T> {
    type Result = Option<T::Domain>;
    fn handle(&mut self, _msg: GetPd<T>, _ctx: &mut Context<Self>) -> Self::Result {
        self.recovery.node().map(|n| n.pd.clone())
    }
}

/// Closes every connection of `cm`, waits until they released their resources, then
/// stops the actor and its event thread (the end of a server's or client's life).
pub(crate) async fn shut_down<T: Transport>(cm: &Addr<CmActor<T>>) {
    conn_set::drain(cm).await;
    let _ = cm.send(Stop).await;
}

impl<T: Transport> Handler<DeviceNotice> for CmActor<T> {
    type Result = ();
    fn handle(&mut self, msg: DeviceNotice, ctx: &mut Context<Self>) {
        match msg {
            DeviceNotice::Qp { qp_num, notice } => match self.conns.by_qp(qp_num) {
                Some(key) => self.conns.notify(key, notice),
                None => tracing::debug!(qp_num, ?notice, "device event for a QP no connection has"),
            },
            DeviceNotice::DeviceFatal => self.device_lost("failed (IBV_EVENT_DEVICE_FATAL)", ctx),
        }
    }
}

impl<T: Transport> Handler<OobReleased> for CmActor<T> {
    type Result = ();
    fn handle(&mut self, _msg: OobReleased, _ctx: &mut Context<Self>) {
        self.recovery.oob_released();
        self.recovery.try_release(!self.conns.is_empty());
    }
}

/// The CM actor's part in losing the device and serving again (the order is in
/// `recovery.rs`).
impl<T: Transport> CmActor<T> {
    /// The device was removed or failed (`how`): closes everything on it and waits for
    /// the connections to release before the node goes. Once per loss.
    fn device_lost(&mut self, how: &str, ctx: &mut Context<Self>) {
        let Some(reason) = self.recovery.lose(how, self.conns.len()) else {
            return;
        };
        self.conns.close_all(&reason);
        let mut ids: Vec<T::CmId> = self.listeners.drain().map(|(_, l)| l._id).collect();
        let err = || ConnectError::Resources(reason.to_string());
        ids.extend(self.dialing.fail_all(&reason, err));
        recovery::destroy_ids(ids);
        self.tell_services(|s| s.on_device_down());
        self.recovery
            .tell_oob_gone(&reason, ctx.address().recipient());
        self.recovery.try_release(!self.conns.is_empty());
    }

    /// Every [`recovery::POLL`] while absent: serves again on a returned device.
    fn look_for_device(&mut self, ctx: &mut Context<Self>) {
        if self.shutting_down {
            return;
        }
        let Some(found) = self.recovery.look() else {
            return;
        };
        if let Err(e) = self.serve_on(&found, ctx) {
            tracing::warn!(device = %found, error = %e, "the device is back but serving on it failed; trying again");
        }
    }

    /// Rebuilds the node on `device`, listens again, tells the services and the
    /// out-of-band listeners.
    fn serve_on(&mut self, device: &str, ctx: &mut Context<Self>) -> Result<(), String> {
        let Some(back) = self.recovery.serve_on(device, &self.channel)? else {
            return Ok(());
        };
        for (id, default) in back.listening {
            self.add_listener(id, default);
        }
        self.recovery.start_watch(ctx.address().recipient());
        self.tell_services(|s| s.on_device_up(&back.pd));
        self.recovery.say_back(device, back.since);
        Ok(())
    }
}
