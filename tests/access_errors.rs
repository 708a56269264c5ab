//! Remote access violations complete with `RemoteAccessError` (no hang, no panic), put
//! the QP in the error state, and surface as the typed `VerbsError::Completion`.

use rdmactor::blocking::close_both;
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
