//! One client's QPs, from its records to RTS: the verbs side of an out-of-band exchange.
//! Everything here runs on the listener's actor; the connections it builds are started
//! by the listener on their pollers afterwards.

use crate::proto::oob::Dest;
use crate::runtime::connection::{Core, CoreParts, INLINE_MAX};
use crate::runtime::node::Node;
use crate::runtime::poller::CqReservation;
use crate::runtime::service::Framing;
use crate::runtime::srq::SharedRecv;
use crate::runtime::ConnectionConfig;
use crate::verbs::{
    Access, AddressHandle, AddressVector, Bringup, ConnectedInit, Context, Gid, GlobalRoute, Init,
    Mtu, PortAttr, Psn, QpCaps, QpKind, QueuePair, Rc, RcRtr, RcRts, Reset, SharedReceiveQueue, Uc,
    UcRtr, Ud, UdInit, UdPeer, GRH_LEN,
};

use super::{OobOptions, OobTransport};

/// The Q_Key `ibv_ud_pingpong` gives its QP and expects on ours.
pub(super) const PINGPONG_QKEY: u32 = 0x1111_1111;

/// A client's connections, ready to start, and the records to answer with.
pub(super) struct Prepared {
    pub cores: Vec<Core>,
    pub answer: Vec<Dest>,
}

/// The local GID to use towards `peer`: the configured index, or one of the same kind.
fn local_gid(ctx: &Context, opts: &OobOptions, peer: Gid) -> Result<(u8, Gid), String> {
    let port = opts.ib_port;
    if let Some(index) = opts.gid_index {
        let gid = ctx
            .query_gid(port, index)
            .map_err(|e| format!("local GID {index}: {e}"))?;
        return Ok((index, gid));
    }
    let gids = ctx.gids(port).map_err(|e| e.to_string())?;
    gids.iter()
        .find(|(_, g)| g.is_ipv4_mapped() == peer.is_ipv4_mapped())
        .or(gids.first())
        .copied()
        .ok_or_else(|| format!("port {port} has no GID"))
}

/// Whether the kernel has a route to the IP address a RoCE GID stands for (a UDP
/// socket's `connect` looks it up without sending anything). Link-local and zero GIDs
/// are left to the provider.
fn routable(gid: Gid) -> Result<(), String> {
    let ip = gid.to_ipv6();
    let target: std::net::IpAddr = match ip.to_ipv4_mapped() {
        Some(v4) => v4.into(),
        None if gid.is_zero() || ip.segments()[0] & 0xffc0 == 0xfe80 => return Ok(()),
        None => ip.into(),
    };
    let local: std::net::SocketAddr = if target.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    std::net::UdpSocket::bind(local)
        .and_then(|s| s.connect((target, 4791)))
        .map_err(|e| format!("GID {gid} unreachable: no route to {target} ({e})"))
}

/// A 24-bit PSN nobody can predict from the last one (std's hasher keys are random).
fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    (h.finish() & 0xff_ffff) as u32
}

struct Plan<'a> {
    node: &'a Node,
    opts: &'a OobOptions,
    port: PortAttr,
    sgid_index: u8,
    local: Gid,
    mtu: Mtu,
    recv_size: usize,
    recv_depth: u32,
}

