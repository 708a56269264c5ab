//! The connection manager of the loopback transport: rdma_cm's events and calls, in
//! memory.
//!
//! Addresses are socket addresses that name listeners in the fabric (nothing is bound
//! on the host). The calls keep rdma_cm's order and events: `resolve_addr` and
//! `resolve_route` answer ADDR_RESOLVED and ROUTE_RESOLVED at once; `connect` puts a
//! CONNECT_REQUEST, with the private data and a new id, on the listener's channel;
//! `accept` connects the two QPs and gives both sides ESTABLISHED (the active side's
//! with the accept's private data); `reject` gives the requester REJECTED with reason
//! 28 (consumer reject) and the private data; a connect to an address nobody listens
//! on is REJECTED with reason 8, as an IB CM answers; a connect to a listener whose
//! device does not answer (vanished) is UNREACHABLE after the fabric's CM timeout.
//! `disconnect` moves the local QP to the error state (as `rdma_disconnect` does) and
//! gives both sides DISCONNECTED. A peer that vanishes says nothing: its side is only
//! seen through the data path's timeouts.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use super::clock::Tick;
use super::core::{ack_timeout, DeviceCore};
use super::cq::Cq;
use super::error::{LoopbackError, Result};
use super::qp::{Qp, QpInner};
use super::srq::Srq;
use crate::verbs::{CmEventKind, ConnParam, QpCaps};

/// IB CM reject reason: no listener for the service ID.
const REJECT_NO_LISTENER: i32 = 8;
/// IB CM reject reason: the consumer (the application) rejected.
const REJECT_CONSUMER: i32 = 28;
/// The status of UNREACHABLE after a timeout (-ETIMEDOUT).
const TIMED_OUT: i32 = -110;
/// The longest private data of a connect, accept or reject (rdma_cm's limits for RC).
const MAX_PRIVATE_DATA: usize = 196;

/// Which cm_id an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CmIdKey(u64);

/// Where connection-manager events arrive. Cheap to clone.
#[derive(Clone, Default)]
pub struct EventChannel {
    inner: Arc<Events>,
}

#[derive(Default)]
struct Events {
    queue: Mutex<VecDeque<CmEvent>>,
    ready: Condvar,
}

impl EventChannel {
    /// The next event, waiting up to `timeout` (forever with `None`).
    pub fn next(&self, timeout: Option<Duration>) -> Option<CmEvent> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut queue = self.inner.queue.lock().expect("event channel lock");
        loop {
            if let Some(ev) = queue.pop_front() {
                return Some(ev);
            }
            queue = match deadline {
                None => self.inner.ready.wait(queue).expect("event channel lock"),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    let waited = self.inner.ready.wait_timeout(queue, left);
                    waited.expect("event channel lock").0
                }
            };
        }
    }

    /// The next event if one is ready.
    pub fn try_next(&self) -> Option<CmEvent> {
        self.next(Some(Duration::ZERO))
    }

    fn push(&self, ev: CmEvent) {
        self.inner
            .queue
            .lock()
            .expect("event channel lock")
            .push_back(ev);
        self.inner.ready.notify_one();
    }
}

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventChannel").finish_non_exhaustive()
    }
}

/// One connection-manager event.
#[derive(Debug)]
pub struct CmEvent {
    /// What happened.
    pub kind: CmEventKind,
    /// For REJECTED the reject reason; for UNREACHABLE -ETIMEDOUT.
    pub status: i32,
    /// The id it is about (for CONNECT_REQUEST: the new id).
    pub id: CmIdKey,
    /// For CONNECT_REQUEST: the listening id.
    pub listen_id: Option<CmIdKey>,
    /// The peer's private data (not padded).
    pub private_data: Vec<u8>,
    request: Option<CmId>,
}

impl CmEvent {
    fn new(kind: CmEventKind, id: CmIdKey) -> CmEvent {
        CmEvent {
            kind,
            status: 0,
            id,
            listen_id: None,
            private_data: Vec::new(),
            request: None,
        }
    }

    /// For CONNECT_REQUEST: the new id. Dropping it unanswered rejects the request.
    pub fn take_request(&mut self) -> Option<CmId> {
        self.request.take()
    }
}

/// The fabric's listeners and ids.
#[derive(Default)]
pub(super) struct Registry {
    listeners: Mutex<HashMap<SocketAddr, Weak<IdInner>>>,
    ids: Mutex<Vec<Weak<IdInner>>>,
    next_key: AtomicU64,
    /// The last ephemeral port given (to a bind of port 0, or an unbound connect).
    next_port: std::sync::atomic::AtomicU16,
}

