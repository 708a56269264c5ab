//! Files across nodes against a real etcd, with a transfer that stands in for the
//! `files` service (each node a directory): replicas on the first R nodes in rendezvous
//! order, a name created once, fetches from a live replica checked against the
//! recorded digest, and repair after a node has been gone past the grace period.

mod util;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rdmactor_cluster::files::{
    plan, Catalog, ClusterFiles, Created, FileRecord, FileTransfer, FilesError, RepairPlanner,
    Verified,
};
use rdmactor_cluster::Registrar;
use util::{addr, register, Etcd, EtcdExt};

/// Each node's store is a directory; a node in `dead` refuses every transfer.
struct Fake {
    stores: HashMap<SocketAddr, PathBuf>,
    dead: RefCell<HashSet<SocketAddr>>,
    uploads: RefCell<Vec<SocketAddr>>,
    _dir: tempfile::TempDir,
}

fn verify(bytes: &[u8]) -> Verified {
    Verified {
        alg: "blake3".into(),
        digest: blake3::hash(bytes).to_hex().to_string(),
        size: bytes.len() as u64,
    }
}

impl FileTransfer for Fake {
    async fn upload(&self, addr: SocketAddr, path: &Path, name: &str) -> Result<Verified, String> {
        if self.dead.borrow().contains(&addr) {
            return Err("connect: rejected by the transport: no listener".into());
        }
        self.uploads.borrow_mut().push(addr);
        let dest = self.stores[&addr].join(name);
        if dest.exists() {
            return Err("rejected: the file exists".into());
        }
        let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
        std::fs::write(&dest, &bytes).map_err(|e| e.to_string())?;
        Ok(verify(&bytes))
    }

    async fn fetch(&self, addr: SocketAddr, name: &str, dir: &Path) -> Result<Verified, String> {
        if self.dead.borrow().contains(&addr) {
            return Err("connect: rejected by the transport: no listener".into());
        }
        let bytes = std::fs::read(self.stores[&addr].join(name))
            .map_err(|_| "rejected: no such file".to_string())?;
        std::fs::write(dir.join(name), &bytes).map_err(|e| e.to_string())?;
        Ok(verify(&bytes))
    }
}

const NODES: [&str; 3] = ["a", "b", "c"];

fn fake() -> Fake {
    let dir = tempfile::tempdir().unwrap();
    let stores = (0..3u8)
        .map(|i| {
            let store = dir.path().join(NODES[i as usize]);
            std::fs::create_dir(&store).unwrap();
            (addr(i + 1), store)
        })
        .collect();
    Fake {
        stores,
        dead: RefCell::default(),
        uploads: RefCell::default(),
        _dir: dir,
    }
}

/// Nodes a, b, c registered for `files`, and a client of them that lists all three.
async fn cluster(etcd: &Etcd) -> (Vec<Registrar>, ClusterFiles<Fake>) {
    let mut nodes = Vec::new();
    for (i, node) in NODES.into_iter().enumerate() {
        nodes.push(register(etcd, node, addr(i as u8 + 1), "files").await);
    }
    let files = ClusterFiles::new(fake(), etcd.config(), "test").unwrap();
    files
        .membership()
        .wait_for(Duration::from_secs(5), |n| n.len() == 3)
        .await
        .expect("three listed");
    (nodes, files)
}

fn node_addr(node: &str) -> SocketAddr {
    addr(NODES.iter().position(|n| *n == node).unwrap() as u8 + 1)
}

fn ids() -> Vec<String> {
    NODES.iter().map(|n| n.to_string()).collect()
}

/// A local file of `len` bytes of a pattern seeded by `seed`.
fn local(dir: &Path, name: &str, len: usize, seed: u8) -> (PathBuf, Vec<u8>) {
    let bytes: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    let path = dir.join(name);
    std::fs::write(&path, &bytes).unwrap();
    (path, bytes)
}

#[tokio::test]
async fn a_file_goes_to_the_first_two_nodes_in_rendezvous_order_and_comes_back_whole() {
    let Some(etcd) = Etcd::start() else { return };
    let (_nodes, files) = cluster(&etcd).await;
    let work = tempfile::tempdir().unwrap();
    let (path, bytes) = local(work.path(), "f.bin", 100_000, 1);
    let record = files.put(&path, "f.bin").await.unwrap();
    let want: Vec<String> = plan::replica_order("f.bin", &ids())
        .into_iter()
        .take(2)
        .cloned()
        .collect();
    assert_eq!(record.nodes, want);
    assert_eq!(record.digest, verify(&bytes).digest);
    assert_eq!(record.size, bytes.len() as u64);
    for node in &want {
        let held = std::fs::read(files.transfer().stores[&node_addr(node)].join("f.bin")).unwrap();
        assert_eq!(held, bytes, "replica on {node}");
    }
    let third = NODES
        .iter()
        .find(|n| !want.contains(&n.to_string()))
        .unwrap();
    assert!(!files.transfer().stores[&node_addr(third)]
        .join("f.bin")
        .exists());
    // The catalog holds it, as etcdctl would show it.
    let stored = files.catalog().get("f.bin").await.unwrap().unwrap();
    assert_eq!(stored.record, record);
    let out = tempfile::tempdir().unwrap();
    let fetched = files.get("f.bin", out.path()).await.unwrap();
    assert_eq!(std::fs::read(&fetched.path).unwrap(), bytes);
    assert_eq!(fetched.node, want[0]);
}