impl Plan<'_> {
    fn path(&self, peer: &Dest) -> AddressVector {
        AddressVector {
            dlid: peer.lid,
            sl: self.opts.sl,
            port_num: self.opts.ib_port,
            // As the tools decide: a GRH whenever the peer sent a GID.
            grh: (peer.gid.interface_id() != 0).then(|| GlobalRoute::to(peer.gid, self.sgid_index)),
        }
    }

    fn caps(&self) -> QpCaps {
        let cfg = &self.node.config;
        QpCaps {
            max_send_wr: cfg.connection.send_depth,
            max_recv_wr: self.recv_depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: INLINE_MAX as u32,
        }
    }

    fn reserve(&self, srq_depth: u32) -> Result<CqReservation, String> {
        let depth = self.recv_depth.max(srq_depth);
        self.node
            .reserve_cq(depth + self.node.config.connection.send_depth)
            .map_err(|e| e.to_string())
    }

    /// The connection around a QP in INIT, its own receives (if any) posted.
    fn core(
        &self,
        qp: QueuePair,
        cq: CqReservation,
        shared: Option<&SharedRecv>,
    ) -> Result<Core, String> {
        let cfg = &self.node.config;
        let recv = if shared.is_some() {
            Vec::new()
        } else {
            (0..self.recv_depth)
                .map(|_| self.node.pool.lease(self.recv_size))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?
        };
        let mut core = Core::new(CoreParts {
            qp,
            id: None,
            shared_recv: shared.cloned(),
            membership: None,
            cq: Some(cq),
            framing: Framing::Raw {
                recv_size: self.recv_size as u32,
            },
            recv,
            recv_size: self.recv_size,
            credits: None,
            pool: self.node.pool.clone(),
            pd: self.node.pd.clone(),
            config: ConnectionConfig {
                // No zero-length WRITE probes: UD and UC have no ACKs to learn from, and
                // the stock tools' QPs are brought up by them, with their own timeouts; a
                // silent out-of-band client is closed by its service's idle limit
                // instead.
                keepalive: None,
                // Out of band: the service's idle limit applies.
                idle_timeout: None,
                ..cfg.connection.clone()
            },
        });
        core.queue_all_receives();
        crate::runtime::connection::ring(&mut core).map_err(|e| e.to_string())?;
        Ok(core)
    }

    /// Receives posted in INIT, then RTR and RTS: the order the peer's first SEND needs.
    fn finish<T: QpKind>(
        &self,
        qp: Bringup<T, Init>,
        cq: CqReservation,
        shared: Option<&SharedRecv>,
        rtr: &T::RtrAttr,
        rts: &T::RtsAttr,
    ) -> Result<Core, String> {
        let core = self.core(qp.qp().clone(), cq, shared)?;
        qp.ready_to_receive(rtr)
            .and_then(|qp| qp.ready_to_send(rts))
            .map_err(|e| e.to_string())?;
        Ok(core)
    }

    fn connected_init(&self) -> ConnectedInit {
        ConnectedInit {
            port_num: self.opts.ib_port,
            pkey_index: 0,
            access: Access::NONE,
        }
    }

    fn rc(&self, peer: &Dest, psn: u32, shared: Option<&SharedRecv>) -> Result<Core, String> {
        let cq = self.reserve(self.opts.srq_depth * shared.is_some() as u32)?;
        let qp = Bringup::<Rc, Reset>::create(
            &self.node.pd,
            cq.cq(),
            cq.cq(),
            self.caps(),
            shared.map(SharedRecv::queue),
        )
        .and_then(|qp| qp.init(&self.connected_init()))
        .map_err(|e| e.to_string())?;
        let rtr = RcRtr {
            path: self.path(peer),
            mtu: self.mtu,
            dest_qp_num: peer.qpn,
            rq_psn: peer.psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
        };
        let rts = RcRts {
            sq_psn: psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: self.node.config.connection.rnr_retry_count,
            max_rd_atomic: 1,
        };
        self.finish(qp, cq, shared, &rtr, &rts)
    }

    fn uc(&self, peer: &Dest, psn: u32) -> Result<Core, String> {
        let cq = self.reserve(0)?;
        let qp = Bringup::<Uc, Reset>::create(&self.node.pd, cq.cq(), cq.cq(), self.caps(), None)
            .and_then(|qp| qp.init(&self.connected_init()))
            .map_err(|e| e.to_string())?;
        let rtr = UcRtr {
            path: self.path(peer),
            mtu: self.mtu,
            dest_qp_num: peer.qpn,
            rq_psn: peer.psn,
        };
        self.finish(qp, cq, None, &rtr, &Psn { sq_psn: psn })
    }

    fn ud(&self, peer: &Dest, psn: u32) -> Result<Core, String> {
        // The handle first: on RoCE it resolves the peer's GID, the likeliest failure.
        let ah = AddressHandle::new(&self.node.pd, &self.path(peer))
            .map_err(|e| format!("GID {} unreachable: {e}", peer.gid))?;
        let cq = self.reserve(0)?;
        let peer = UdPeer {
            ah,
            qpn: peer.qpn,
            qkey: PINGPONG_QKEY,
        };
        let qp = Bringup::<Ud, Reset>::create_bound(
            &self.node.pd,
            cq.cq(),
            cq.cq(),
            self.caps(),
            None,
            peer,
        )
        .and_then(|qp| {
            qp.init(&UdInit {
                port_num: self.opts.ib_port,
                pkey_index: 0,
                qkey: PINGPONG_QKEY,
            })
        })
        .map_err(|e| e.to_string())?;
        self.finish(qp, cq, None, &(), &Psn { sq_psn: psn })
    }
}

