//! Admission: unknown services and connections beyond the limit are rejected with a
//! reason the client sees, while admitted clients keep being served.

use rdmactor::proto::hello::RejectCode;
use rdmactor::runtime::{Client, ConnectError, NodeConfig, Server};
use rdmactor_services::echo::Echo;
use rdmactor_tests::{
    actix_run, assert_released, echo_ok, rdma_context, resource_counts, test_addr,
};

fn rejected_with(err: ConnectError, code: RejectCode) -> String {
    match err {
        ConnectError::Rejected(r) if r.code == code => r.message,
        other => panic!("expected a {code:?} reject, got {other}"),
    }
}

#[test]
fn unknown_service_and_full_server_are_rejected_with_reasons() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let server = Server::builder()
            .listen(test_addr(), None)
            .service("echo", Echo)
            .max_connections(2)
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");

        let first = client.connect(addr, "echo").await.expect("first");
        let msg = rejected_with(
            client.connect(addr, "no-such").await.unwrap_err(),
            RejectCode::UnknownService,
        );
        assert!(msg.contains("no-such"), "{msg}");
        echo_ok(&first, b"still served".to_vec()).await;

        let second = client.connect(addr, "echo").await.expect("second");
        let msg = rejected_with(
            client.connect(addr, "echo").await.unwrap_err(),
            RejectCode::ServerFull,
        );
        assert!(msg.contains("limit of 2"), "{msg}");
        echo_ok(&first, b"still served".to_vec()).await;
        echo_ok(&second, b"still served".to_vec()).await;

        // A freed slot admits the next client.
        second.close().await;
        rdmactor_tests::eventually(
            "the slot to free",
            std::time::Duration::from_secs(10),
            || async { server.stats().await.connections == 1 },
        )
        .await;
        let third = client
            .connect(addr, "echo")
            .await
            .expect("third after a close");
        echo_ok(&third, b"still served".to_vec()).await;

        let stats = server.stats().await;
        assert_eq!((stats.accepted, stats.rejected), (3, 2));
        client.shutdown().await;
        server.shutdown().await;
    });
    assert_released(&base);
}
