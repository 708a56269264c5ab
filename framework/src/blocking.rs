//! Blocking, one-connection-at-a-time bring-up over rdma_cm, for small tools, examples and
//! tests that want verbs without the actor runtime.
//!
//! Each [`Endpoint`] has an event channel of its own (accepted ids are migrated off the
//! listener's channel), so waiting for its events never steals another connection's.
//! Receives are posted by the caller's `prepare` hook *before* the QP reaches RTR, so the
//! peer's first SEND never meets an empty receive queue.

use std::net::SocketAddr;
use std::time::Duration;

use crate::verbs::{
    CmEventKind, CmId, CompletionQueue, ConnParam, EventChannel, ProtectionDomain, QpCaps,
    QueuePair, Result, VerbsError, WorkCompletion,
};

/// Queue sizing and timeouts for a blocking endpoint.
#[derive(Debug, Clone, Copy)]
pub struct EndpointOptions {
    /// QP queue sizes.
    pub caps: QpCaps,
    /// CQ entries (send and receive completions share one CQ, so it covers both queues).
    pub cq_capacity: u32,
    /// How long each rdma_cm step may take.
    pub timeout: Duration,
    /// RNR NAK timer advertised after connecting (see `QueuePair::set_min_rnr_timer`).
    pub min_rnr_timer: u8,
}

impl Default for EndpointOptions {
    fn default() -> Self {
        let caps = QpCaps::default();
        EndpointOptions {
            caps,
            cq_capacity: caps.max_send_wr + caps.max_recv_wr,
            timeout: Duration::from_secs(10),
            min_rnr_timer: 12,
        }
    }
}

/// A connected RC endpoint: its cm_id, QP and CQ.
#[derive(Debug)]
pub struct Endpoint {
    /// The QP; post work requests here.
    pub qp: QueuePair,
    /// The CQ both queues complete to.
    pub cq: CompletionQueue,
    /// Private data the peer sent with its connect request or accept.
    pub peer_data: Vec<u8>,
    id: CmId,
    channel: EventChannel,
    timeout: Duration,
}

impl Endpoint {
    /// The cm_id (for addresses and device name).
    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// Busy-polls the CQ until `n` completions arrived; each must have succeeded.
    pub fn wait(&self, n: usize) -> Result<Vec<WorkCompletion>> {
        self.cq
            .poll_blocking(n, self.timeout)?
            .into_iter()
            .map(WorkCompletion::ok)
            .collect()
    }

    /// Busy-polls the CQ for `n` completions and returns them whatever their status.
    pub fn wait_any(&self, n: usize) -> Result<Vec<WorkCompletion>> {
        self.cq.poll_blocking(n, self.timeout)
    }

    /// Disconnects and waits for DISCONNECTED. The event arrives once the peer answers
    /// (its [`Endpoint::wait_disconnected`] does), so the peer must be running that
    /// concurrently, or have disconnected first.
    pub fn disconnect(self) -> Result<()> {
        // Both sides may disconnect at once; the second call then fails harmlessly.
        let _ = self.id.disconnect();
        self.wait_event(CmEventKind::Disconnected)
    }

    /// Waits until the peer disconnects, then answers (rdma_cm sends the CM DREP only
    /// when this side calls `rdma_disconnect` too).
    pub fn wait_disconnected(self) -> Result<()> {
        self.wait_event(CmEventKind::Disconnected)?;
        let _ = self.id.disconnect();
        Ok(())
    }

    fn wait_event(&self, kind: CmEventKind) -> Result<()> {
        loop {
            let ev = self
                .channel
                .next(Some(self.timeout))?
                .ok_or(VerbsError::Timeout("rdma_cm event"))?;
            if ev.kind == kind {
                return Ok(());
            }
        }
    }
}