#[tokio::test]
async fn a_name_is_created_once_whoever_races() {
    let Some(etcd) = Etcd::start() else { return };
    let catalog = Catalog::new(etcd.config(), "test").unwrap();
    let record = |digest: &str| FileRecord {
        alg: "sha256".into(),
        digest: digest.into(),
        size: 1,
        nodes: vec!["a".into(), "b".into()],
        owner: None,
    };
    let (d1, d2) = (record("d1"), record("d2"));
    let (first, second) = tokio::join!(catalog.create("race", &d1), catalog.create("race", &d2));
    let outcomes = [first.unwrap(), second.unwrap()];
    let new = outcomes.iter().filter(|o| **o == Created::New).count();
    assert_eq!(new, 1, "{outcomes:?}");
    let stored = catalog.get("race").await.unwrap().unwrap();
    let loser = outcomes.iter().find(|o| **o != Created::New).unwrap();
    assert_eq!(*loser, Created::Exists(stored.record.clone()));
    // A put of a taken name fails before uploading anything, naming what holds it.
    let (_nodes, files) = cluster(&etcd).await;
    let work = tempfile::tempdir().unwrap();
    let (path, _) = local(work.path(), "race", 10, 2);
    let err = files.put(&path, "race").await.unwrap_err();
    assert!(matches!(err, FilesError::NameTaken { .. }), "{err}");
    assert!(err.to_string().contains(&stored.record.digest), "{err}");
    assert!(files.transfer().uploads.borrow().is_empty());
}

#[tokio::test]
async fn a_dead_node_is_replaced_at_upload_and_skipped_at_fetch_and_other_bytes_are_refused() {
    let Some(etcd) = Etcd::start() else { return };
    let (_nodes, files) = cluster(&etcd).await;
    let work = tempfile::tempdir().unwrap();
    let (path, bytes) = local(work.path(), "g.bin", 5000, 3);
    let order: Vec<String> = plan::replica_order("g.bin", &ids())
        .into_iter()
        .cloned()
        .collect();
    // The first choice is down (still listed: its lease has not lapsed).
    files
        .transfer()
        .dead
        .borrow_mut()
        .insert(node_addr(&order[0]));
    let record = files.put(&path, "g.bin").await.unwrap();
    assert_eq!(record.nodes, [order[1].clone(), order[2].clone()]);
    // It comes back; the record's first replica now holds other bytes.
    files.transfer().dead.borrow_mut().clear();
    std::fs::write(
        files.transfer().stores[&node_addr(&order[1])].join("g.bin"),
        b"other bytes",
    )
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    let fetched = files.get("g.bin", out.path()).await.unwrap();
    assert_eq!(fetched.node, order[2]);
    assert_eq!(std::fs::read(&fetched.path).unwrap(), bytes);
    assert_eq!(fetched.failed.len(), 1);
    assert_eq!(fetched.failed[0].0, order[1]);
    assert!(
        fetched.failed[0].1.contains("holds other bytes"),
        "{:?}",
        fetched.failed
    );
    // Both replicas unusable: the error names each.
    files
        .transfer()
        .dead
        .borrow_mut()
        .insert(node_addr(&order[2]));
    let out = tempfile::tempdir().unwrap();
    let err = files.get("g.bin", out.path()).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&format!("node {}: holds other bytes", order[1])),
        "{text}"
    );
    assert!(
        text.contains(&format!("node {}: connect: rejected", order[2])),
        "{text}"
    );
    assert!(
        !out.path().join("g.bin").exists(),
        "no file with other bytes is left"
    );
    // Too few nodes for R = 2: the error names the failure.
    files
        .transfer()
        .dead
        .borrow_mut()
        .insert(node_addr(&order[0]));
    let (path, _) = local(work.path(), "h.bin", 10, 4);
    let err = files.put(&path, "h.bin").await.unwrap_err();
    assert!(err.to_string().contains("of 2 replicas verified"), "{err}");
    assert!(
        files.catalog().get("h.bin").await.unwrap().is_none(),
        "not recorded"
    );
}

