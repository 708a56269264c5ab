//! ClusterSession against a real etcd, with a connector that stands in for RDMA: a
//! lost connection moves the session to another node, idempotent requests are sent
//! again there and others are not, a draining node is left before the next request,
//! a reconnect moves on from a node that does not answer at the client's dial bound,
//! and every error names the node and the reason.

mod util;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use rdmactor_cluster::{
    ClusterClient, ConnectionFault, Connector, Idempotency, Placement, Registrar, SessionError,
};
use util::{addr, register, Etcd, EtcdExt};

/// Requests on a `broken` address fail as a lost connection would; connects to a
/// `refused` one fail, connects to a `hung` one never end (a dead host's). Counts what
/// ran where, and which connections were closed.
#[derive(Default)]
struct Fake {
    broken: RefCell<HashSet<SocketAddr>>,
    refused: RefCell<HashSet<SocketAddr>>,
    hung: RefCell<HashSet<SocketAddr>>,
    /// Every connect, in order.
    tried: RefCell<Vec<SocketAddr>>,
    /// Requests answered, by address.
    ran: RefCell<HashMap<SocketAddr, u32>>,
    closed: RefCell<Vec<SocketAddr>>,
}

#[derive(Debug)]
enum FakeError {
    Lost(String),
    Handler(String),
}

impl std::fmt::Display for FakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FakeError::Lost(why) | FakeError::Handler(why) => f.write_str(why),
        }
    }
}

impl ConnectionFault for FakeError {
    fn connection_lost(&self) -> Option<String> {
        match self {
            FakeError::Lost(why) => Some(why.clone()),
            FakeError::Handler(_) => None,
        }
    }
}

impl Connector for Fake {
    type Connection = SocketAddr;
    type Error = String;
    async fn connect(&self, addr: SocketAddr, _service: &str) -> Result<SocketAddr, String> {
        self.tried.borrow_mut().push(addr);
        if self.hung.borrow().contains(&addr) {
            std::future::pending::<()>().await;
        }
        if self.refused.borrow().contains(&addr) {
            Err("rejected by the transport: no listener".into())
        } else {
            Ok(addr)
        }
    }
    async fn close(&self, connection: SocketAddr) {
        self.closed.borrow_mut().push(connection);
    }
}

impl Fake {
    /// One request on `conn`: `fail` makes it fail on a live connection.
    async fn request(&self, conn: SocketAddr, fail: bool) -> Result<SocketAddr, FakeError> {
        if self.broken.borrow().contains(&conn) {
            return Err(FakeError::Lost(
                "peer unreachable: retry exceeded (host gone)".into(),
            ));
        }
        if fail {
            return Err(FakeError::Handler("the handler failed: no such key".into()));
        }
        *self.ran.borrow_mut().entry(conn).or_default() += 1;
        Ok(conn)
    }

    fn ran_on(&self, addr: SocketAddr) -> u32 {
        self.ran.borrow().get(&addr).copied().unwrap_or(0)
    }
}

/// Three nodes a, b, c registered, and a client that lists them.
async fn three(etcd: &Etcd) -> (Vec<Registrar>, ClusterClient<Fake>) {
    let mut nodes = Vec::new();
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        nodes.push(register(etcd, name, addr(i as u8 + 1), "echo").await);
    }
    let cluster = ClusterClient::new(Fake::default(), etcd.config(), "test");
    cluster
        .membership("echo")
        .unwrap()
        .wait_for(Duration::from_secs(5), |n| n.len() == 3)
        .await
        .expect("three listed");
    (nodes, cluster)
}

