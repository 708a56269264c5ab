//! Where the real-verbs tests find their RDMA device and addresses.
//!
//! The tests need an RDMA device (run them through `scripts/test`, which boots the
//! Soft-RoCE VM). Outside the VM they print that they skip, unless
//! `RDMACTOR_REQUIRE_RDMA=1` is set (the VM run sets it), in which case a missing device
//! fails the test. `RDMACTOR_DEVICE` names the device, `RDMACTOR_TEST_IP` the address of
//! its interface.

use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;

use rdmactor::verbs::{CmId, Context, EventChannel};

/// Opens the test device, or returns `None` (test skipped) when there is none and the run
/// does not require one.
///
/// The context is opened once per process and a cm_id is bound once: librdmacm allocates
/// a PD of its own per device the first time an id binds to it and keeps it while the
/// device list is referenced, so doing that before any baseline is taken makes
/// `rdma resource` counts comparable across tests.
pub fn rdma_context() -> Option<Context> {
    static CONTEXT: OnceLock<Result<Context, String>> = OnceLock::new();
    let ctx = CONTEXT.get_or_init(|| {
        let name = std::env::var("RDMACTOR_DEVICE").ok();
        let ctx = Context::open(name.as_deref()).map_err(|e| e.to_string())?;
        let channel = EventChannel::new().map_err(|e| e.to_string())?;
        let id = CmId::new(&channel).map_err(|e| e.to_string())?;
        id.bind(test_addr())
            .map_err(|e| format!("bind {}: {e}", test_addr()))?;
        Ok(ctx)
    });
    match ctx {
        Ok(ctx) => Some(ctx.clone()),
        Err(e) if std::env::var("RDMACTOR_REQUIRE_RDMA").as_deref() == Ok("1") => {
            panic!("RDMACTOR_REQUIRE_RDMA=1 but no usable RDMA device: {e}")
        }
        Err(e) => {
            eprintln!("skipping: no RDMA device ({e}); run scripts/test to use the Soft-RoCE VM");
            None
        }
    }
}

/// The address of the RDMA interface (192.0.2.1 in the Soft-RoCE VM), port 0.
pub fn test_addr() -> SocketAddr {
    let ip: IpAddr = std::env::var("RDMACTOR_TEST_IP")
        .unwrap_or_else(|_| "192.0.2.1".into())
        .parse()
        .expect("RDMACTOR_TEST_IP is an IP address");
    SocketAddr::new(ip, 0)
}

/// A second address of this host on the RDMA interface (the VM gives it the test
/// address + 100, 192.0.2.101): connecting from it makes a second peer to a server that
/// counts connections per peer address.
pub fn second_peer_ip() -> IpAddr {
    match test_addr().ip() {
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            IpAddr::V4(std::net::Ipv4Addr::new(a, b, c, d.wrapping_add(100)))
        }
        other => panic!("no second peer address for {other}"),
    }
}
