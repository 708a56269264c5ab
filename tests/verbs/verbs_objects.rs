//! Verbs objects on a real device: context, PD, MRs, CQs, completion channel, QP; and all
//! of them released when dropped.

use std::time::Duration;

use rdmactor::verbs::{
    Access, CmId, CompletionChannel, CompletionQueue, EventChannel, MemoryRegion, ProtectionDomain,
    QpCaps, QpState, VerbsError,
};
use rdmactor_tests::{assert_released, rdma_context, resource_counts, test_addr};

#[test]
fn objects_are_created_and_released() {
    let Some(ctx) = rdma_context() else { return };
    let base = resource_counts();
    {
        let attr = ctx.query().expect("query device");
        assert!(
            attr.max_qp > 0 && attr.max_cqe > 0 && attr.max_qp_wr > 0,
            "{attr:?}"
        );

        let pd = ProtectionDomain::new(&ctx).expect("alloc pd");
        let small = MemoryRegion::register(&pd, 4096, Access::LOCAL_WRITE).expect("reg 4 KiB");
        let big = MemoryRegion::register(&pd, 1 << 20, Access::REMOTE_WRITE | Access::REMOTE_READ)
            .expect("reg 1 MiB");
        assert_eq!(small.len(), 4096);
        assert_eq!(big.addr() % 4096, 0, "registrations are page aligned");
        assert!(
            big.access().contains(Access::LOCAL_WRITE),
            "remote write implies local write"
        );
        assert_eq!(big.remote().len, 1 << 20);
        assert_eq!(big.remote().rkey, big.rkey());

        // Splitting shares one registration: same keys, disjoint consecutive ranges.
        let (rkey, addr) = (big.rkey(), big.addr());
        let pieces = big.split(256 * 1024);
        assert_eq!(pieces.len(), 4);
        for (i, p) in pieces.iter().enumerate() {
            assert_eq!(p.rkey(), rkey);
            assert_eq!(p.addr(), addr + (i * 256 * 1024) as u64);
        }

        let cq = CompletionQueue::new(&ctx, 256, None).expect("create cq");
        assert!(cq.capacity() >= 256);
        let chan = CompletionChannel::new(&ctx).expect("comp channel");
        let evcq = CompletionQueue::new(&ctx, 64, Some(&chan)).expect("cq with channel");
        evcq.req_notify(false).expect("arm cq");
        assert_eq!(
            chan.wait(Some(Duration::from_millis(10))).expect("wait"),
            None
        );

        let events = EventChannel::new().expect("event channel");
        let id = CmId::new(&events).expect("create id");
        id.bind(test_addr()).expect("bind to the rdma address");
        assert!(id.is_on(&ctx), "bound id uses the device context");
        let qp = id
            .create_qp(&pd, &cq, &evcq, QpCaps::default(), None)
            .expect("create rc qp");
        assert!(qp.qp_num() > 0);
        let state = qp.state().expect("query qp");
        assert!(matches!(state, QpState::Reset | QpState::Init), "{state:?}");

        let during = resource_counts();
        assert_eq!(during.get("pd"), base.get("pd") + 1);
        assert_eq!(during.get("mr"), base.get("mr") + 2);
        assert_eq!(during.get("cq"), base.get("cq") + 2);
        assert_eq!(during.get("qp"), base.get("qp") + 1);
        assert_eq!(during.get("cm_id"), base.get("cm_id") + 1);
        // Dropping the id handle first must not destroy it under the QP.
        drop(id);
        assert!(qp.state().is_ok());
        drop((small, pieces));
    }
    assert_released(&base);
}

#[test]
fn bad_arguments_are_typed_errors() {
    let Some(ctx) = rdma_context() else { return };
    let base = resource_counts();
    {
        let pd = ProtectionDomain::new(&ctx).expect("alloc pd");
        let err = MemoryRegion::register(&pd, 0, Access::LOCAL_WRITE).unwrap_err();
        assert!(matches!(err, VerbsError::InvalidArgument(_)), "{err}");
        let mr = MemoryRegion::register(&pd, 4096, Access::LOCAL_WRITE).expect("reg");
        let err = mr.sge(0..4097).unwrap_err();
        assert!(matches!(err, VerbsError::InvalidArgument(_)), "{err}");
        let err = mr.remote().slice(4000, 200).unwrap_err();
        assert!(matches!(err, VerbsError::InvalidArgument(_)), "{err}");

        // An unbound id has no device, so a QP on it is refused with a clear error.
        let events = EventChannel::new().expect("event channel");
        let id = CmId::new(&events).expect("create id");
        let cq = CompletionQueue::new(&ctx, 16, None).expect("cq");
        let err = id
            .create_qp(&pd, &cq, &cq, QpCaps::default(), None)
            .unwrap_err();
        assert!(matches!(err, VerbsError::InvalidArgument(_)), "{err}");
    }
    assert_released(&base);
}
