//! Device-level resources a server or client shares among all its connections: one
//! device and its PD, the registered-memory pool, the poller threads.

use std::sync::Arc;

use super::config::NodeConfig;
use super::connection::{Core, CoreParts, ServiceGates};
use super::poller::Pollers;
use super::recv_groups::{RecvGroups, ReserveStats};
use super::service::Framing;
use crate::memory::{MrPool, PoolStats};
use crate::proto::credits::{Advert, CreditWindow};
use crate::transport::{Access, CmId, Domain, QpCaps, Transport, Verbs};

pub(crate) struct Node<T: Transport = Verbs> {
    // Field order is drop order: the queues and pollers before the pool, the pool
    // before the PD its memory is registered on.
    /// Shared receive queues of framed connections (`None`: a queue per connection).
    recv_groups: Option<RecvGroups<T>>,
    pollers: Pollers<T>,
    pub pool: MrPool<T>,
    pub pd: T::Domain,
    pub config: NodeConfig,
    /// Each service's bound on its connections' blocking closures.
    blocking: ServiceGates,
}

/// Logs the locked-memory limit and registers (then frees) one pool arena, so that a
/// limit too small to serve anything stops the node at start with
/// [`VerbsError::Memlock`](crate::verbs::VerbsError::Memlock) naming it, rather than
/// failing every connection later. A limit that allows the probe but not the whole
/// pool is named by each registration it refuses.
fn check_memlock<T: Transport>(pd: &T::Domain, arena_bytes: usize) -> Result<(), T::Error> {
    match (T::PINS_MEMORY, T::memlock_limit()) {
        (false, _) => {}
        (true, None) => tracing::info!("RLIMIT_MEMLOCK is unlimited"),
        (true, Some(limit)) => tracing::info!(
            limit_bytes = limit,
            "RLIMIT_MEMLOCK (ulimit -l) applies to registered memory unless the process holds CAP_IPC_LOCK"
        ),
    }
    pd.register(arena_bytes.max(4096), Access::LOCAL_WRITE)
        .map(drop)
}

impl<T: Transport> Node<T> {
    /// Opens the configured device and starts the pollers. Must run inside an actix
    /// System.
    pub fn start(config: NodeConfig) -> Result<Arc<Node<T>>, T::Error> {
        let pd = T::open(config.transport.device.as_deref())?;
        Node::start_on(pd, config)
    }

    /// Serves on `pd`, a device already open (a loopback device of a test's own
    /// fabric, say), and starts the pollers.
    pub fn start_on(pd: T::Domain, config: NodeConfig) -> Result<Arc<Node<T>>, T::Error> {
        check_memlock::<T>(&pd, config.pool.arena_bytes)?;
        let pool = MrPool::registered(&pd, config.pool.clone());
        let pollers = Pollers::start(
            &pd,
            config.transport.pollers,
            config.transport.poll_mode,
            config.transport.max_cqs,
        )?;
        let recv_groups = config
            .receives
            .shared
            .clone()
            .map(|cfg| RecvGroups::new(&pd, &pool, cfg, config.receives.size as usize));
        Ok(Arc::new(Node {
            recv_groups,
            pollers,
            pool,
            pd,
            config,
            blocking: ServiceGates::default(),
        }))
    }

    /// Counts `core`'s blocking closures under `service`'s bound
    /// (`ConnectionConfig::blocking_per_service`) as well as its own.
    pub fn gate_blocking(&self, core: &mut Core<T>, service: &str) {
        let permits = self.config.connection.blocking_per_service;
        core.blocking
            .under_service(self.blocking.of(service, permits));
    }

    /// The credits a framed connection of this node advertises to its peer.
    pub fn advert(&self) -> Advert {
        match &self.recv_groups {
            Some(g) => g.advert(),
            None => Advert::fixed(self.config.receives.depth.into()),
        }
    }