#[tokio::test]
async fn repair_copies_a_replica_once_its_node_is_gone_past_the_grace_period() {
    let Some(etcd) = Etcd::start() else { return };
    let (mut nodes, files) = cluster(&etcd).await;
    let work = tempfile::tempdir().unwrap();
    let (path, bytes) = local(work.path(), "r.bin", 20_000, 5);
    let record = files.put(&path, "r.bin").await.unwrap();
    let gone = record.nodes[0].clone();
    let kept = record.nodes[1].clone();
    let spare = NODES
        .iter()
        .find(|n| !record.nodes.contains(&n.to_string()))
        .unwrap()
        .to_string();
    // The node leaves the registry (its server stops).
    let i = NODES.iter().position(|n| *n == gone).unwrap();
    nodes.remove(i).withdraw().await.unwrap();
    files
        .membership()
        .wait_for(Duration::from_secs(5), |n| n.len() == 2)
        .await
        .expect("withdrawn");
    files.transfer().dead.borrow_mut().insert(node_addr(&gone));
    let grace = Duration::from_secs(30);
    let mut planner = RepairPlanner::new(grace);
    let t0 = Instant::now();
    let scratch = tempfile::tempdir().unwrap();
    let report = files
        .repair(&mut planner, t0, scratch.path())
        .await
        .unwrap();
    assert!(
        report.done.is_empty() && report.failed.is_empty(),
        "{report:?}"
    );
    assert!(!files.transfer().stores[&node_addr(&spare)]
        .join("r.bin")
        .exists());
    // Another repairer holds the lock: the copy waits.
    let held = files
        .catalog()
        .lock("r.bin", Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    let report = files
        .repair(&mut planner, t0 + grace, scratch.path())
        .await
        .unwrap();
    assert!(report.done.is_empty(), "{report:?}");
    assert!(
        report.failed[0].1.contains("another repairer"),
        "{report:?}"
    );
    files.catalog().release(held).await;
    // Past the grace period: copied to the spare node and recorded.
    let report = files
        .repair(&mut planner, t0 + grace, scratch.path())
        .await
        .unwrap();
    assert_eq!(report.done.len(), 1, "{report:?}");
    assert_eq!(
        (report.done[0].from.as_str(), report.done[0].to.as_str()),
        (kept.as_str(), spare.as_str())
    );
    let copied = std::fs::read(files.transfer().stores[&node_addr(&spare)].join("r.bin")).unwrap();
    assert_eq!(copied, bytes);
    let now = files.catalog().get("r.bin").await.unwrap().unwrap().record;
    assert_eq!(now.nodes, [spare.clone(), kept.clone()]);
    assert_eq!(now.digest, record.digest);
    // Nothing more to do; the scratch copy is gone.
    let report = files
        .repair(&mut planner, t0 + grace * 2, scratch.path())
        .await
        .unwrap();
    assert!(
        report.done.is_empty() && report.failed.is_empty(),
        "{report:?}"
    );
    assert_eq!(std::fs::read_dir(scratch.path()).unwrap().count(), 0);
}

#[tokio::test]
async fn an_update_is_fenced_by_the_revision_it_read_and_the_lock() {
    let Some(etcd) = Etcd::start() else { return };
    let catalog = Catalog::new(etcd.config(), "test").unwrap();
    let mut record = FileRecord {
        alg: "sha256".into(),
        digest: "d".into(),
        size: 1,
        nodes: vec!["a".into(), "b".into()],
        owner: None,
    };
    assert_eq!(catalog.create("f", &record).await.unwrap(), Created::New);
    let read = catalog.get("f").await.unwrap().unwrap();
    let lock = catalog
        .lock("f", Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    record.nodes[0] = "c".into();
    assert!(catalog.replace(&read, &record, &lock).await.unwrap());
    // The same stale read again: refused.
    record.nodes[0] = "d".into();
    assert!(!catalog.replace(&read, &record, &lock).await.unwrap());
    // A fresh read, but the lock let go: refused.
    let fresh = catalog.get("f").await.unwrap().unwrap();
    let stale_lock = lock;
    let key_gone = {
        let mut raw = etcd.client().await;
        let keys = raw
            .get(
                "/rdmactor/test/locks/",
                Some(etcd_client::GetOptions::new().with_prefix()),
            )
            .await
            .unwrap();
        assert_eq!(keys.kvs().len(), 1, "the lock's key exists while held");
        keys.kvs()[0].lease()
    };
    etcd.client().await.lease_revoke(key_gone).await.unwrap();
    assert!(!catalog.replace(&fresh, &record, &stale_lock).await.unwrap());
    assert_eq!(
        catalog.get("f").await.unwrap().unwrap().record.nodes,
        ["c", "b"]
    );
    catalog.release(stale_lock).await;
}
