//! A connected client/server pair of blocking endpoints over rdma_cm, on one PD.

use rdmactor::blocking::{self, Endpoint, EndpointOptions, Listener};
use rdmactor::verbs::{ProtectionDomain, QueuePair, Result};

use crate::test_addr;

/// A connected client/server pair on one PD.
pub struct Pair {
    /// Active side.
    pub client: Endpoint,
    /// Passive side.
    pub server: Endpoint,
}

/// Connects a client to a fresh listener; `server_prepare` and `client_prepare` run on
/// each QP before it becomes ready (post receives there).
pub fn connect_pair(
    pd: &ProtectionDomain,
    server_prepare: impl FnOnce(&QueuePair) -> Result<()> + Send,
    client_prepare: impl FnOnce(&QueuePair) -> Result<()>,
) -> Pair {
    let opts = EndpointOptions::default();
    let listener = Listener::bind(test_addr()).expect("bind listener");
    let addr = listener.local_addr().expect("listener address");
    std::thread::scope(|s| {
        let server = s.spawn(|| listener.accept(pd, &opts, b"srv", server_prepare));
        let client = blocking::connect(pd, addr, &opts, b"cli", client_prepare).expect("connect");
        let server = server.join().expect("server thread").expect("accept");
        assert_eq!(server.peer_data.get(..3), Some(&b"cli"[..]));
        Pair { client, server }
    })
}
