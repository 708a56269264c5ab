//! The out-of-band listener actor: accepts TCP clients without blocking, runs each
//! client's exchange as its own task (with deadlines), brings the QPs up on the actor
//! and starts a connection actor per QP. It keeps the bookkeeping the CM actor keeps for
//! rdma_cm connections: which are open, counters, and a drain at shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use super::bringup::prepare;
use super::clients::{ClientId, Clients, Limits};
use super::{OobPort, OobStats, OobTransport};
use crate::proto::oob::{self, ExchangeError, RECORD_LEN};
use crate::runtime::budget::QpBudget;
use crate::runtime::close::CloseReason;
use crate::runtime::conn_set::{ConnSet, Drain};
use crate::runtime::connection::{panic_message, CmNotice, ConnClosed, ConnectionParts, Handshake};
use crate::runtime::node::Node;
use crate::runtime::recovery::{OobDeviceBack, OobDeviceGone, OobReleased};
use crate::runtime::service::{PeerInfo, Service};
use crate::verbs::CmIdKey;

pub(crate) struct OobListener {
    /// The server's node while its device serves (`None` after the device went: clients
    /// are refused until the CM actor hands over the rebuilt node).
    node: Option<Arc<Node>>,
    /// Told once the connections closed for a lost device have released and the node
    /// has been let go.
    device_gone: Option<Recipient<OobReleased>>,
    port: OobPort,
    service: Arc<dyn Service>,
    listener: Option<std::net::TcpListener>,
    stop_accepting: Option<oneshot::Sender<()>>,
    /// The QPs' connections, each with the client it belongs to.
    conns: ConnSet<ClientId>,
    /// The clients counted under `max_clients` and the per-peer limits, kept as they
    /// are accepted, finish their exchange and close their QPs (not recounted per
    /// accept).
    clients: Clients,
    next_key: usize,
    /// The server's connection limit, shared with the CM actor: a client's QPs are
    /// taken from it all or none.
    budget: QpBudget,
    shutting_down: bool,
    /// Its counters but `connections` and `closed` (read from `conns`).
    stats: OobStats,
}

impl OobListener {
    /// Binds the TCP port (non-blocking); the actor starts accepting once started.
    pub fn bind(
        node: Arc<Node>,
        port: OobPort,
        service: Arc<dyn Service>,
        budget: QpBudget,
    ) -> std::io::Result<(OobListener, SocketAddr)> {
        let listener = std::net::TcpListener::bind(port.addr)?;
        listener.set_nonblocking(true)?;
        let bound = listener.local_addr()?;
        let stats = OobStats {
            addr: Some(bound),
            transport: Some(port.transport),
            ..OobStats::default()
        };
        let clients = Clients::new(Limits::from(&port.options));
        Ok((
            OobListener {
                node: Some(node),
                device_gone: None,
                port,
                service,
                listener: Some(listener),
                stop_accepting: None,
                conns: ConnSet::default(),
                clients,
                next_key: 1,
                budget,
                shutting_down: false,
                stats,
            },
            bound,
        ))
    }

    fn refuse(&mut self, peer: SocketAddr, reason: &str) {
        self.stats.refused += 1;
        self.stats.last_refusal = Some(reason.to_owned());
        tracing::warn!(%peer, transport = %self.port.transport, reason, "out-of-band client refused");
    }

    /// Brings up a client's QPs from its records and starts their connections.
    fn on_records(
        &mut self,
        client: ClientId,
        peer: SocketAddr,
        bytes: &[u8],
        ctx: &mut Context<Self>,
    ) -> Result<Brought, String> {
        if self.shutting_down {
            return Err("server is shutting down".into());
        }
        let transport = self.port.transport;
        let records = oob::decode_records(bytes, transport.records()).map_err(|e| e.to_string())?;
        let peers = match transport {
            OobTransport::Srq => oob::srq_qps(&records, self.port.options.max_qps_per_client)
                .map_err(|e| e.to_string())?,
            _ => records,
        };
        for dest in &peers {
            oob::check_peer_record(dest, peer.ip()).map_err(|e| e.to_string())?;
        }
        self.clients.check_qps(client, peers.len())?;
        let mut slots = self
            .budget
            .take(peers.len())
            .map_err(|full| format!("{} QPs asked for: {full}", peers.len()))?;
        let framing = self.service.framing();
        let Some(node) = &self.node else {
            return Err("the server's RDMA device is gone".into());
        };
        let prepared = prepare(node, transport, &self.port.options, framing, &peers)?;
        let mut sessions = Vec::with_capacity(prepared.cores.len());
        let mut registered = Vec::with_capacity(prepared.cores.len());
        for core in &prepared.cores {
            let info = PeerInfo {
                addr: Some(peer),
                qp_num: core.qp_num(),
                service: self.port.service.clone(),
                // Stock ibv_*_pingpong clients cannot authenticate: out-of-band
                // services are anonymous (the server refuses to start otherwise).
                identity: crate::runtime::service::Identity::Anonymous,
            };
            // The service's code on this actor: a panic must not end the listener.
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.service.session(&info)
            })) {
                Ok(s) => sessions.push((s, info)),
                Err(p) => return Err(format!("service panicked: {}", panic_message(&*p))),
            }
        }
        for (mut core, (session, info)) in prepared.cores.into_iter().zip(sessions) {
            if let Some(slot) = slots.split_one() {
                core.hold_slot(slot);
            }
            let key = CmIdKey::out_of_band(self.next_key);
            self.next_key += 1;
            let label = format!(
                "{}/{}/qp{}/{}",
                peer, transport, info.qp_num, self.port.service
            );
            let (tx, rx) = oneshot::channel();
            registered.push(rx);
            let parts = ConnectionParts {
                core,
                session,
                cm: ctx.address().recipient(),
                key,
                label,
                handshake: Handshake::OutOfBand(tx),
                handed_over: std::time::Instant::now(),
            };
            let addr = self.conns.start(parts, client);
            // RTS already: the session may send as soon as its actor runs.
            addr.do_send(CmNotice::Established { peer: None });
            self.clients.opened(client, 1);
        }
        Ok(Brought {
            answer: oob::encode_records(&prepared.answer, transport.records()),
            registered,
        })
    }

    fn close_client(&mut self, client: ClientId, reason: &str) {
        let reason = CloseReason::Protocol(reason.to_owned());
        self.conns.close_where(|&c| c == client, &reason);
    }
}

