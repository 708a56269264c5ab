//! `server --cluster` on real verbs (issue 33, items 1 and 2): the server binary
//! registers its services in a real etcd once it listens, a `ClusterClient` finds it
//! there and connects through rdma_cm, SIGTERM withdraws it (draining first, then gone)
//! before the server drains, and a SIGKILLed server disappears when its lease expires.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdmactor::runtime::{Client, NodeConfig};
use rdmactor_cluster::{ClusterClient, EtcdConfig, Membership, NodeInfo, Placement};
use rdmactor_testkit::etcd::Etcd;
use rdmactor_tests::{
    actix_run, assert_released, echo_ok, rdma_context, resource_counts, target_bin, test_addr,
};

/// Starts `server --cluster vm` with a 2 s lease; returns it and the address it listens on.
fn start_server(etcd: &Etcd, node: &str) -> (Child, SocketAddr) {
    let listen = format!("{}:0", test_addr().ip());
    let mut server = Command::new(target_bin("server"))
        .args([
            "--listen",
            &listen,
            "--cluster",
            "vm",
            "--etcd",
            &etcd.url(),
        ])
        .args(["--node-id", node, "--lease-ttl-secs", "2"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the server binary (scripts/test builds it)");
    let mut out = BufReader::new(server.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("the server's first line");
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("not an address line: {line}"))
        .parse()
        .expect("address");
    // The rest of its output is not needed; keep the pipe drained.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    (server, addr)
}

fn signal(server: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &server.id().to_string()])
        .status()
        .expect("kill");
    assert!(ok.success(), "kill {sig}");
}

fn names(nodes: &[NodeInfo]) -> Vec<(String, bool)> {
    nodes
        .iter()
        .map(|n| (n.node.clone(), n.record.draining))
        .collect()
}

#[test]
fn servers_register_serve_through_the_cluster_client_and_leave_the_registry() {
    let Some(_ctx) = rdma_context() else { return };
    let Some(etcd) = Etcd::start() else { return };
    let base = resource_counts();
    let (mut a, a_addr) = start_server(&etcd, "a");
    let (mut b, b_addr) = start_server(&etcd, "b");
    actix_run(async {
        let config = EtcdConfig::new([etcd.url()]);
        let echo = Membership::watch(config.clone(), "vm", "echo").expect("watch");
        let both = echo
            .wait_for(Duration::from_secs(10), |n| n.len() == 2)
            .await
            .unwrap_or_else(|| panic!("both servers listed: {:?}", names(&echo.nodes())));
        for (node, addr) in [("a", a_addr), ("b", b_addr)] {
            let info = both.iter().find(|n| n.node == node).expect("listed");
            assert_eq!(
                info.record.addr, addr,
                "node {node} advertises where it listens"
            );
            assert!(!info.record.draining);
        }

        // Connections through the registry, spread over both, each one served.
        let client = Client::start(NodeConfig::default()).expect("client");
        let cluster = ClusterClient::new(&client, config, "vm");
        let mut reached = Vec::new();
        for i in 0..6u8 {
            let conn = cluster
                .connect("echo", Placement::LeastLoaded)
                .await
                .expect("a connection through the cluster client");
            echo_ok(&conn.connection, vec![i; 64]).await;
            reached.push(conn.node.node.clone());
            conn.connection.close().await;
        }
        assert!(
            reached.contains(&"a".to_owned()) && reached.contains(&"b".to_owned()),
            "least loaded spreads over both: {reached:?}"
        );

        // SIGTERM: a is marked draining, then withdrawn, then it exits 0.
        signal(&a, "-TERM");
        let gone = echo
            .wait_for(Duration::from_secs(10), |n| n.len() == 1)
            .await
            .unwrap_or_else(|| panic!("a withdrawn: {:?}", names(&echo.nodes())));
        assert_eq!(gone[0].node, "b");
        let status = a.wait().expect("a exits");
        assert!(status.success(), "a exited with {status:?}");
        let conn = cluster
            .connect("echo", Placement::LeastLoaded)
            .await
            .expect("b still serves");
        assert_eq!(conn.node.node, "b");
        echo_ok(&conn.connection, b"after a left".to_vec()).await;
        conn.connection.close().await;

        // SIGKILL: nothing withdraws b; its lease (2 s) expires and it leaves the list.
        signal(&b, "-KILL");
        let killed = Instant::now();
        let _ = b.wait();
        echo.wait_for(Duration::from_secs(10), <[_]>::is_empty)
            .await
            .unwrap_or_else(|| panic!("b expired: {:?}", names(&echo.nodes())));
        let expired = killed.elapsed();
        println!("a SIGKILLed server left the registry {expired:?} after the kill (lease 2 s)");
        assert!(
            expired >= Duration::from_millis(500),
            "gone before its lease could lapse: {expired:?}"
        );
        match cluster.connect("echo", Placement::LeastLoaded).await {
            Err(e) => println!("with no server listed: {e}"),
            Ok(c) => panic!("connected to {} with no server listed", c.node.node),
        }
        client.shutdown().await;
    });
    assert_released(&base);
}