/// Brings up the QPs `peers` describe (one, or an SRQ client's several) for a raw
/// service whose receive buffers are `framing`'s size, and the records to answer with.
/// On any failure everything built so far is released and the reason returned.
pub(super) fn prepare(
    node: &Node,
    transport: OobTransport,
    opts: &OobOptions,
    framing: Framing,
    peers: &[Dest],
) -> Result<Prepared, String> {
    let Framing::Raw { recv_size } = framing else {
        return Err("an out-of-band port needs a raw service".into());
    };
    let first = peers.first().ok_or("no QP described")?;
    let port = node
        .pd
        .context()
        .query_port(opts.ib_port)
        .map_err(|e| e.to_string())?;
    let (sgid_index, local) = local_gid(node.pd.context(), opts, first.gid)?;
    let mut recv_size = recv_size as usize;
    if transport == OobTransport::Ud {
        recv_size += GRH_LEN;
    }
    let plan = Plan {
        node,
        opts,
        port,
        sgid_index,
        local,
        mtu: opts.mtu.min(port.active_mtu),
        recv_size,
        recv_depth: node.config.receives.raw_depth as u32,
    };
    // rxe moves a QP to RTR, and creates an address handle, towards any GID and only
    // fails to route the packets later (an RC server that only answers would never
    // notice). So the GID's route is looked up first, and an address handle created,
    // which refuses what the provider can tell is wrong (no GID at all on RoCE).
    let gids: std::collections::HashSet<Gid> = peers.iter().map(|p| p.gid).collect();
    for gid in gids {
        routable(gid)?;
        if transport != OobTransport::Ud {
            let peer = peers.iter().find(|p| p.gid == gid).expect("a peer");
            AddressHandle::new(&node.pd, &plan.path(peer))
                .map_err(|e| format!("GID {gid} unreachable: {e}"))?;
        }
    }
    let shared = match transport {
        OobTransport::Srq => {
            let srq =
                SharedReceiveQueue::new(&node.pd, opts.srq_depth, 1).map_err(|e| e.to_string())?;
            Some(SharedRecv::new(&node.pool, srq, opts.srq_depth, recv_size)?)
        }
        _ => None,
    };
    let mut cores = Vec::with_capacity(peers.len());
    let mut answer = Vec::with_capacity(peers.len());
    for peer in peers {
        let psn = random_psn();
        let core = match transport {
            OobTransport::Rc => plan.rc(peer, psn, None),
            OobTransport::Srq => plan.rc(peer, psn, shared.as_ref()),
            OobTransport::Uc => plan.uc(peer, psn),
            OobTransport::Ud => plan.ud(peer, psn),
        }
        .map_err(|e| format!("QP for peer QPN {:#x} (GID {}): {e}", peer.qpn, peer.gid))?;
        answer.push(Dest {
            lid: plan.port.lid,
            qpn: core.qp_num(),
            psn,
            gid: plan.local,
        });
        cores.push(core);
    }
    Ok(Prepared { cores, answer })
}