impl Registry {
    /// A port for an address that asked for none, from 32768 up (wrapping).
    fn ephemeral_port(&self) -> u16 {
        32768 + self.next_port.fetch_add(1, Relaxed) % 28000
    }

    /// Tells every id of `device` that the device is gone.
    pub(super) fn device_removed(&self, device: &Arc<DeviceCore>) {
        let ids: Vec<_> = self.ids.lock().expect("registry lock").clone();
        for id in ids.iter().filter_map(Weak::upgrade) {
            if Arc::ptr_eq(&id.device, device) {
                id.channel
                    .push(CmEvent::new(CmEventKind::DeviceRemoval, id.key));
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    Listening,
    Resolved,
    Connecting,
    Requested,
    Connected,
    Closed,
}

struct IdState {
    phase: Phase,
    bound: Option<SocketAddr>,
    dst: Option<SocketAddr>,
    qp: Option<Qp>,
    peer: Option<Weak<IdInner>>,
    ack_timeout: Option<Duration>,
    /// The connect's retry counts (active side), kept for the accept.
    retries: (u8, u8),
    deadline: Option<Instant>,
}

struct IdInner {
    key: CmIdKey,
    device: Arc<DeviceCore>,
    registry: Arc<Registry>,
    channel: EventChannel,
    st: Mutex<IdState>,
    me: Weak<IdInner>,
}

/// A loopback cm_id: a listener, or one side of one connection. Cheap to clone.
#[derive(Clone)]
pub struct CmId {
    inner: Arc<IdInner>,
}

fn check_len(what: &str, data: &[u8]) -> Result<()> {
    if data.len() > MAX_PRIVATE_DATA {
        return Err(LoopbackError::InvalidArgument(format!(
            "{what} private data of {} bytes (at most {MAX_PRIVATE_DATA})",
            data.len()
        )));
    }
    Ok(())
}

impl CmId {
    pub(super) fn new(
        device: &Arc<DeviceCore>,
        registry: &Arc<Registry>,
        channel: &EventChannel,
    ) -> CmId {
        let key = CmIdKey(registry.next_key.fetch_add(1, Relaxed) + 1);
        let inner = Arc::new_cyclic(|me| IdInner {
            key,
            device: device.clone(),
            registry: registry.clone(),
            channel: channel.clone(),
            st: Mutex::new(IdState {
                phase: Phase::Idle,
                bound: None,
                dst: None,
                qp: None,
                peer: None,
                ack_timeout: None,
                retries: (7, 7),
                deadline: None,
            }),
            me: me.clone(),
        });
        let mut ids = registry.ids.lock().expect("registry lock");
        ids.retain(|id| id.strong_count() > 0);
        ids.push(Arc::downgrade(&inner));
        CmId { inner }
    }

    fn st(&self) -> std::sync::MutexGuard<'_, IdState> {
        self.inner.st.lock().expect("cm_id lock")
    }

    /// Routes events to this id's connection.
    pub fn key(&self) -> CmIdKey {
        self.inner.key
    }

    /// The QP created on this id, if any.
    pub fn qp(&self) -> Option<Qp> {
        self.st().qp.clone()
    }

    /// Binds a listener's address (port 0: one is picked, as the kernel would).
    pub fn bind(&self, mut addr: SocketAddr) -> Result<()> {
        if addr.port() == 0 {
            addr.set_port(self.inner.registry.ephemeral_port());
        }
        self.st().bound = Some(addr);
        Ok(())
    }

    /// The bound address, or the one an unbound connect was given.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.st().bound
    }

    /// The resolved destination, or on a request the connecting side's address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.st().dst
    }

    /// The name of the device the id was created on.
    pub fn device_name(&self) -> &str {
        &self.inner.device.name
    }

    /// The device the id was created on.
    pub(super) fn device_core(&self) -> &Arc<DeviceCore> {
        &self.inner.device
    }

    /// Listens on the bound address (CONNECT_REQUEST events follow).
    pub fn listen(&self, _backlog: i32) -> Result<()> {
        let addr = self
            .st()
            .bound
            .ok_or(LoopbackError::BadState("listen before bind"))?;
        let mut listeners = self.inner.registry.listeners.lock().expect("registry lock");
        if listeners.get(&addr).is_some_and(|l| l.strong_count() > 0) {
            return Err(LoopbackError::AddressInUse(addr));
        }
        listeners.insert(addr, self.inner.me.clone());
        self.st().phase = Phase::Listening;
        Ok(())
    }