#[tokio::test]
async fn an_idempotent_request_is_sent_again_on_another_node_when_the_connection_is_lost() {
    let Some(etcd) = Etcd::start() else { return };
    let (_nodes, cluster) = three(&etcd).await;
    let fake = cluster.connector();
    let mut session = cluster
        .session("echo", Placement::LeastLoaded)
        .await
        .unwrap();
    let first = session
        .request(Idempotency::Idempotent, |c| fake.request(c, false))
        .await
        .unwrap();
    let first_node = session.node().unwrap().node.clone();
    // The first node's host dies under the session.
    fake.broken.borrow_mut().insert(first);
    let second = session
        .request(Idempotency::Idempotent, |c| fake.request(c, false))
        .await
        .expect("answered by another node");
    assert_ne!(second, first);
    assert_eq!(fake.ran_on(second), 1);
    assert_eq!(fake.ran_on(first), 1, "only the first request ran there");
    let moves = session.moves();
    assert_eq!(moves.len(), 1, "{moves:?}");
    assert_eq!(moves[0].node, first_node);
    assert!(moves[0].reason.contains("peer unreachable"), "{}", moves[0]);
    assert_eq!(
        *fake.closed.borrow(),
        [first],
        "the lost connection was closed"
    );
    // Later requests stay on the new node.
    for _ in 0..3 {
        let at = session
            .request(Idempotency::Idempotent, |c| fake.request(c, false))
            .await
            .unwrap();
        assert_eq!(at, second);
    }
}

#[tokio::test]
async fn a_request_marked_once_is_not_sent_again_and_the_error_names_the_node() {
    let Some(etcd) = Etcd::start() else { return };
    let (_nodes, cluster) = three(&etcd).await;
    let fake = cluster.connector();
    let mut session = cluster
        .session("echo", Placement::LeastLoaded)
        .await
        .unwrap();
    let node = session.node().unwrap().clone();
    fake.broken.borrow_mut().insert(node.record.addr);
    let err = session
        .request(Idempotency::Once, |c| fake.request(c, false))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(&err, SessionError::NotRetried { lost, .. } if lost.node == node.node),
        "{text}"
    );
    for needle in [
        format!("node {} ({})", node.node, node.record.addr),
        "peer unreachable".into(),
        "not idempotent".into(),
    ] {
        assert!(text.contains(&needle), "{needle:?} not in: {text}");
    }
    assert!(
        fake.ran.borrow().is_empty(),
        "sent nowhere else: {:?}",
        fake.ran
    );
    // The next request reconnects, to another node.
    let at = session
        .request(Idempotency::Once, |c| fake.request(c, false))
        .await
        .unwrap();
    assert_ne!(at, node.record.addr);
}

#[tokio::test]
async fn a_failed_request_on_a_live_connection_is_not_a_move() {
    let Some(etcd) = Etcd::start() else { return };
    let (_nodes, cluster) = three(&etcd).await;
    let fake = cluster.connector();
    let mut session = cluster
        .session("echo", Placement::LeastLoaded)
        .await
        .unwrap();
    let node = session.node().unwrap().clone();
    let err = session
        .request(Idempotency::Idempotent, |c| fake.request(c, true))
        .await
        .unwrap_err();
    assert!(matches!(err, SessionError::Failed { .. }), "{err}");
    assert!(
        err.to_string().starts_with(&format!(
            "node {} ({}): the handler failed",
            node.node, node.record.addr
        )),
        "{err}"
    );
    assert!(session.moves().is_empty());
    let at = session
        .request(Idempotency::Idempotent, |c| fake.request(c, false))
        .await
        .unwrap();
    assert_eq!(at, node.record.addr, "the connection went on");
}

#[tokio::test]
async fn a_draining_node_is_left_before_the_next_request() {
    let Some(etcd) = Etcd::start() else { return };
    let (mut nodes, cluster) = three(&etcd).await;
    let fake = cluster.connector();
    let mut session = cluster
        .session("echo", Placement::LeastLoaded)
        .await
        .unwrap();
    let node = session.node().unwrap().clone();
    // Its server shuts down: draining, then withdrawn.
    let i = ["a", "b", "c"]
        .iter()
        .position(|n| *n == node.node)
        .unwrap();
    nodes.remove(i).withdraw().await.unwrap();
    cluster
        .membership("echo")
        .unwrap()
        .wait_for(Duration::from_secs(5), |n| n.len() == 2)
        .await
        .expect("withdrawn");
    let at = session
        .request(Idempotency::Once, |c| fake.request(c, false))
        .await
        .expect("served by another node without an error");
    assert_ne!(at, node.record.addr);
    assert_eq!(fake.ran_on(node.record.addr), 0);
    assert_eq!(*fake.closed.borrow(), [node.record.addr]);
    let moves = session.moves();
    assert_eq!(moves.len(), 1);
    assert_eq!(moves[0].node, node.node);
    assert!(
        moves[0].reason.contains("no longer in the registry")
            || moves[0].reason.contains("draining"),
        "{}",
        moves[0]
    );
}

