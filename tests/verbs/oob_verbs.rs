//! The verbs layer without rdma_cm, on a real device: two RC QPs of one process walked
//! RESET → INIT → RTR → RTS by the typed bring-up and exchanging verified bytes; UD
//! datagrams through an address handle, with the GRH naming the sender; an SRQ feeding
//! two QPs, its limit armed and fired; port and GID queries; typed errors; everything
//! released.

use std::time::Duration;

use rdmactor::verbs::{
    Access, AddressHandle, AddressVector, Bringup, CompletionQueue, ConnectedInit, Context, Gid,
    GlobalRoute, Grh, LinkLayer, MemoryRegion, Mtu, ProtectionDomain, Psn, QpCaps, QpState,
    QueuePair, Rc, RcRtr, RcRts, RecvWr, Reset, SendOp, SendWr, SharedReceiveQueue, Ud, UdInit,
    UdPeer, Verb, VerbsError, GRH_LEN,
};
use rdmactor_tests::{assert_released, pattern, rdma_context, resource_counts};

const PORT: u8 = 1;

/// The IPv4-mapped GID of port 1 (what `-g 1` names on rxe) and its index.
fn ipv4_gid(ctx: &Context) -> (u8, Gid) {
    ctx.gids(PORT)
        .expect("gids")
        .into_iter()
        .find(|(_, g)| g.is_ipv4_mapped())
        .expect("an IPv4-mapped GID")
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

fn path(gid: Gid, index: u8) -> AddressVector {
    AddressVector {
        dlid: 0,
        sl: 0,
        port_num: PORT,
        grh: Some(GlobalRoute::to(gid, index)),
    }
}

fn init() -> ConnectedInit {
    ConnectedInit {
        port_num: PORT,
        pkey_index: 0,
        access: Access::NONE,
    }
}

/// Two RC QPs of `pd` connected to each other (the second on `srq` when given).
fn rc_pair(
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
    srq: Option<&SharedReceiveQueue>,
    gid: (u8, Gid),
) -> (QueuePair, QueuePair) {
    let a = Bringup::<Rc, Reset>::create(pd, cq, cq, caps(), None).unwrap();
    let b = Bringup::<Rc, Reset>::create(pd, cq, cq, caps(), srq).unwrap();
    assert_eq!(a.qp().state().unwrap(), QpState::Reset);
    let (a, b) = (a.init(&init()).unwrap(), b.init(&init()).unwrap());
    assert_eq!(a.qp().state().unwrap(), QpState::Init);
    let (an, bn) = (a.qp().qp_num(), b.qp().qp_num());
    let rtr = |dest, psn| RcRtr {
        path: path(gid.1, gid.0),
        mtu: Mtu::M1024,
        dest_qp_num: dest,
        rq_psn: psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
    };
    let rts = |psn| RcRts {
        sq_psn: psn,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
    };
    let a = a.ready_to_receive(&rtr(bn, 200)).unwrap();
    assert_eq!(a.qp().state().unwrap(), QpState::ReadyToReceive);
    let a = a.ready_to_send(&rts(100)).unwrap();
    let b = b
        .ready_to_receive(&rtr(an, 100))
        .unwrap()
        .ready_to_send(&rts(200))
        .unwrap();
    assert_eq!(a.state().unwrap(), QpState::ReadyToSend);
    (a, b)
}

#[test]
fn ports_and_gids() {
    let Some(ctx) = rdma_context() else { return };
    let port = ctx.query_port(PORT).expect("query port");
    assert!(port.active, "{port:?}");
    assert_eq!(port.link_layer, LinkLayer::Ethernet, "rxe is RoCE");
    assert_eq!(port.lid, 0);
    let (index, gid) = ipv4_gid(&ctx);
    assert_eq!(ctx.query_gid(PORT, index).unwrap(), gid);
    assert!(gid.to_string().starts_with("::ffff:"), "{gid}");
    let err = ctx.query_port(9).unwrap_err();
    assert!(
        matches!(
            err,
            VerbsError::Call {
                verb: Verb::QueryPort,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn rc_qps_without_rdma_cm_exchange_bytes() {
    let Some(ctx) = rdma_context() else { return };
    let base = resource_counts();
    {
        let pd = ProtectionDomain::new(&ctx).unwrap();
        let cq = CompletionQueue::new(&ctx, 64, None).unwrap();
        let (a, b) = rc_pair(&pd, &cq, None, ipv4_gid(&ctx));
        let mut out = MemoryRegion::register(&pd, 4096, Access::NONE).unwrap();
        let back = MemoryRegion::register(&pd, 4096, Access::LOCAL_WRITE).unwrap();
        for (i, n) in [1usize, 100, 4096].into_iter().enumerate() {
            let data = pattern(n, i as u64);
            out.as_mut_slice()[..n].copy_from_slice(&data);
            b.post_recv(&[RecvWr {
                wr_id: 7,
                local: Some(back.sge_all()),
            }])
            .unwrap();
            a.post_send(&SendWr::new(8, SendOp::Send, Some(out.sge(0..n).unwrap())))
                .unwrap();
            let wcs = cq.poll_blocking(2, Duration::from_secs(5)).unwrap();
            let recv = wcs.iter().find(|w| w.wr_id == 7).expect("received");
            assert_eq!(recv.byte_len as usize, n);
            assert_eq!(&back.as_slice()[..n], &data[..]);
        }
        let c = Bringup::<Rc, Reset>::create(&pd, &cq, &cq, caps(), None)
            .unwrap()
            .init(&init())
            .unwrap();
        assert_eq!(c.qp().state().unwrap(), QpState::Init);
        // Sends before RTS are refused by the provider.
        assert!(c
            .qp()
            .post_send(&SendWr::new(1, SendOp::Send, Some(out.sge(0..1).unwrap())))
            .is_err());
    }
    assert_released(&base);
}

#[test]
fn ud_datagrams_carry_a_grh_naming_the_sender() {
    let Some(ctx) = rdma_context() else { return };
    let base = resource_counts();
    {
        let pd = ProtectionDomain::new(&ctx).unwrap();
        let cq = CompletionQueue::new(&ctx, 64, None).unwrap();
        let (index, gid) = ipv4_gid(&ctx);
        let qkey = 0x1111_1111;
        let rx = Bringup::<Ud, Reset>::create(&pd, &cq, &cq, caps(), None)
            .unwrap()
            .init(&UdInit {
                port_num: PORT,
                pkey_index: 0,
                qkey,
            })
            .unwrap();
        let back = MemoryRegion::register(&pd, GRH_LEN + 1024, Access::LOCAL_WRITE).unwrap();
        rx.qp()
            .post_recv(&[RecvWr {
                wr_id: 1,
                local: Some(back.sge_all()),
            }])
            .unwrap();
        let rx = rx
            .ready_to_receive(&())
            .unwrap()
            .ready_to_send(&Psn { sq_psn: 1 })
            .unwrap();
        let ah = AddressHandle::new(&pd, &path(gid, index)).expect("address handle");
        let tx = Bringup::<Ud, Reset>::create_bound(
            &pd,
            &cq,
            &cq,
            caps(),
            None,
            UdPeer {
                ah,
                qpn: rx.qp_num(),
                qkey,
            },
        )
        .unwrap()
        .init(&UdInit {
            port_num: PORT,
            pkey_index: 0,
            qkey,
        })
        .unwrap()
        .ready_to_receive(&())
        .unwrap()
        .ready_to_send(&Psn { sq_psn: 2 })
        .unwrap();
        let mut out = MemoryRegion::register(&pd, 1024, Access::NONE).unwrap();
        let data = pattern(1000, 9);
        out.as_mut_slice()[..1000].copy_from_slice(&data);
        tx.post_send(&SendWr::new(
            2,
            SendOp::Send,
            Some(out.sge(0..1000).unwrap()),
        ))
        .unwrap();
        let wcs = cq.poll_blocking(2, Duration::from_secs(5)).unwrap();
        let recv = wcs.iter().find(|w| w.wr_id == 1).expect("datagram");
        assert_eq!(recv.byte_len as usize, GRH_LEN + 1000, "GRH + payload");
        assert_eq!(&back.as_slice()[GRH_LEN..GRH_LEN + 1000], &data[..]);
        let grh = Grh::parse(back.as_slice()).expect("a GRH");
        assert_eq!(grh.source, gid, "the sender's GID");
        assert_eq!(grh.destination, gid);
    }
    assert_released(&base);
}

#[test]
fn an_srq_feeds_several_qps_and_its_limit_fires() {
    let Some(ctx) = rdma_context() else { return };
    let base = resource_counts();
    {
        let pd = ProtectionDomain::new(&ctx).unwrap();
        let cq = CompletionQueue::new(&ctx, 64, None).unwrap();
        let srq = SharedReceiveQueue::new(&pd, 8, 1).expect("create srq");
        assert!(
            SharedReceiveQueue::new(&pd, 0, 1).is_err(),
            "an empty SRQ is refused"
        );
        let gid = ipv4_gid(&ctx);
        let (a1, b1) = rc_pair(&pd, &cq, Some(&srq), gid);
        let (a2, b2) = rc_pair(&pd, &cq, Some(&srq), gid);
        assert!(b1.srq().is_some());
        let refused = b1.post_recv(&[RecvWr {
            wr_id: 0,
            local: None,
        }]);
        assert!(
            refused.is_err(),
            "a QP on an SRQ has no receive queue of its own"
        );
        let bufs: Vec<MemoryRegion> = (0..4)
            .map(|_| MemoryRegion::register(&pd, 256, Access::LOCAL_WRITE).unwrap())
            .collect();
        let wrs: Vec<RecvWr> = bufs
            .iter()
            .enumerate()
            .map(|(i, b)| RecvWr {
                wr_id: 100 + i as u64,
                local: Some(b.sge_all()),
            })
            .collect();
        srq.post_recv(&wrs).unwrap();
        srq.arm_limit(2).unwrap();
        assert_eq!(srq.query().unwrap().limit, 2);
        assert!(srq.query().unwrap().max_wr >= 8);
        let mut out = MemoryRegion::register(&pd, 16, Access::NONE).unwrap();
        // Three messages, over both QPs, consume three of the four shared receives.
        for (i, qp) in [&a1, &a2, &a1].into_iter().enumerate() {
            out.as_mut_slice().fill(i as u8 + 1);
            qp.post_send(&SendWr::new(i as u64, SendOp::Send, Some(out.sge_all())))
                .unwrap();
            cq.poll_blocking(2, Duration::from_secs(5)).unwrap();
        }
        let mut seen: Vec<u8> = bufs
            .iter()
            .filter(|b| b.as_slice()[0] != 0)
            .map(|b| b.as_slice()[0])
            .collect();
        seen.sort_unstable();
        assert_eq!(
            seen,
            vec![1, 2, 3],
            "each message landed in one shared buffer"
        );
        // One receive left, below the limit of 2: the limit fired and disarmed.
        assert_eq!(
            srq.query().unwrap().limit,
            0,
            "the limit disarms when it fires"
        );
        drop((a1, a2, b1, b2));
    }
    assert_released(&base);
    assert_eq!(resource_counts().get("srq"), base.get("srq"));
}