impl Actor for OobListener {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let Some(std_listener) = self.listener.take() else {
            return;
        };
        let listener = match TcpListener::from_std(std_listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "out-of-band listener cannot start");
                return;
            }
        };
        let (stop_tx, mut stop_rx) = oneshot::channel();
        self.stop_accepting = Some(stop_tx);
        let me = ctx.address();
        actix::spawn(async move {
            loop {
                tokio::select! {
                    _ = &mut stop_rx => break,
                    accepted = listener.accept() => match accepted {
                        Ok((stream, peer)) => me.do_send(Accepted { stream, peer }),
                        Err(e) => {
                            tracing::warn!(error = %e, "accepting an out-of-band client failed");
                            actix::clock::sleep(Duration::from_millis(10)).await;
                        }
                    },
                }
            }
        });
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct Accepted {
    stream: TcpStream,
    peer: SocketAddr,
}

impl Handler<Accepted> for OobListener {
    type Result = ();

    fn handle(&mut self, msg: Accepted, ctx: &mut Context<Self>) {
        if self.shutting_down {
            return self.refuse(msg.peer, "server is shutting down");
        }
        // Refused by dropping the stream: the socket closes at once.
        let client = match self.clients.admit(msg.peer.ip()) {
            Ok(client) => client,
            Err(why) => return self.refuse(msg.peer, &why),
        };
        let me = ctx.address();
        let records = self.port.transport.records();
        let timeout = self.port.options.exchange_timeout;
        actix::spawn(exchange(client, msg.stream, msg.peer, me, records, timeout));
    }
}