    /// Builds a connection on `id`: CQ capacity from a poller, the QP on the shared PD,
    /// receive buffers from the pool, all receives posted (before the QP reaches RTR).
    pub fn prepare(
        &self,
        id: &T::CmId,
        framing: Framing,
        peer: Option<Advert>,
    ) -> std::result::Result<Core<T>, String> {
        if !id.is_on(&self.pd) {
            return Err(format!(
                "the connection routes through {:?}, this node serves {}",
                id.device_name(),
                self.pd.device_name()
            ));
        }
        let cfg = &self.config;
        // Framed connections take their receives from a shared queue when configured,
        // and use its CQ.
        let shared = match (framing, &self.recv_groups) {
            (Framing::Framed, Some(groups)) => Some(groups.join(
                &self.pollers,
                cfg.connection.send_depth,
                id.peer_addr().map(|a| a.ip()),
            )?),
            _ => None,
        };
        let (depth, size) = match framing {
            Framing::Framed => (cfg.receives.depth as u32, cfg.receives.size as usize),
            Framing::Raw { recv_size } => (cfg.receives.raw_depth as u32, recv_size as usize),
        };
        let ours = match &shared {
            Some(_) => self.advert(),
            None => Advert::fixed(depth),
        };
        let (shared, cq) = match shared {
            Some((recv, member, cq)) => (Some((recv, member)), cq),
            // Completions a connection can have in the CQ at once: its send queue and
            // its receives.
            None => (
                None,
                self.pollers
                    .reserve(depth + cfg.connection.send_depth)
                    .map_err(|e| e.to_string())?,
            ),
        };
        let caps = QpCaps {
            max_send_wr: cfg.connection.send_depth,
            max_recv_wr: depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: super::connection::INLINE_MAX as u32,
        };
        let qp = id
            .create_qp(
                &self.pd,
                cq.cq(),
                cq.cq(),
                caps,
                shared.as_ref().map(|(recv, _)| recv.queue()),
            )
            .map_err(|e| e.to_string())?;
        // Before connect/accept: applied when rdma_cm moves the QP to RTS.
        id.set_ack_timeout(cfg.connection.ack_timeout)
            .map_err(|e| e.to_string())?;
        let recv = match &shared {
            Some(_) => Vec::new(),
            None => (0..depth)
                .map(|_| self.pool.lease(size))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?,
        };
        let credits = match framing {
            Framing::Raw { .. } => None,
            Framing::Framed => Some(match peer {
                Some(peer) => CreditWindow::new(ours, peer),
                None => CreditWindow::awaiting_peer(ours),
            }),
        };
        let (shared_recv, membership) = shared.unzip();
        let mut core = Core::new(CoreParts {
            qp,
            id: Some(id.clone()),
            shared_recv,
            membership,
            cq: Some(cq),
            framing,
            recv,
            recv_size: size,
            credits,
            pool: self.pool.clone(),
            pd: self.pd.clone(),
            config: cfg.connection.clone(),
        });
        core.queue_all_receives();
        super::connection::ring(&mut core).map_err(|e| e.to_string())?;
        Ok(core)
    }

    /// Claims CQ capacity for `entries` completions on a poller (out-of-band bring-up).
    pub fn reserve_cq(
        &self,
        entries: u32,
    ) -> std::result::Result<super::poller::CqReservation<T>, super::poller::ReserveError> {
        self.pollers.reserve(entries)
    }

    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
    }

    pub fn first_poller(&self) -> actix::dev::ArbiterHandle {
        self.pollers.first_arbiter()
    }

    pub fn shared_queues(&self) -> Vec<u32> {
        self.recv_groups
            .as_ref()
            .map_or_else(Vec::new, RecvGroups::occupancy)
    }

    pub fn shared_receives_posted(&self) -> Vec<usize> {
        self.recv_groups
            .as_ref()
            .map_or_else(Vec::new, RecvGroups::posted)
    }

    pub fn shared_reserves(&self) -> Vec<ReserveStats> {
        self.recv_groups
            .as_ref()
            .map_or_else(Vec::new, RecvGroups::reserves)
    }

    pub fn shared_recv_buffers(&self) -> usize {
        self.recv_groups.as_ref().map_or(0, RecvGroups::buffers)
    }

    pub fn cq_count(&self) -> usize {
        self.pollers.cq_count()
    }
}