/// Closes a connection from both ends at once: `active` disconnects while `passive`
/// waits for it and answers (on a scoped thread).
pub fn close_both(active: Endpoint, passive: Endpoint) -> Result<()> {
    std::thread::scope(|s| {
        let passive = s.spawn(move || passive.wait_disconnected());
        let active = active.disconnect();
        let passive = passive.join().expect("passive close thread");
        active.and(passive)
    })
}

/// A listening cm_id that accepts one connection at a time.
#[derive(Debug)]
pub struct Listener {
    id: CmId,
    channel: EventChannel,
}

impl Listener {
    /// Binds to `addr` (port 0 picks one) and listens.
    pub fn bind(addr: SocketAddr) -> Result<Listener> {
        let channel = EventChannel::new()?;
        let id = CmId::new(&channel)?;
        id.bind(addr)?;
        id.listen(128)?;
        Ok(Listener { id, channel })
    }

    /// The bound address (with the port actually chosen).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.local_addr()
    }

    /// Waits for a connect request, creates its QP on `pd`, runs `prepare` (post receives
    /// here), accepts with `accept_data` and waits for ESTABLISHED.
    pub fn accept(
        &self,
        pd: &ProtectionDomain,
        opts: &EndpointOptions,
        accept_data: &[u8],
        prepare: impl FnOnce(&QueuePair) -> Result<()>,
    ) -> Result<Endpoint> {
        let mut ev = self
            .channel
            .expect(CmEventKind::ConnectRequest, opts.timeout)?;
        let request = ev
            .take_request()
            .ok_or(VerbsError::InvalidArgument("request without an id".into()))?;
        let channel = EventChannel::new()?;
        let id = request.migrate(&channel)?;
        let cq = CompletionQueue::new(pd.context(), opts.cq_capacity, None)?;
        let qp = id.create_qp(pd, &cq, &cq, opts.caps, None)?;
        prepare(&qp)?;
        id.accept(&ConnParam {
            private_data: accept_data,
            responder_resources: ev.initiator_depth.clamp(1, 16),
            initiator_depth: ev.responder_resources.clamp(1, 16),
            ..ConnParam::default()
        })?;
        channel.expect(CmEventKind::Established, opts.timeout)?;
        qp.set_min_rnr_timer(opts.min_rnr_timer)?;
        Ok(Endpoint {
            qp,
            cq,
            peer_data: std::mem::take(&mut ev.private_data),
            id,
            channel,
            timeout: opts.timeout,
        })
    }
}

/// Connects to `addr`: resolves address and route, creates the QP on `pd`, runs
/// `prepare`, connects with `private_data` and waits for ESTABLISHED.
///
/// A reject comes back as [`VerbsError::UnexpectedEvent`] with `got: Rejected` and the
/// server's reject private data.
pub fn connect(
    pd: &ProtectionDomain,
    addr: SocketAddr,
    opts: &EndpointOptions,
    private_data: &[u8],
    prepare: impl FnOnce(&QueuePair) -> Result<()>,
) -> Result<Endpoint> {
    let channel = EventChannel::new()?;
    let id = CmId::new(&channel)?;
    id.resolve_addr(None, addr, opts.timeout)?;
    channel.expect(CmEventKind::AddrResolved, opts.timeout)?;
    id.resolve_route(opts.timeout)?;
    channel.expect(CmEventKind::RouteResolved, opts.timeout)?;
    let cq = CompletionQueue::new(pd.context(), opts.cq_capacity, None)?;
    let qp = id.create_qp(pd, &cq, &cq, opts.caps, None)?;
    prepare(&qp)?;
    id.connect(&ConnParam {
        private_data,
        ..ConnParam::default()
    })?;
    let ev = channel.expect(CmEventKind::Established, opts.timeout)?;
    qp.set_min_rnr_timer(opts.min_rnr_timer)?;
    Ok(Endpoint {
        qp,
        cq,
        peer_data: ev.private_data,
        id,
        channel,
        timeout: opts.timeout,
    })
}