    /// Notes `dst`; ADDR_RESOLVED follows at once.
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        _timeout: Duration,
    ) -> Result<()> {
        let mut st = self.st();
        st.dst = Some(dst);
        if st.bound.is_none() {
            let ip = src.map_or(std::net::Ipv4Addr::LOCALHOST.into(), |s| s.ip());
            st.bound = Some(SocketAddr::new(ip, self.inner.registry.ephemeral_port()));
        }
        drop(st);
        self.event(CmEventKind::AddrResolved);
        Ok(())
    }

    /// ROUTE_RESOLVED follows at once.
    pub fn resolve_route(&self, _timeout: Duration) -> Result<()> {
        let mut st = self.st();
        if st.dst.is_none() {
            return Err(LoopbackError::BadState("resolve_route before resolve_addr"));
        }
        st.phase = Phase::Resolved;
        drop(st);
        self.event(CmEventKind::RouteResolved);
        Ok(())
    }

    /// Sets the ACK timeout of this id's QP (4.096 us × 2^exponent).
    pub fn set_ack_timeout(&self, exponent: u8) -> Result<()> {
        let timeout = ack_timeout(exponent);
        let mut st = self.st();
        st.ack_timeout = timeout;
        if let (Some(qp), Some(t)) = (&st.qp, timeout) {
            qp.set_ack_timeout(t);
        }
        Ok(())
    }

    /// Creates this id's QP on `device` (which must be the id's); `Device` has the
    /// public form.
    pub(super) fn create_qp_on(
        &self,
        device: &Arc<DeviceCore>,
        send_cq: &Cq,
        recv_cq: &Cq,
        caps: QpCaps,
        srq: Option<&Srq>,
    ) -> Result<Qp> {
        if !Arc::ptr_eq(device, &self.inner.device) {
            return Err(LoopbackError::InvalidArgument(
                "the cm_id belongs to another device".into(),
            ));
        }
        let mut st = self.st();
        if st.qp.is_some() {
            return Err(LoopbackError::BadState("the cm_id has a QP already"));
        }
        let qp = Qp::create(&self.inner.device, send_cq, recv_cq, caps, srq)?;
        if let Some(t) = st.ack_timeout {
            qp.set_ack_timeout(t);
        }
        st.qp = Some(qp.clone());
        Ok(qp)
    }

    fn event(&self, kind: CmEventKind) {
        self.inner.channel.push(CmEvent::new(kind, self.inner.key));
    }

    /// Sends a connect request to the resolved address (ESTABLISHED, REJECTED or
    /// UNREACHABLE follows).
    pub fn connect(&self, param: &ConnParam<'_>) -> Result<()> {
        check_len("connect", param.private_data)?;
        let mut st = self.st();
        if st.phase != Phase::Resolved || st.qp.is_none() {
            return Err(LoopbackError::BadState(
                "connect needs a resolved route and a QP",
            ));
        }
        let dst = st.dst.expect("resolved");
        let listener = self
            .inner
            .registry
            .listeners
            .lock()
            .expect("registry lock")
            .get(&dst)
            .and_then(Weak::upgrade);
        let Some(listener) = listener else {
            st.phase = Phase::Idle;
            drop(st);
            let mut ev = CmEvent::new(CmEventKind::Rejected, self.inner.key);
            ev.status = REJECT_NO_LISTENER;
            self.inner.channel.push(ev);
            return Ok(());
        };
        st.phase = Phase::Connecting;
        st.retries = (param.retry_count, param.rnr_retry_count);
        if !listener.device.answers() {
            let at = Instant::now() + self.inner.device.fabric.config.cm_timeout;
            st.deadline = Some(at);
            drop(st);
            let me: Weak<dyn Tick> = self.inner.me.clone();
            self.inner.device.fabric.clock.schedule(at, me);
            return Ok(());
        }
        drop(st);
        let passive = CmId::new(&listener.device, &listener.registry, &listener.channel);
        {
            let mut pst = passive.st();
            pst.phase = Phase::Requested;
            pst.peer = Some(self.inner.me.clone());
            pst.bound = Some(dst);
            pst.dst = self.st().bound;
        }
        let mut ev = CmEvent::new(CmEventKind::ConnectRequest, passive.key());
        ev.listen_id = Some(listener.key);
        ev.private_data = param.private_data.to_vec();
        ev.request = Some(passive);
        listener.channel.push(ev);
        Ok(())
    }

    /// Accepts a request: both sides get ESTABLISHED.
    pub fn accept(&self, param: &ConnParam<'_>) -> Result<()> {
        check_len("accept", param.private_data)?;
        let (qp, peer) = {
            let st = self.st();
            if st.phase != Phase::Requested {
                return Err(LoopbackError::BadState("accept without a connect request"));
            }
            let qp = st
                .qp
                .clone()
                .ok_or(LoopbackError::BadState("accept before create_qp"))?;
            (qp, st.peer.as_ref().and_then(Weak::upgrade))
        };
        let peer = peer.map(|inner| CmId { inner });
        let Some(peer) = peer else {
            return Err(LoopbackError::BadState("the requester is gone"));
        };
        let (peer_qp, retries) = {
            let mut pst = peer.st();
            if pst.phase != Phase::Connecting {
                return Err(LoopbackError::BadState("the requester gave up"));
            }
            pst.phase = Phase::Connected;
            pst.peer = Some(self.inner.me.clone());
            (
                pst.qp.clone().expect("a connecting id has a QP"),
                pst.retries,
            )
        };
        let requester = ConnParam {
            retry_count: retries.0,
            rnr_retry_count: retries.1,
            ..ConnParam::default()
        };
        QpInner::connect(&peer_qp.inner, &qp.inner, &requester)?;
        QpInner::connect(&qp.inner, &peer_qp.inner, param)?;
        self.st().phase = Phase::Connected;
        let mut ev = CmEvent::new(CmEventKind::Established, peer.key());
        ev.private_data = param.private_data.to_vec();
        peer.inner.channel.push(ev);
        self.event(CmEventKind::Established);
        Ok(())
    }

    /// Rejects a request; `private_data` reaches the requester's REJECTED.
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        check_len("reject", private_data)?;
        let mut st = self.st();
        if st.phase != Phase::Requested {
            return Err(LoopbackError::BadState("reject without a connect request"));
        }
        st.phase = Phase::Closed;
        let peer = st.peer.as_ref().and_then(Weak::upgrade);
        drop(st);
        if let Some(peer) = peer {
            peer.rejected(REJECT_CONSUMER, private_data);
        }
        Ok(())
    }

    /// Moves the local QP to the error state; both sides get DISCONNECTED (the peer
    /// only if its device answers).
    pub fn disconnect(&self) -> Result<()> {
        let (qp, peer) = {
            let mut st = self.st();
            if st.phase != Phase::Connected {
                return Err(LoopbackError::BadState("disconnect while not connected"));
            }
            st.phase = Phase::Closed;
            (st.qp.clone(), st.peer.as_ref().and_then(Weak::upgrade))
        };
        if let Some(qp) = qp {
            qp.to_error()?;
        }
        self.event(CmEventKind::Disconnected);
        if let Some(peer) = peer.filter(|p| p.device.answers()) {
            let mut pst = peer.st.lock().expect("cm_id lock");
            if pst.phase == Phase::Connected {
                pst.phase = Phase::Closed;
                drop(pst);
                peer.channel
                    .push(CmEvent::new(CmEventKind::Disconnected, peer.key));
            }
        }
        Ok(())
    }
}