/// Reads exactly `buf.len()` bytes; on EOF, how many arrived.
async fn read_full(stream: &TcpStream, buf: &mut [u8]) -> Result<(), ExchangeError> {
    let mut got = 0;
    while got < buf.len() {
        stream
            .readable()
            .await
            .map_err(|_| ExchangeError::Truncated {
                got,
                want: buf.len(),
            })?;
        match stream.try_read(&mut buf[got..]) {
            Ok(0) => {
                return Err(ExchangeError::Truncated {
                    got,
                    want: buf.len(),
                })
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => {
                return Err(ExchangeError::Truncated {
                    got,
                    want: buf.len(),
                })
            }
        }
    }
    Ok(())
}

async fn write_all(stream: &TcpStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        stream.writable().await?;
        match stream.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One client's exchange: its records (within the deadline), the bring-up on the actor,
/// our records, its `done`. Every failure is reported to the actor with the reason.
async fn exchange(
    client: ClientId,
    stream: TcpStream,
    peer: SocketAddr,
    me: Addr<OobListener>,
    records: usize,
    timeout: Duration,
) {
    let mut buf = vec![0u8; records * RECORD_LEN];
    let read = tokio::time::timeout(timeout, read_full(&stream, &mut buf)).await;
    let failed = match read {
        Err(_) => Some(format!(
            "no complete records within {timeout:?} (silent client)"
        )),
        Ok(Err(e)) => Some(e.to_string()),
        Ok(Ok(())) => None,
    };
    if let Some(reason) = failed {
        me.do_send(ExchangeOver {
            client,
            peer,
            outcome: Err(reason),
        });
        return;
    }
    let answer = match me
        .send(Records {
            client,
            peer,
            bytes: buf,
        })
        .await
    {
        Ok(Ok(brought)) => {
            // A connection that ended before registering dropped its sender: nothing
            // to wait for.
            for registered in brought.registered {
                let _ = registered.await;
            }
            brought.answer
        }
        Ok(Err(reason)) => {
            me.do_send(ExchangeOver {
                client,
                peer,
                outcome: Err(reason),
            });
            return;
        }
        Err(_) => return,
    };
    let finish = async {
        write_all(&stream, &answer)
            .await
            .map_err(|e| format!("sending our records failed: {e}"))?;
        let mut done = [0u8; oob::DONE.len()];
        read_full(&stream, &mut done)
            .await
            .map_err(|e| format!("no \"done\": {e}"))?;
        oob::check_done(&done).map_err(|e| e.to_string())
    };
    let outcome = match tokio::time::timeout(timeout, finish).await {
        Err(_) => Err(format!("no \"done\" within {timeout:?}")),
        Ok(r) => r,
    };
    if let Err(reason) = &outcome {
        me.do_send(Abandon {
            client,
            reason: reason.clone(),
        });
    }
    me.do_send(ExchangeOver {
        client,
        peer,
        outcome,
    });
}

#[derive(Message)]
#[rtype(result = "Result<Brought, String>")]
struct Records {
    client: ClientId,
    peer: SocketAddr,
    bytes: Vec<u8>,
}

/// A client's QPs brought up: our records for it, and one receiver per QP that hears
/// once the QP's connection is registered with its poller. The records go out only
/// then, so the client cannot send to a QP the poller does not know yet.
struct Brought {
    answer: Vec<u8>,
    registered: Vec<oneshot::Receiver<()>>,
}

impl Handler<Records> for OobListener {
    type Result = Result<Brought, String>;

    fn handle(&mut self, msg: Records, ctx: &mut Context<Self>) -> Self::Result {
        self.on_records(msg.client, msg.peer, &msg.bytes, ctx)
    }
}

/// The client left or misbehaved after its QPs were up: close them.
#[derive(Message)]
#[rtype(result = "()")]
struct Abandon {
    client: ClientId,
    reason: String,
}

impl Handler<Abandon> for OobListener {
    type Result = ();

    fn handle(&mut self, msg: Abandon, _: &mut Context<Self>) {
        self.close_client(msg.client, &msg.reason);
    }
}

/// A client's exchange ended: `done` said, or refused with the reason.
#[derive(Message)]
#[rtype(result = "()")]
struct ExchangeOver {
    client: ClientId,
    peer: SocketAddr,
    outcome: Result<(), String>,
}

impl Handler<ExchangeOver> for OobListener {
    type Result = ();

    fn handle(&mut self, msg: ExchangeOver, _: &mut Context<Self>) {
        self.clients.exchange_over(msg.client);
        match msg.outcome {
            Ok(()) => {
                self.stats.clients += 1;
                tracing::info!(peer = %msg.peer, client = msg.client, transport = %self.port.transport, "out-of-band client connected");
            }
            Err(reason) => self.refuse(msg.peer, &reason),
        }
    }
}

impl Handler<ConnClosed> for OobListener {
    type Result = ();

    fn handle(&mut self, msg: ConnClosed, _: &mut Context<Self>) {
        if let Some(client) = self.conns.release(msg.key) {
            self.clients.closed(client);
        }
        tracing::debug!(reason = %msg.reason, "out-of-band connection released");
        if self.conns.answer_if_drained() {
            if self.shutting_down {
                self.node = None;
            }
            self.release_node();
        }
    }
}

impl OobListener {
    /// After the device went, once every connection released: lets the node go and
    /// tells the CM actor.
    fn release_node(&mut self) {
        if let Some(released) = self.device_gone.take() {
            self.node = None;
            released.do_send(OobReleased);
        }
    }
}

impl Handler<OobDeviceGone> for OobListener {
    type Result = ();

    fn handle(&mut self, msg: OobDeviceGone, _: &mut Context<Self>) {
        tracing::warn!(transport = %self.port.transport, connections = self.conns.len(), "out-of-band port: closing every connection, the device went; the TCP port stays open and refuses clients until it is back");
        self.conns.close_all(&msg.reason);
        self.device_gone = Some(msg.released);
        if self.conns.is_empty() {
            self.release_node();
        }
    }
}

impl Handler<OobDeviceBack> for OobListener {
    type Result = ();

    fn handle(&mut self, msg: OobDeviceBack, _: &mut Context<Self>) {
        self.node = Some(msg.0);
    }
}

/// Reads the counters.
#[derive(Message)]
#[rtype(result = "OobStats")]
pub(crate) struct GetOobStats;

impl Handler<GetOobStats> for OobListener {
    type Result = MessageResult<GetOobStats>;

    fn handle(&mut self, _: GetOobStats, _: &mut Context<Self>) -> Self::Result {
        let mut stats = self.stats.clone();
        stats.connections = self.conns.len();
        stats.closed = self.conns.closed();
        MessageResult(stats)
    }
}

/// Stops accepting, closes every connection, and answers once all are released (the
/// node let go first).
impl Handler<Drain> for OobListener {
    type Result = ();

    fn handle(&mut self, msg: Drain, _: &mut Context<Self>) {
        self.shutting_down = true;
        if let Some(stop) = self.stop_accepting.take() {
            let _ = stop.send(());
        }
        if self.conns.is_empty() {
            self.node = None;
        }
        self.conns.drain(msg.0);
    }
}
