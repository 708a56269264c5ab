//! ClusterClient against a real etcd, with a connector that stands in for the RDMA
//! connect (refusing some addresses, never answering others): picks skip draining
//! nodes, spread by load, move on from a refused node and, at the dial bound, from one
//! that does not answer (tried last from then on), place by key, and name every node in
//! their errors.

mod util;

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use rdmactor_cluster::{
    pick, ClusterClient, ClusterError, Connected, Connector, Load, NodeInfo, NodeRecord, Placement,
};
use util::{addr, register, Etcd, EtcdExt};

/// Connects to any address but those refused (an answer: no) and those hung (no answer
/// ever, as a dead host's); remembers where it tried.
#[derive(Default)]
struct Fake {
    refused: RefCell<HashSet<SocketAddr>>,
    hung: RefCell<HashSet<SocketAddr>>,
    tried: RefCell<Vec<SocketAddr>>,
    /// Hung connects not yet dropped.
    hanging: Cell<usize>,
}

/// Counts a hung connect until its future is dropped.
struct Hanging<'a>(&'a Cell<usize>);

impl Drop for Hanging<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

impl Connector for Fake {
    type Connection = SocketAddr;
    type Error = String;
    async fn connect(&self, addr: SocketAddr, service: &str) -> Result<SocketAddr, String> {
        self.tried.borrow_mut().push(addr);
        if self.hung.borrow().contains(&addr) {
            self.hanging.set(self.hanging.get() + 1);
            let _held = Hanging(&self.hanging);
            std::future::pending::<()>().await;
        }
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

/// The bound the hung-node tests dial with: short, as the fake answers at once or never.
const BOUND: Duration = Duration::from_millis(300);

/// A connect that must end: a hang past any bound fails the test instead of stalling it.
async fn connect_key(
    cluster: &ClusterClient<Fake>,
    key: &str,
) -> Result<Connected<SocketAddr>, ClusterError> {
    tokio::time::timeout(
        Duration::from_secs(60),
        cluster.connect("echo", Placement::Key(key.as_bytes())),
    )
    .await
    .expect("the connect ended")
}

/// Three nodes a, b, c listed; a client with `BOUND` and `hold`; a key whose rendezvous
/// order puts b first, and that order.
async fn hung_b(
    etcd: &Etcd,
    hold: Duration,
) -> (
    Vec<rdmactor_cluster::Registrar>,
    ClusterClient<Fake>,
    String,
    Vec<NodeInfo>,
) {
    let mut nodes = Vec::new();
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        nodes.push(register(etcd, name, addr(i as u8 + 1), "echo").await);
    }
    let cluster = client(etcd).with_dial_timeout(BOUND).with_suspicion(hold);
    let listed = cluster
        .membership("echo")
        .unwrap()
        .wait_for(Duration::from_secs(5), |n| n.len() == 3)
        .await
        .expect("three listed");
    let key = (0u32..)
        .map(|i| format!("file-{i}"))
        .find(|k| pick::by_rendezvous(k.as_bytes(), &listed)[0].node == "b")
        .unwrap();
    let order = pick::by_rendezvous(key.as_bytes(), &listed)
        .into_iter()
        .cloned()
        .collect();
    cluster.connector().hung.borrow_mut().insert(addr(2));
    (nodes, cluster, key, order)
}

#[tokio::test]
async fn a_node_that_does_not_answer_is_given_up_at_the_bound_and_tried_last_until_it_answers() {
    let Some(etcd) = Etcd::start() else { return };
    let (_nodes, cluster, key, order) = hung_b(&etcd, Duration::from_secs(600)).await;
    let fake = cluster.connector();
    // b comes first for the key, and never answers: the connect moves on at the bound.
    let got = connect_key(&cluster, &key).await.expect("a live node");
    assert_eq!(got.node.node, order[1].node);
    assert_eq!(got.failed.len(), 1, "{:?}", got.failed);
    assert_eq!(got.failed[0].node, "b");
    assert!(
        got.failed[0].reason.contains("no answer within 300ms"),
        "{}",
        got.failed[0]
    );
    assert_eq!(fake.hanging.get(), 0, "the unanswered connect was dropped");
    assert_eq!(cluster.suspected("echo"), ["b"]);
    // From now on b is tried last: the same key goes to its second node at once, and
    // connects by load never reach b while a and c answer.
    fake.tried.borrow_mut().clear();
    let got = connect_key(&cluster, &key).await.unwrap();
    assert_eq!(got.node.node, order[1].node);
    assert!(got.failed.is_empty(), "{:?}", got.failed);
    for _ in 0..20 {
        let got = cluster
            .connect("echo", Placement::LeastLoaded)
            .await
            .unwrap();
        assert_ne!(got.node.node, "b");
    }
    assert!(
        !fake.tried.borrow().contains(&addr(2)),
        "b was dialled again: {:?}",
        fake.tried
    );
    // b answers again; a and c refuse. b, tried last, takes the connection and is no
    // longer suspect.
    fake.hung.borrow_mut().clear();
    fake.refused.borrow_mut().extend([addr(1), addr(3)]);
    let got = cluster
        .connect("echo", Placement::LeastLoaded)
        .await
        .unwrap();
    assert_eq!(got.node.node, "b");
    assert_eq!(got.failed.len(), 2, "{:?}", got.failed);
    assert!(cluster.suspected("echo").is_empty());
    fake.refused.borrow_mut().clear();
    let got = connect_key(&cluster, &key).await.unwrap();
    assert_eq!(got.node.node, "b", "first for its key again");
}

#[tokio::test]
async fn a_suspicion_expires_and_the_node_is_tried_in_its_place_again() {
    let Some(etcd) = Etcd::start() else { return };
    // Long enough that the first check sees it on a busy machine.
    let hold = Duration::from_secs(5);
    let (_nodes, cluster, key, order) = hung_b(&etcd, hold).await;
    let fake = cluster.connector();
    let got = connect_key(&cluster, &key).await.unwrap();
    assert_eq!(got.node.node, order[1].node);
    assert_eq!(cluster.suspected("echo"), ["b"]);
    // Marked before the connect returned: past `hold` from here, it has expired.
    tokio::time::sleep(hold).await;
    assert!(cluster.suspected("echo").is_empty());
    fake.tried.borrow_mut().clear();
    let got = connect_key(&cluster, &key).await.unwrap();
    assert_eq!(got.node.node, order[1].node);
    assert_eq!(got.failed[0].node, "b", "b first again: {:?}", got.failed);
    assert_eq!(fake.tried.borrow()[0], addr(2));
    assert_eq!(cluster.suspected("echo"), ["b"], "suspect again");
}

#[tokio::test]
async fn a_suspect_the_registry_drops_is_forgotten_when_it_registers_again() {
    let Some(etcd) = Etcd::start() else { return };
    let (mut nodes, cluster, key, _order) = hung_b(&etcd, Duration::from_secs(600)).await;
    let members = cluster.membership("echo").unwrap();
    connect_key(&cluster, &key).await.unwrap();
    assert_eq!(cluster.suspected("echo"), ["b"]);
    // b's server goes, and comes back (a new lease), answering this time.
    nodes.remove(1).withdraw().await.unwrap();
    members
        .wait_for(Duration::from_secs(5), |n| n.len() == 2)
        .await
        .expect("b gone");
    // A connect while b is unlisted forgets it.
    connect_key(&cluster, &key).await.unwrap();
    assert!(cluster.suspected("echo").is_empty());
    cluster.connector().hung.borrow_mut().clear();
    let _b = register(&etcd, "b", addr(2), "echo").await;
    members
        .wait_for(Duration::from_secs(5), |n| n.len() == 3)
        .await
        .expect("b back");
    let got = connect_key(&cluster, &key).await.unwrap();
    assert_eq!(got.node.node, "b");
    assert!(got.failed.is_empty(), "{:?}", got.failed);
}