#[tokio::test]
async fn a_refused_reconnect_goes_on_and_losing_every_node_lists_each() {
    let Some(etcd) = Etcd::start() else { return };
    let (_nodes, cluster) = three(&etcd).await;
    let fake = cluster.connector();
    let mut session = cluster
        .session("echo", Placement::LeastLoaded)
        .await
        .unwrap();
    let first = session.node().unwrap().record.addr;
    // The first breaks, and one of the others refuses connects: the third answers.
    fake.broken.borrow_mut().insert(first);
    let refused = [addr(1), addr(2), addr(3)]
        .into_iter()
        .find(|a| *a != first)
        .unwrap();
    fake.refused.borrow_mut().insert(refused);
    let at = session
        .request(Idempotency::Idempotent, |c| fake.request(c, false))
        .await
        .unwrap();
    assert!(at != first && at != refused);
    // Every node breaks: three losses, each named.
    fake.refused.borrow_mut().clear();
    fake.broken.borrow_mut().extend([addr(1), addr(2), addr(3)]);
    let err = session
        .request(Idempotency::Idempotent, |c| fake.request(c, false))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(&err, SessionError::GaveUp { attempts, .. } if attempts.len() == 3),
        "{text}"
    );
    for node in [
        "node a (192.0.2.1:7471)",
        "node b (192.0.2.2:7471)",
        "node c (192.0.2.3:7471)",
    ] {
        assert!(text.contains(node), "{node} not in: {text}");
    }
}

#[tokio::test]
async fn a_reconnect_moves_on_from_a_node_that_does_not_answer() {
    let Some(etcd) = Etcd::start() else { return };
    let (_nodes, cluster) = three(&etcd).await;
    let cluster = cluster
        .with_dial_timeout(Duration::from_millis(300))
        .with_suspicion(Duration::from_secs(600));
    let fake = cluster.connector();
    let listed = cluster.membership("echo").unwrap().nodes();
    let key = b"session-key";
    let order: Vec<_> = rdmactor_cluster::pick::by_rendezvous(key, &listed)
        .into_iter()
        .map(|n| n.record.addr)
        .collect();
    let mut session = cluster.session("echo", Placement::Key(key)).await.unwrap();
    assert_eq!(session.node().unwrap().record.addr, order[0]);
    // The first node's host dies under the session, and the next one in the key's
    // order is dead too, still listed: its connect never answers.
    fake.broken.borrow_mut().insert(order[0]);
    fake.hung.borrow_mut().insert(order[1]);
    let at = tokio::time::timeout(
        Duration::from_secs(60),
        session.request(Idempotency::Idempotent, |c| fake.request(c, false)),
    )
    .await
    .expect("the reconnect ended")
    .expect("answered by the third node");
    assert_eq!(at, order[2]);
    let hung = listed.iter().find(|n| n.record.addr == order[1]).unwrap();
    assert_eq!(cluster.suspected("echo"), [hung.node.as_str()]);
    // The third breaks as well: the next reconnect tries the first node (lost longest
    // ago) before the suspect, and gives up there without waiting on the suspect twice.
    fake.broken.borrow_mut().insert(order[2]);
    fake.broken.borrow_mut().remove(&order[0]);
    let at = tokio::time::timeout(
        Duration::from_secs(60),
        session.request(Idempotency::Idempotent, |c| fake.request(c, false)),
    )
    .await
    .expect("the reconnect ended")
    .expect("answered by the first node again");
    assert_eq!(at, order[0]);
    let dialled = fake.tried.borrow();
    assert_eq!(
        dialled.iter().filter(|a| **a == order[1]).count(),
        1,
        "the suspect was dialled once: {dialled:?}"
    );
}
