//! Remote access violations complete with `RemoteAccessError` (no hang, no panic), put
//! the QP in the error state, and surface as the typed `VerbsError::Completion`.

use rdmactor::blocking::{close_both, Endpoint};
use rdmactor::verbs::{
    Access, MemoryRegion, ProtectionDomain, QpState, RemoteRegion, SendOp, SendWr, VerbsError,
    WcStatus,
};
use rdmactor_tests::{assert_released, connect_pair, rdma_context, resource_counts};

/// Connects a pair, posts one `op` from the client and checks it fails as a remote access
/// error, with the QP moved to the error state.
fn expect_remote_access_error(target_access: Access, op: impl Fn(&MemoryRegion) -> SendOp) {
    let Some(ctx) = rdma_context() else { return };
    let base = resource_counts();
    {
        let pd = ProtectionDomain::new(&ctx).unwrap();
        let target = MemoryRegion::register(&pd, 4096, target_access).unwrap();
        let pair = connect_pair(&pd, |_| Ok(()), |_| Ok(()));
        let local = MemoryRegion::register(&pd, 4096, Access::LOCAL_WRITE).unwrap();

        let wr = SendWr::new(42, op(&target), Some(local.sge(0..64).unwrap()));
        pair.client.qp.post_send(&wr).unwrap();
        let wc = pair
            .client
            .wait_any(1)
            .expect("the failure completes, it does not hang")[0];
        assert_eq!(wc.status, WcStatus::RemoteAccessError, "{wc:?}");
        assert_eq!(wc.wr_id, 42);
        let err = wc.ok().unwrap_err();
        assert!(
            matches!(
                err,
                VerbsError::Completion {
                    status: WcStatus::RemoteAccessError,
                    wr_id: 42,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("RemoteAccessError"), "{err}");
        assert_eq!(pair.client.qp.state().unwrap(), QpState::Error);
        assert!(
            target.as_slice().iter().all(|&b| b == 0),
            "nothing was written"
        );
        close_both(pair.client, pair.server).unwrap();
    }
    assert_released(&base);
}

#[test]
fn write_with_wrong_rkey_is_a_remote_access_error() {
    expect_remote_access_error(Access::REMOTE_WRITE, |t| {
        let r = t.remote();
        SendOp::Write(RemoteRegion {
            rkey: r.rkey ^ 0x5a5a_0000,
            ..r
        })
    });
}

#[test]
fn write_to_region_without_remote_write_is_a_remote_access_error() {
    expect_remote_access_error(Access::REMOTE_READ, |t| SendOp::Write(t.remote()));
}

#[test]
fn read_beyond_the_region_is_a_remote_access_error() {
    expect_remote_access_error(Access::REMOTE_READ, |t| {
        SendOp::Read(t.remote().at(4096 - 16))
    });
}

#[test]
fn a_window_bound_to_one_qp_refuses_every_other_qp_and_dies_with_its_window() {
    use rdmactor::verbs::MemoryWindow;
    let Some(ctx) = rdma_context() else { return };
    let base = resource_counts();
    {
        let pd = ProtectionDomain::new(&ctx).unwrap();
        // The region itself grants no remote access; only the window bound to A's QP does.
        let target =
            MemoryRegion::register(&pd, 4096, Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
        let a = connect_pair(&pd, |_| Ok(()), |_| Ok(()));
        let b = connect_pair(&pd, |_| Ok(()), |_| Ok(()));
        let window = MemoryWindow::alloc(&pd).expect("type 2 memory windows (rxe supports them)");
        let grant = a
            .server
            .qp
            .bind_window(7, &window, &target, Access::REMOTE_WRITE)
            .unwrap();
        assert_eq!(a.server.wait(1).unwrap()[0].wr_id, 7, "bind completed");

        let mut src = MemoryRegion::register(&pd, 64, Access::NONE).unwrap();
        src.as_mut_slice().fill(0xab);
        // WRITEs `src[..64]` through `grant` from `ep` and returns how it completed.
        let write = |ep: &Endpoint, wr_id: u64, src: &MemoryRegion| {
            let sge = Some(src.sge(0..64).unwrap());
            ep.qp
                .post_send(&SendWr::new(wr_id, SendOp::Write(grant), sge))
                .unwrap();
            ep.wait_any(1).unwrap()[0]
        };
        // A, through the QP the window is bound to: lands.
        let wc = write(&a.client, 1, &src);
        assert_eq!(
            wc.status,
            WcStatus::Success,
            "A may write through its window: {wc:?}"
        );
        assert!(target.as_slice()[..64].iter().all(|&b| b == 0xab));

        // B, same PD, same rkey and address, another QP: refused.
        src.as_mut_slice().fill(0xcd);
        let wc = write(&b.client, 2, &src);
        assert_eq!(wc.status, WcStatus::RemoteAccessError, "{wc:?}");
        assert!(
            target.as_slice()[..64].iter().all(|&b| b == 0xab),
            "B wrote nothing"
        );

        // Revoke: after the window is gone, A's rkey is dead too.
        drop(window);
        let wc = write(&a.client, 3, &src);
        assert_eq!(wc.status, WcStatus::RemoteAccessError, "{wc:?}");
        assert!(
            target.as_slice()[..64].iter().all(|&b| b == 0xab),
            "nothing after revoke"
        );
        close_both(a.client, a.server).unwrap();
        close_both(b.client, b.server).unwrap();
    }
    assert_released(&base);
}
