//! The second way in: QPs brought up out of band, without rdma_cm.
//!
//! An out-of-band port is a TCP listener speaking the exchange of rdma-core's
//! `ibv_rc_pingpong`, `ibv_uc_pingpong`, `ibv_ud_pingpong` and `ibv_srq_pingpong`
//! (`proto::oob`). For each client it reads the QP records, creates the QP(s) on the
//! shared PD and a poller's CQ, posts receives, walks them RESET → INIT → RTR → RTS
//! (`verbs::Bringup`), answers with its own records, and hands each QP to a connection
//! actor running the port's service, exactly as the CM actor does for rdma_cm clients:
//! same pollers, pool, sessions and teardown. Many clients are served at once; one port
//! per transport.
//!
//! ```text
//! TCP (non-blocking) ──► OOB listener actor ── per client: read records (deadline)
//!                             │  bring-up: QP(s) + receives (+ SRQ) → RTS, answer, "done"
//!                             ▼
//!                  connection actors (one per QP) on the poller threads
//! ```
//!
//! Bad input ends only the client that sent it, with the reason logged: malformed or
//! truncated records, a GID the device cannot reach (the RTR transition or the address
//! handle fails), a client that connects and never writes (the exchange deadline), one
//! that leaves before `done` (its QPs are closed). A client that vanishes during the
//! ping-pong is noticed by its service (the stock tools say nothing over TCP after
//! `done`; the ping-pong services close a connection idle for longer than their limit)
//! or by a failed send (RC retries exhausted).

mod bringup;
mod clients;
mod listener;

use std::net::SocketAddr;
use std::time::Duration;

use crate::verbs::Mtu;

pub(crate) use listener::{GetOobStats, OobListener};

/// The transport of an out-of-band port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OobTransport {
    /// `ibv_rc_pingpong`: one RC QP per client.
    Rc,
    /// `ibv_uc_pingpong`: one UC QP per client.
    Uc,
    /// `ibv_ud_pingpong`: one UD QP per client, bound to the client's QP; every message
    /// the session sees starts with the 40-byte GRH ([`Grh`](crate::verbs::Grh)).
    Ud,
    /// `ibv_srq_pingpong`: several RC QPs per client (its `-q`, at most
    /// [`OobOptions::max_qps_per_client`]) sharing one receive queue.
    Srq,
}

impl OobTransport {
    /// Records exchanged each way.
    pub fn records(self) -> usize {
        match self {
            OobTransport::Srq => crate::proto::oob::SRQ_RECORDS,
            _ => 1,
        }
    }
}

impl std::fmt::Display for OobTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OobTransport::Rc => "rc",
            OobTransport::Uc => "uc",
            OobTransport::Ud => "ud",
            OobTransport::Srq => "srq",
        })
    }
}

/// Settings of an out-of-band port: what the stock server takes as options.
#[derive(Debug, Clone)]
pub struct OobOptions {
    /// Device port (`-i`, default 1).
    pub ib_port: u8,
    /// Local GID index (`-g`); `None` picks, per client, a GID of the same kind as the
    /// client's (IPv4-mapped for an IPv4-mapped GID, otherwise the first other one).
    pub gid_index: Option<u8>,
    /// Path MTU (`-m`, default 1024; capped at the port's active MTU). RC and UC.
    pub mtu: Mtu,
    /// Service level (`-l`, default 0).
    pub sl: u8,
    /// How long a client may take to send its records, and to say `done`.
    pub exchange_timeout: Duration,
    /// Clients whose exchange is under way or whose QPs are open, at most; more are
    /// refused (the socket is closed at once).
    pub max_clients: usize,
    /// Clients one peer address (the TCP peer's IP) may have under way or open at once,
    /// counted as `max_clients` is (0: no limit); more from it are refused the same way,
    /// with a reason naming this limit and the address, while other addresses get in.
    /// Default 64, as rdma_cm's per-peer limit
    /// ([`DEFAULT_MAX_CONNECTIONS_PER_PEER`](crate::runtime::DEFAULT_MAX_CONNECTIONS_PER_PEER)):
    /// without it one host could hold every one of the `max_clients`.
    pub max_clients_per_peer: usize,
    /// QPs one `ibv_srq_pingpong` client may ask for. Default 16, the tool's own
    /// default `-q`: a client asking for more is refused whole.
    pub max_qps_per_client: usize,
    /// QPs the clients of one peer address may hold at once on this port (0: no
    /// limit); a client that would take it past the limit is refused whole, before any
    /// QP is built, with a reason naming the limit.
    ///
    /// Needed beyond the two caps above, because their product is not small: 64 clients
    /// × 16 QPs is 1,024 QPs, the whole default `max_connections`, which the port draws
    /// from the budget rdma_cm clients share; one host of `ibv_srq_pingpong` clients
    /// would leave every rdma_cm client refused with `ServerFull`. A fixed number rather
    /// than a share of the budget, for the reason the rdma_cm limit is one: a share lets
    /// a few addresses take it all. Default 64, so that one address holds at most 64 QPs
    /// per port and 64 connections over rdma_cm.
    pub max_qps_per_peer: usize,
    /// Receives posted to each client's shared receive queue (SRQ ports).
    pub srq_depth: u32,
}

impl Default for OobOptions {
    fn default() -> Self {
        OobOptions {
            ib_port: 1,
            gid_index: None,
            mtu: Mtu::M1024,
            sl: 0,
            exchange_timeout: Duration::from_secs(5),
            max_clients: 1024,
            max_clients_per_peer: 64,
            max_qps_per_client: 16,
            max_qps_per_peer: 64,
            srq_depth: 64,
        }
    }
}

/// One out-of-band listener: TCP address, transport, the (raw) service its clients
/// get, settings.
#[derive(Debug, Clone)]
pub struct OobPort {
    /// TCP address to listen on (port 0 picks one).
    pub addr: SocketAddr,
    /// Which tool's exchange and QP type.
    pub transport: OobTransport,
    /// The registered service every QP of this port runs (its framing must be raw).
    pub service: String,
    /// Settings.
    pub options: OobOptions,
}

impl OobPort {
    /// A port with default settings.
    pub fn new(addr: SocketAddr, transport: OobTransport, service: &str) -> OobPort {
        OobPort {
            addr,
            transport,
            service: service.to_owned(),
            options: OobOptions::default(),
        }
    }
}

/// Counters of one out-of-band port.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OobStats {
    /// The bound TCP address.
    pub addr: Option<SocketAddr>,
    /// Its transport.
    pub transport: Option<OobTransport>,
    /// Clients whose QPs reached RTS and who said `done`.
    pub clients: u64,
    /// Clients refused or dropped during the exchange (each with a logged reason).
    pub refused: u64,
    /// QPs (connections) open now.
    pub connections: usize,
    /// Connections closed and released since start.
    pub closed: u64,
    /// The last refusal's reason, for operators and tests.
    pub last_refusal: Option<String>,
}
