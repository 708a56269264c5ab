//! ClusterClient against a real etcd, with a connector that stands in for the RDMA
//! connect (refusing some addresses): picks skip draining nodes, spread by load, move
//! on from a refused node, place by key, and name every node in their errors.

mod util;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use rdmactor_cluster::{pick, ClusterClient, ClusterError, Connector, Load, NodeRecord, Placement};
use util::{addr, register, Etcd, EtcdExt};

/// Connects to any address but those refused; remembers where it connected.
#[derive(Default)]
struct Fake {
    refused: RefCell<HashSet<SocketAddr>>,
    tried: RefCell<Vec<SocketAddr>>,
}

impl Connector for Fake {
    type Connection = SocketAddr;
    type Error = String;
    async fn connect(&self, addr: SocketAddr, service: &str) -> Result<SocketAddr, String> {
        self.tried.borrow_mut().push(addr);
        if self.refused.borrow().contains(&addr) {
            Err(format!("rejected by the server: {service} is full"))
        } else {
            Ok(addr)
        }
    }
}

/// A draining record of `node`, put directly (what a server shows between marking
/// itself draining and revoking its lease).
async fn put_draining(etcd: &Etcd, node: &str, at: SocketAddr) {
    let record = NodeRecord {
        node: node.into(),
        service: "echo".into(),
        addr: at,
        version: "0".into(),
        draining: true,
        load: Load::default(),
    };
    let mut raw = etcd.client().await;
    let lease = raw.lease_grant(30, None).await.unwrap().id();
    raw.put(
        rdmactor_cluster::record::node_key("test", "echo", node),
        record.to_json(),
        Some(etcd_client::PutOptions::new().with_lease(lease)),
    )
    .await
    .unwrap();
}

fn client(etcd: &Etcd) -> ClusterClient<Fake> {
    ClusterClient::new(Fake::default(), etcd.config(), "test")
        .with_discovery_wait(Duration::from_secs(5))
}

#[tokio::test]
async fn picks_skip_draining_nodes_and_spread_by_load() {
    let Some(etcd) = Etcd::start() else { return };
    let _a = register(&etcd, "a", addr(1), "echo").await;
    let _b = register(&etcd, "b", addr(2), "echo").await;
    let _c = register(&etcd, "c", addr(3), "echo").await;
    put_draining(&etcd, "d", addr(4)).await;
    let cluster = client(&etcd);
    cluster
        .membership("echo")
        .unwrap()
        .wait_for(Duration::from_secs(5), |n| n.len() == 4)
        .await
        .expect("four listed");
    let mut per_node: HashMap<String, u32> = HashMap::new();
    for _ in 0..300 {
        let c = cluster
            .connect("echo", Placement::LeastLoaded)
            .await
            .unwrap();
        assert_eq!(c.connection, c.node.record.addr);
        *per_node.entry(c.node.node).or_default() += 1;
    }
    assert!(
        !per_node.contains_key("d"),
        "a draining node was picked: {per_node:?}"
    );
    assert!(!cluster.connector().tried.borrow().contains(&addr(4)));
    // One process's burst, between load reports: an even spread.
    assert_eq!(per_node.len(), 3, "{per_node:?}");
    assert!(per_node.values().all(|&n| n == 100), "{per_node:?}");
}

#[tokio::test]
async fn a_refused_connect_goes_to_the_next_node_and_errors_name_every_node() {
    let Some(etcd) = Etcd::start() else { return };
    let _a = register(&etcd, "a", addr(1), "echo").await;
    let _b = register(&etcd, "b", addr(2), "echo").await;
    let cluster = client(&etcd);
    cluster
        .membership("echo")
        .unwrap()
        .wait_for(Duration::from_secs(5), |n| n.len() == 2)
        .await
        .unwrap();
    cluster.connector().refused.borrow_mut().insert(addr(1));
    for _ in 0..20 {
        let c = cluster
            .connect("echo", Placement::LeastLoaded)
            .await
            .unwrap();
        assert_eq!(c.node.node, "b");
        if let Some(failed) = c.failed.first() {
            assert_eq!(failed.node, "a");
            assert!(failed.reason.contains("is full"), "{failed}");
        }
    }
    cluster.connector().refused.borrow_mut().insert(addr(2));
    let err = cluster
        .connect("echo", Placement::LeastLoaded)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ClusterError::AllFailed { ref attempts, .. } if attempts.len() == 2));
    for needle in [
        "node a (192.0.2.1:7471)",
        "node b (192.0.2.2:7471)",
        "is full",
        "\"echo\"",
    ] {
        assert!(text.contains(needle), "{needle:?} not in: {text}");
    }
}

#[tokio::test]
async fn key_placement_is_rendezvous_and_moves_when_its_node_drains() {
    let Some(etcd) = Etcd::start() else { return };
    let _a = register(&etcd, "a", addr(1), "echo").await;
    let _b = register(&etcd, "b", addr(2), "echo").await;
    let c = register(&etcd, "c", addr(3), "echo").await;
    let cluster = client(&etcd);
    let members = cluster.membership("echo").unwrap();
    let listed = members
        .wait_for(Duration::from_secs(5), |n| n.len() == 3)
        .await
        .unwrap();
    // Find a key that lives on c.
    let key = (0u32..)
        .map(|i| format!("file-{i}"))
        .find(|k| pick::by_rendezvous(k.as_bytes(), &listed)[0].node == "c")
        .unwrap();
    let second = pick::by_rendezvous(key.as_bytes(), &listed)[1].node.clone();
    for _ in 0..5 {
        let got = cluster
            .connect("echo", Placement::Key(key.as_bytes()))
            .await
            .unwrap();
        assert_eq!(got.node.node, "c");
    }
    // c shuts down: marked draining, then gone. The key goes to its second choice.
    c.withdraw().await.unwrap();
    members
        .wait_for(Duration::from_secs(5), |n| n.len() == 2)
        .await
        .unwrap();
    let got = cluster
        .connect("echo", Placement::Key(key.as_bytes()))
        .await
        .unwrap();
    assert_eq!(got.node.node, second);
}

#[tokio::test]
async fn no_node_and_all_draining_are_errors_that_say_so() {
    let Some(etcd) = Etcd::start() else { return };
    let cluster = client(&etcd).with_discovery_wait(Duration::from_millis(500));
    let err = cluster
        .connect("echo", Placement::LeastLoaded)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("no live node serves \"echo\""),
        "{err}"
    );
    put_draining(&etcd, "d", addr(4)).await;
    cluster
        .membership("echo")
        .unwrap()
        .wait_for(Duration::from_secs(5), |n| n.len() == 1)
        .await
        .unwrap();
    let err = cluster
        .connect("echo", Placement::LeastLoaded)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("draining: d"), "{err}");
    assert!(cluster.connector().tried.borrow().is_empty());
}