impl IdInner {
    /// The active side's request was rejected with `reason`.
    fn rejected(&self, reason: i32, private_data: &[u8]) {
        let mut st = self.st.lock().expect("cm_id lock");
        if st.phase != Phase::Connecting {
            return;
        }
        st.phase = Phase::Idle;
        drop(st);
        let mut ev = CmEvent::new(CmEventKind::Rejected, self.key);
        ev.status = reason;
        ev.private_data = private_data.to_vec();
        self.channel.push(ev);
    }
}

impl Tick for IdInner {
    /// A connect to a device that does not answer timed out.
    fn tick(&self) {
        let mut st = self.st.lock().expect("cm_id lock");
        if st.phase != Phase::Connecting || st.deadline.is_none_or(|d| d > Instant::now()) {
            return;
        }
        st.phase = Phase::Idle;
        st.deadline = None;
        drop(st);
        let mut ev = CmEvent::new(CmEventKind::Unreachable, self.key);
        ev.status = TIMED_OUT;
        self.channel.push(ev);
    }
}

impl Drop for IdInner {
    fn drop(&mut self) {
        let st = self.st.get_mut().expect("cm_id lock");
        // A request dropped unanswered is a reject, as with rdma_cm.
        if st.phase == Phase::Requested {
            if let Some(peer) = st.peer.as_ref().and_then(Weak::upgrade) {
                peer.rejected(REJECT_CONSUMER, &[]);
            }
        }
        if let (Phase::Listening, Some(addr)) = (st.phase, st.bound) {
            let mut listeners = self.registry.listeners.lock().expect("registry lock");
            if listeners.get(&addr).is_some_and(|l| l.strong_count() == 0) {
                listeners.remove(&addr);
            }
        }
    }
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmId")
            .field("key", &self.inner.key)
            .field("device", &self.inner.device.name)
            .finish()
    }
}
