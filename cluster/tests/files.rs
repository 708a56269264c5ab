//! Files across nodes against a real etcd, with a transfer that stands in for the
//! `files` service (each node a directory): replicas on the first R nodes in rendezvous
//! order, a name created once, fetches from a live replica checked against the
//! recorded digest, and repair after a node has been gone past the grace period.

mod util;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rdmactor_cluster::files::{
    plan, AddedCopy, Catalog, ClusterFiles, Collector, Created, FileRecord, FileTransfer,
    FilesError, Removed, RepairPlanner, Staging, TransferError, Upload, Verified,
};
use rdmactor_cluster::Registrar;
use util::{addr, register, Etcd, EtcdExt};

/// Each node's store is a directory; a node in `dead` refuses every transfer. Like the
/// files service, a fetch is refused on the file's size before any byte moves, and an
/// existing name is never replaced.
struct Fake {
    stores: HashMap<SocketAddr, PathBuf>,
    dead: RefCell<HashSet<SocketAddr>>,
    uploads: RefCell<Vec<SocketAddr>>,
    /// Bytes each upload or fetch moved, by the node it moved them to or from.
    moved: RefCell<Vec<(SocketAddr, u64)>>,
    /// The limit each fetch was given.
    fetch_limits: RefCell<Vec<u64>>,
    /// The directory each fetch wrote into, and its permission bits then.
    fetch_dirs: RefCell<Vec<(PathBuf, u32)>>,
    /// Each file a transfer wrote, with the owner it was stored for (`copy_for`).
    stored_for: RefCell<Vec<(PathBuf, Option<String>)>>,
    _dir: tempfile::TempDir,
}

fn verify(bytes: &[u8]) -> Verified {
    Verified {
        alg: "blake3".into(),
        digest: blake3::hash(bytes).to_hex().to_string(),
        size: bytes.len() as u64,
    }
}

impl Fake {
    fn alive(&self, addr: SocketAddr) -> Result<(), TransferError> {
        if self.dead.borrow().contains(&addr) {
            return Err(TransferError::Failed(
                "connect: rejected by the transport: no listener".into(),
            ));
        }
        Ok(())
    }

    /// Bytes moved to or from `node`.
    fn moved(&self, node: &str) -> u64 {
        let at = node_addr(node);
        self.moved
            .borrow()
            .iter()
            .filter(|(a, _)| *a == at)
            .map(|(_, n)| n)
            .sum()
    }

    fn store(&self, node: &str) -> &Path {
        &self.stores[&node_addr(node)]
    }
}

impl FileTransfer for Fake {
    async fn upload(
        &self,
        addr: SocketAddr,
        path: &Path,
        name: &str,
        how: Upload<'_>,
    ) -> Result<Verified, TransferError> {
        self.alive(addr)?;
        self.uploads.borrow_mut().push(addr);
        let dest = self.stores[&addr].join(name);
        if dest.exists() && !how.overwrite {
            return Err(TransferError::Exists);
        }
        let bytes = std::fs::read(path).map_err(|e| TransferError::Failed(e.to_string()))?;
        std::fs::write(&dest, &bytes).map_err(|e| TransferError::Failed(e.to_string()))?;
        let owner = how.copy_for.map(str::to_owned);
        self.stored_for.borrow_mut().push((dest, owner));
        self.moved.borrow_mut().push((addr, bytes.len() as u64));
        Ok(verify(&bytes))
    }

    async fn fetch(
        &self,
        addr: SocketAddr,
        name: &str,
        dir: &Path,
        max_size: u64,
        copy_for: Option<&str>,
    ) -> Result<Verified, TransferError> {
        self.alive(addr)?;
        self.fetch_limits.borrow_mut().push(max_size);
        let mode = std::fs::metadata(dir).unwrap().permissions().mode();
        self.fetch_dirs.borrow_mut().push((dir.to_owned(), mode));
        let src = self.stores[&addr].join(name);
        let len = std::fs::metadata(&src)
            .map_err(|_| TransferError::NotFound)?
            .len();
        if len > max_size {
            return Err(TransferError::TooLarge { max: max_size });
        }
        if dir.join(name).exists() {
            return Err(TransferError::Exists);
        }
        let bytes = std::fs::read(src).map_err(|e| TransferError::Failed(e.to_string()))?;
        std::fs::write(dir.join(name), &bytes).map_err(|e| TransferError::Failed(e.to_string()))?;
        let owner = copy_for.map(str::to_owned);
        self.stored_for.borrow_mut().push((dir.join(name), owner));
        self.moved.borrow_mut().push((addr, bytes.len() as u64));
        Ok(verify(&bytes))
    }

    async fn delete(&self, addr: SocketAddr, name: &str) -> Result<(), TransferError> {
        self.alive(addr)?;
        std::fs::remove_file(self.stores[&addr].join(name)).map_err(|_| TransferError::NotFound)
    }

    async fn stat(&self, addr: SocketAddr, name: &str) -> Result<Verified, TransferError> {
        self.alive(addr)?;
        let bytes =
            std::fs::read(self.stores[&addr].join(name)).map_err(|_| TransferError::NotFound)?;
        Ok(verify(&bytes))
    }
}

/// The node ids the tests may register: the first three make [`cluster`].
const NODES: [&str; 6] = ["a", "b", "c", "d", "e", "f"];

fn fake() -> Fake {
    let dir = tempfile::tempdir().unwrap();
    let stores = (0..NODES.len())
        .map(|i| {
            let store = dir.path().join(NODES[i]);
            std::fs::create_dir(&store).unwrap();
            (addr(i as u8 + 1), store)
        })
        .collect();
    Fake {
        stores,
        dead: RefCell::default(),
        uploads: RefCell::default(),
        moved: RefCell::default(),
        fetch_limits: RefCell::default(),
        fetch_dirs: RefCell::default(),
        stored_for: RefCell::default(),
        _dir: dir,
    }
}

/// Nodes a, b, c registered for `files`, and a client of them that lists all three.
async fn cluster(etcd: &Etcd) -> (Vec<Registrar>, ClusterFiles<Fake>) {
    cluster_of(etcd, 3).await
}

/// The first `n` of [`NODES`] registered for `files`, and a client that lists them.
async fn cluster_of(etcd: &Etcd, n: usize) -> (Vec<Registrar>, ClusterFiles<Fake>) {
    let mut nodes = Vec::new();
    for (i, node) in NODES.into_iter().take(n).enumerate() {
        nodes.push(register(etcd, node, addr(i as u8 + 1), "files").await);
    }
    let files = ClusterFiles::new(fake(), etcd.config(), "test").unwrap();
    listing(&files, n).await;
    (nodes, files)
}

/// Waits until the client lists `n` nodes.
async fn listing(files: &ClusterFiles<Fake>, n: usize) {
    files
        .membership()
        .wait_for(Duration::from_secs(5), |nodes| nodes.len() == n)
        .await
        .unwrap_or_else(|| panic!("{n} listed"));
}

fn node_addr(node: &str) -> SocketAddr {
    addr(NODES.iter().position(|n| *n == node).unwrap() as u8 + 1)
}

fn ids() -> Vec<String> {
    ids_of(3)
}

fn ids_of(n: usize) -> Vec<String> {
    NODES.iter().take(n).map(|n| n.to_string()).collect()
}

/// `name`'s rendezvous order over the first `n` nodes.
fn order_of(name: &str, n: usize) -> Vec<String> {
    plan::replica_order(name, &ids_of(n))
        .into_iter()
        .cloned()
        .collect()
}

/// Node `node`'s server-side repair: its own planner, its store as the staging.
fn store_of<'a>(files: &'a ClusterFiles<Fake>, node: &'a str) -> Staging<'a> {
    Staging::Store {
        node,
        dir: files.transfer().store(node),
        max_size: u64::MAX,
    }
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

/// A node that already holds the name with this upload's bytes (a server's repair
/// copied the first replica there while the client was still trying a dead node, as on
/// the wire) counts as a replica, and no bytes move to it; other bytes there are passed
/// over for the next node.
#[tokio::test]
async fn an_upload_meeting_its_own_bytes_on_a_node_counts_them_and_other_bytes_are_passed_over() {
    let Some(etcd) = Etcd::start() else { return };
    let (_nodes, files) = cluster(&etcd).await;
    let work = tempfile::tempdir().unwrap();
    let order: Vec<String> = plan::replica_order("k.bin", &ids())
        .into_iter()
        .cloned()
        .collect();
    let (path, bytes) = local(work.path(), "k.bin", 3000, 5);
    std::fs::write(files.transfer().store(&order[1]).join("k.bin"), &bytes).unwrap();
    let record = files.put(&path, "k.bin").await.unwrap();
    assert_eq!(record.nodes, [order[0].clone(), order[1].clone()]);
    assert_eq!(
        files.transfer().moved(&order[1]),
        0,
        "nothing moved to the holder"
    );
    // Other bytes under the name on the second choice: the third gets the copy.
    let order: Vec<String> = plan::replica_order("m.bin", &ids())
        .into_iter()
        .cloned()
        .collect();
    let (path, _) = local(work.path(), "m.bin", 3000, 6);
    std::fs::write(files.transfer().store(&order[1]).join("m.bin"), b"junk").unwrap();
    let record = files.put(&path, "m.bin").await.unwrap();
    assert_eq!(record.nodes, [order[0].clone(), order[2].clone()]);
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
        .repair(&mut planner, t0, Staging::Through(scratch.path()))
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
        .repair(&mut planner, t0 + grace, Staging::Through(scratch.path()))
        .await
        .unwrap();
    assert!(report.done.is_empty(), "{report:?}");
    assert!(
        report.failed[0].1.contains("another repairer"),
        "{report:?}"
    );
    assert!(
        report.failed[0].1.contains("next attempt in 5 s"),
        "{report:?}"
    );
    files.catalog().release(held).await;
    // Not proposed again before its wait is over.
    let report = files
        .repair(&mut planner, t0 + grace, Staging::Through(scratch.path()))
        .await
        .unwrap();
    assert!(
        report.done.is_empty() && report.failed.is_empty(),
        "{report:?}"
    );
    // Then: copied to the spare node and recorded, through a private directory.
    let after = t0 + grace + RepairPlanner::BACKOFF_BASE;
    let report = files
        .repair(&mut planner, after, Staging::Through(scratch.path()))
        .await
        .unwrap();
    assert_eq!(report.done.len(), 1, "{report:?}");
    let (staged, mode) = files.transfer().fetch_dirs.borrow()[0].clone();
    assert_eq!(staged.parent(), Some(scratch.path()));
    let staged_name = staged.file_name().unwrap().to_string_lossy().into_owned();
    assert!(staged_name.starts_with(".repair-"), "{staged_name}");
    assert_eq!(mode & 0o777, 0o700, "{staged_name} is private");
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
        .repair(
            &mut planner,
            after + grace,
            Staging::Through(scratch.path()),
        )
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

/// The registrars of [`cluster_of`], by node.
fn by_node(nodes: Vec<Registrar>) -> HashMap<String, Registrar> {
    NODES.iter().map(|n| n.to_string()).zip(nodes).collect()
}

/// `node`'s server stops: it leaves the registry (and the client sees `left` nodes).
async fn leave(
    regs: &mut HashMap<String, Registrar>,
    files: &ClusterFiles<Fake>,
    node: &str,
    left: usize,
) {
    regs.remove(node).unwrap().withdraw().await.unwrap();
    listing(files, left).await;
}

/// Puts `len` bytes seeded by `seed` as `name`; returns the bytes and the record.
async fn put(
    files: &ClusterFiles<Fake>,
    name: &str,
    len: usize,
    seed: u8,
) -> (Vec<u8>, FileRecord) {
    let work = tempfile::tempdir().unwrap();
    let (path, bytes) = local(work.path(), name, len, seed);
    let record = files.put(&path, name).await.unwrap();
    (bytes, record)
}

/// A node that holds the recorded bytes under the name already (a copy whose record
/// update was lost): recorded as the replica, no byte moved; through the node's own
/// store (`store`: a server's repair) or through a scratch directory (`ft repair`).
async fn a_leftover_replica_is_recorded_without_a_copy(store: bool) {
    let Some(etcd) = Etcd::start() else { return };
    let (nodes, files) = cluster(&etcd).await;
    let mut regs = by_node(nodes);
    let (bytes, record) = put(&files, "x.bin", 30_000, 7).await;
    let order = order_of("x.bin", 3);
    assert_eq!(record.nodes, order[..2]);
    std::fs::write(files.transfer().store(&order[2]).join("x.bin"), &bytes).unwrap();
    leave(&mut regs, &files, &order[0], 2).await;
    let grace = Duration::from_secs(30);
    let scratch = tempfile::tempdir().unwrap();
    let (mut planner, staging) = repairer(&files, &order[2], grace, store, scratch.path());
    let t0 = Instant::now();
    let report = files.repair(&mut planner, t0, staging).await.unwrap();
    assert!(report.done.is_empty(), "{report:?}");
    let moved = files.transfer().moved.borrow().len();
    let report = files
        .repair(&mut planner, t0 + grace, staging)
        .await
        .unwrap();
    assert!(report.failed.is_empty(), "{report:?}");
    assert_eq!(report.done.len(), 1, "{report:?}");
    assert_eq!(report.done[0].to, order[2]);
    let now = files.catalog().get("x.bin").await.unwrap().unwrap().record;
    assert_eq!(now.nodes, [order[2].clone(), order[1].clone()]);
    assert_eq!(
        files.transfer().moved.borrow().len(),
        moved,
        "no byte moved"
    );
    // Done: the next round has nothing to do.
    let report = files
        .repair(&mut planner, t0 + grace * 2, staging)
        .await
        .unwrap();
    assert!(
        report.done.is_empty() && report.failed.is_empty(),
        "{report:?}"
    );
}

#[tokio::test]
async fn a_server_holding_the_recorded_bytes_already_is_recorded_without_a_copy() {
    a_leftover_replica_is_recorded_without_a_copy(true).await;
}

#[tokio::test]
async fn a_target_holding_the_recorded_bytes_already_is_recorded_without_a_copy() {
    a_leftover_replica_is_recorded_without_a_copy(false).await;
}

#[tokio::test]
async fn a_target_holding_other_bytes_is_passed_over_for_the_next_node() {
    let Some(etcd) = Etcd::start() else { return };
    let (nodes, files) = cluster_of(&etcd, 4).await;
    let mut regs = by_node(nodes);
    let (bytes, _) = put(&files, "z.bin", 20_000, 9).await;
    let order = order_of("z.bin", 4);
    let junk = b"not z.bin".as_slice();
    std::fs::write(files.transfer().store(&order[2]).join("z.bin"), junk).unwrap();
    leave(&mut regs, &files, &order[0], 3).await;
    let grace = Duration::from_secs(30);
    let scratch = tempfile::tempdir().unwrap();
    let staging = Staging::Through(scratch.path());
    let mut planner = RepairPlanner::new(grace);
    let t0 = Instant::now();
    assert!(files
        .repair(&mut planner, t0, staging)
        .await
        .unwrap()
        .done
        .is_empty());
    // The first choice answers Exists with other bytes: passed over, no wait.
    let report = files
        .repair(&mut planner, t0 + grace, staging)
        .await
        .unwrap();
    assert!(report.done.is_empty(), "{report:?}");
    assert_eq!(report.failed[0].0.to, order[2]);
    assert!(report.failed[0].1.contains("passed over"), "{report:?}");
    let report = files
        .repair(&mut planner, t0 + grace, staging)
        .await
        .unwrap();
    assert_eq!(report.done.len(), 1, "{report:?}");
    assert_eq!(report.done[0].to, order[3]);
    let now = files.catalog().get("z.bin").await.unwrap().unwrap().record;
    assert_eq!(now.nodes, [order[3].clone(), order[1].clone()]);
    assert_eq!(
        std::fs::read(files.transfer().store(&order[3]).join("z.bin")).unwrap(),
        bytes
    );
    assert_eq!(
        std::fs::read(files.transfer().store(&order[2]).join("z.bin")).unwrap(),
        junk,
        "other bytes are left alone"
    );
}

#[tokio::test]
async fn junk_uploaded_to_the_next_nodes_in_order_does_not_stop_the_servers_repair() {
    let Some(etcd) = Etcd::start() else { return };
    let (nodes, files) = cluster_of(&etcd, 5).await;
    let mut regs = by_node(nodes);
    let (bytes, _) = put(&files, "j.bin", 20_000, 11).await;
    let order = order_of("j.bin", 5);
    // A client uploads junk under the name to the next two nodes in the name's order.
    let work = tempfile::tempdir().unwrap();
    let (junk, _) = local(work.path(), "junk", 20_000, 12);
    for node in &order[2..4] {
        files
            .transfer()
            .upload(node_addr(node), &junk, "j.bin", Upload::default())
            .await
            .unwrap();
    }
    leave(&mut regs, &files, &order[0], 4).await;
    let grace = Duration::from_secs(30);
    let t0 = Instant::now();
    let mut planners: HashMap<String, RepairPlanner> = order[1..]
        .iter()
        .map(|n| (n.clone(), RepairPlanner::for_node(grace, n)))
        .collect();
    for (node, planner) in &mut planners {
        let report = files
            .repair(planner, t0, store_of(&files, node))
            .await
            .unwrap();
        assert!(report.done.is_empty(), "{report:?}");
    }
    // The first squatted node finds its own junk and steps aside.
    let first = &order[2];
    let report = files
        .repair(
            planners.get_mut(first).unwrap(),
            t0 + grace,
            store_of(&files, first),
        )
        .await
        .unwrap();
    assert!(report.done.is_empty(), "{report:?}");
    assert!(report.failed[0].1.contains("passed over"), "{report:?}");
    // The first node past the junk copies it, having asked the two before it; the
    // second squatted node's repair need not run.
    let past = &order[4];
    let moved = files.transfer().moved(past);
    let report = files
        .repair(
            planners.get_mut(past).unwrap(),
            t0 + grace,
            store_of(&files, past),
        )
        .await
        .unwrap();
    assert_eq!(report.done.len(), 1, "{report:?}");
    assert_eq!(report.done[0].ahead, order[2..4]);
    let now = files.catalog().get("j.bin").await.unwrap().unwrap().record;
    assert_eq!(now.nodes, [past.clone(), order[1].clone()]);
    assert_eq!(
        std::fs::read(files.transfer().store(past).join("j.bin")).unwrap(),
        bytes
    );
    assert_eq!(moved, 0, "{past} held nothing before");
    // Every server's next round: nothing to do.
    for (node, planner) in &mut planners {
        rests(&files, planner, node, t0 + grace * 3).await;
    }
}

/// R = 2 on [A, B]; A cut off from etcd past the grace period; C becomes the replica;
/// A returns still holding the file; B dies. A ranks first for the file: its repair
/// records it (it holds the recorded bytes) instead of meeting `Exists` every round,
/// and once C dies too the file is still read, from A.
#[tokio::test]
async fn a_node_that_comes_back_holding_a_replica_is_recorded_and_the_file_survives() {
    let Some(etcd) = Etcd::start() else { return };
    let (nodes, files) = cluster(&etcd).await;
    let mut regs = by_node(nodes);
    let (bytes, record) = put(&files, "abc.bin", 40_000, 13).await;
    let order = order_of("abc.bin", 3);
    let (a, b, c) = (&order[0], &order[1], &order[2]);
    assert_eq!(record.nodes, [a.clone(), b.clone()]);
    let grace = Duration::from_secs(30);
    let mut planner_of: HashMap<String, RepairPlanner> = order
        .iter()
        .map(|n| (n.clone(), RepairPlanner::for_node(grace, n)))
        .collect();
    // A is cut off from etcd (its lease lapses); its store keeps the file.
    leave(&mut regs, &files, a, 2).await;
    let t0 = Instant::now();
    for t in [t0, t0 + grace] {
        for node in [b, c] {
            let planner = planner_of.get_mut(node).unwrap();
            files
                .repair(planner, t, store_of(&files, node))
                .await
                .unwrap();
        }
    }
    let now = files
        .catalog()
        .get("abc.bin")
        .await
        .unwrap()
        .unwrap()
        .record;
    assert_eq!(now.nodes, [c.clone(), b.clone()], "C became the replica");
    // A returns, still holding the file; then B dies.
    regs.insert(a.clone(), register(&etcd, a, node_addr(a), "files").await);
    listing(&files, 3).await;
    leave(&mut regs, &files, b, 2).await;
    files.transfer().dead.borrow_mut().insert(node_addr(b));
    let moved = files.transfer().moved.borrow().len();
    let t1 = t0 + grace * 2;
    let mut made = Vec::new();
    for t in [t1, t1 + grace, t1 + grace * 2] {
        for node in [a, c] {
            let planner = planner_of.get_mut(node).unwrap();
            let report = files
                .repair(planner, t, store_of(&files, node))
                .await
                .unwrap();
            assert!(report.failed.is_empty(), "{node}: {report:?}");
            made.extend(report.done);
        }
    }
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(made[0].to, *a);
    let now = files
        .catalog()
        .get("abc.bin")
        .await
        .unwrap()
        .unwrap()
        .record;
    assert_eq!(now.nodes, [c.clone(), a.clone()], "back to R = 2, with A");
    assert_eq!(
        files.transfer().moved.borrow().len(),
        moved,
        "no copy needed"
    );
    // C dies: the file is still read, from A.
    leave(&mut regs, &files, c, 1).await;
    files.transfer().dead.borrow_mut().insert(node_addr(c));
    let out = tempfile::tempdir().unwrap();
    let fetched = files.get("abc.bin", out.path()).await.unwrap();
    assert_eq!(fetched.node, *a);
    assert_eq!(std::fs::read(&fetched.path).unwrap(), bytes);
}

#[tokio::test]
async fn a_copy_from_a_source_with_other_bytes_backs_off_and_moves_nothing() {
    let Some(etcd) = Etcd::start() else { return };
    let (nodes, files) = cluster(&etcd).await;
    let mut regs = by_node(nodes);
    let (bytes, _) = put(&files, "bad.bin", 10_000, 14).await;
    let order = order_of("bad.bin", 3);
    // The only source left holds other bytes (the same length, or a record that no
    // replica matches: the same to the repair).
    let mut other = bytes.clone();
    other[0] ^= 1;
    std::fs::write(files.transfer().store(&order[1]).join("bad.bin"), &other).unwrap();
    leave(&mut regs, &files, &order[0], 2).await;
    let grace = Duration::from_secs(30);
    let mut planner = RepairPlanner::for_node(grace, &order[2]);
    let staging = store_of(&files, &order[2]);
    let t0 = Instant::now();
    assert!(files
        .repair(&mut planner, t0, staging)
        .await
        .unwrap()
        .failed
        .is_empty());
    let moved = files.transfer().moved.borrow().len();
    let s = Duration::from_secs;
    let mut at = t0 + grace;
    for wait in [5, 10, 20, 40] {
        let report = files.repair(&mut planner, at, staging).await.unwrap();
        assert_eq!(report.failed.len(), 1, "tried at {:?}: {report:?}", at - t0);
        let why = &report.failed[0].1;
        assert!(why.contains("holds other bytes"), "{why}");
        assert!(why.contains(&format!("next attempt in {wait} s")), "{why}");
        let early = files
            .repair(&mut planner, at + s(wait) - s(1), staging)
            .await
            .unwrap();
        assert!(
            early.failed.is_empty() && early.done.is_empty(),
            "{early:?}"
        );
        at += s(wait);
    }
    assert_eq!(
        files.transfer().moved.borrow().len(),
        moved,
        "no byte moved"
    );
    assert!(
        files.transfer().fetch_limits.borrow().is_empty(),
        "no fetch"
    );
    assert!(!files.transfer().store(&order[2]).join("bad.bin").exists());
}

#[tokio::test]
async fn a_fetch_is_bounded_by_the_records_size_and_refused_before_its_bytes_move() {
    let Some(etcd) = Etcd::start() else { return };
    let (_nodes, files) = cluster(&etcd).await;
    let (bytes, record) = put(&files, "o.bin", 1000, 15).await;
    // The record's first replica now holds a much larger file under the name.
    let big = vec![0u8; 4 << 20];
    std::fs::write(files.transfer().store(&record.nodes[0]).join("o.bin"), &big).unwrap();
    let moved = files.transfer().moved.borrow().len();
    let out = tempfile::tempdir().unwrap();
    let fetched = files.get("o.bin", out.path()).await.unwrap();
    assert_eq!(fetched.node, record.nodes[1]);
    assert_eq!(std::fs::read(&fetched.path).unwrap(), bytes);
    assert_eq!(fetched.failed[0].0, record.nodes[0]);
    assert!(
        fetched.failed[0]
            .1
            .contains("larger than the 1000 bytes allowed"),
        "{:?}",
        fetched.failed
    );
    assert!(files
        .transfer()
        .fetch_limits
        .borrow()
        .iter()
        .all(|l| *l == 1000));
    let moved: Vec<(SocketAddr, u64)> = files.transfer().moved.borrow()[moved..].to_vec();
    assert_eq!(
        moved,
        [(node_addr(&record.nodes[1]), 1000)],
        "only the good replica moved"
    );
}

#[tokio::test]
async fn a_get_falls_back_on_live_nodes_outside_the_record_each_checked() {
    let Some(etcd) = Etcd::start() else { return };
    let (_nodes, files) = cluster_of(&etcd, 4).await;
    let (bytes, record) = put(&files, "g.bin", 5000, 16).await;
    let order = order_of("g.bin", 4);
    assert_eq!(record.nodes, order[..2]);
    // Both recorded replicas are down (still listed); the next node in order holds
    // other bytes under the name, the one after it the file.
    for node in &order[..2] {
        files.transfer().dead.borrow_mut().insert(node_addr(node));
    }
    std::fs::write(files.transfer().store(&order[2]).join("g.bin"), b"junk").unwrap();
    std::fs::write(files.transfer().store(&order[3]).join("g.bin"), &bytes).unwrap();
    let moved = files.transfer().moved.borrow().len();
    let out = tempfile::tempdir().unwrap();
    let fetched = files.get("g.bin", out.path()).await.unwrap();
    assert_eq!(fetched.node, order[3]);
    assert_eq!(std::fs::read(&fetched.path).unwrap(), bytes);
    let tried: Vec<&str> = fetched.failed.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(tried, [&order[0], &order[1], &order[2]]);
    assert!(
        fetched.failed[2].1.contains("holds other bytes"),
        "{:?}",
        fetched.failed
    );
    let moved: Vec<(SocketAddr, u64)> = files.transfer().moved.borrow()[moved..].to_vec();
    assert_eq!(
        moved,
        [(node_addr(&order[3]), 5000)],
        "the junk was never fetched"
    );
    // Nowhere to be found: the error names every node tried.
    std::fs::remove_file(files.transfer().store(&order[3]).join("g.bin")).unwrap();
    let out = tempfile::tempdir().unwrap();
    let err = files
        .get("g.bin", out.path())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("node {}: no such file", order[3])),
        "{err}"
    );
}

#[tokio::test]
async fn a_server_further_down_waits_for_the_one_before_it_without_queueing_on_the_lock() {
    let Some(etcd) = Etcd::start() else { return };
    let (nodes, files) = cluster_of(&etcd, 4).await;
    let mut regs = by_node(nodes);
    let (bytes, _) = put(&files, "w.bin", 8000, 17).await;
    let order = order_of("w.bin", 4);
    leave(&mut regs, &files, &order[0], 3).await;
    let grace = Duration::from_secs(30);
    let t0 = Instant::now();
    let (first, second) = (&order[2], &order[3]);
    let mut planners: HashMap<&String, RepairPlanner> = [first, second]
        .into_iter()
        .map(|n| (n, RepairPlanner::for_node(grace, n)))
        .collect();
    for (node, planner) in &mut planners {
        files
            .repair(planner, t0, store_of(&files, node))
            .await
            .unwrap();
    }
    // The first in line is copying (it holds the lock); the second asks it, learns
    // that it holds nothing yet, and waits: it never queues on the lock.
    let held = files
        .catalog()
        .lock("w.bin", Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    let report = files
        .repair(
            planners.get_mut(second).unwrap(),
            t0 + grace,
            store_of(&files, second),
        )
        .await
        .unwrap();
    assert_eq!(report.failed.len(), 1, "{report:?}");
    let why = &report.failed[0].1;
    assert!(
        why.contains(&format!("node {first}, before this one")),
        "{why}"
    );
    assert!(why.contains("next attempt in 5 s"), "{why}");
    files.catalog().release(held).await;
    let report = files
        .repair(
            planners.get_mut(first).unwrap(),
            t0 + grace,
            store_of(&files, first),
        )
        .await
        .unwrap();
    assert_eq!(report.done.len(), 1, "{report:?}");
    assert_eq!(
        std::fs::read(files.transfer().store(first).join("w.bin")).unwrap(),
        bytes
    );
    // Past its wait, the second finds nothing to do.
    let report = files
        .repair(
            planners.get_mut(second).unwrap(),
            t0 + grace * 2,
            store_of(&files, second),
        )
        .await
        .unwrap();
    assert!(
        report.done.is_empty() && report.failed.is_empty(),
        "{report:?}"
    );
    assert!(!files.transfer().store(second).join("w.bin").exists());
}

#[tokio::test]
async fn a_scrub_finds_listed_replicas_lost_or_changed_and_repair_replaces_them() {
    let Some(etcd) = Etcd::start() else { return };
    let (_nodes, files) = cluster(&etcd).await;
    let (bytes, _) = put(&files, "s.bin", 12_000, 18).await;
    let order = order_of("s.bin", 3);
    let every = Duration::from_secs(60);
    let scrubbing =
        |node: &str| RepairPlanner::for_node(Duration::from_secs(30), node).with_scrub(every, 8);
    // The first replica's copy is removed by hand: no node left the registry.
    std::fs::remove_file(files.transfer().store(&order[0]).join("s.bin")).unwrap();
    let mut third = scrubbing(&order[2]);
    let t0 = Instant::now();
    let found = files.scrub(&mut third, t0).await.unwrap();
    assert_eq!(found.asked, 2);
    assert_eq!(found.lost.len(), 1, "{found:?}");
    assert_eq!(
        (found.lost[0].1.as_str(), found.lost[0].2.as_str()),
        (order[0].as_str(), "no such file")
    );
    let report = files
        .repair(&mut third, t0, store_of(&files, &order[2]))
        .await
        .unwrap();
    assert_eq!(report.done.len(), 1, "{report:?}");
    let now = files.catalog().get("s.bin").await.unwrap().unwrap().record;
    assert_eq!(now.nodes, [order[2].clone(), order[1].clone()]);
    assert_eq!(
        std::fs::read(files.transfer().store(&order[2]).join("s.bin")).unwrap(),
        bytes
    );
    // Then the second's copy changes under the name: the node a repair would go to now
    // (the first, whose copy is gone) finds it and takes its place.
    std::fs::write(files.transfer().store(&order[1]).join("s.bin"), b"changed").unwrap();
    let mut first = scrubbing(&order[0]);
    let found = files.scrub(&mut first, t0).await.unwrap();
    assert_eq!(found.lost.len(), 1, "{found:?}");
    assert!(found.lost[0].2.contains("holds other bytes"), "{found:?}");
    let report = files
        .repair(&mut first, t0, store_of(&files, &order[0]))
        .await
        .unwrap();
    assert_eq!(report.done.len(), 1, "{report:?}");
    let now = files.catalog().get("s.bin").await.unwrap().unwrap().record;
    assert_eq!(now.nodes, [order[2].clone(), order[0].clone()]);
    assert_eq!(
        std::fs::read(files.transfer().store(&order[0]).join("s.bin")).unwrap(),
        bytes
    );
    // Within the period nothing is asked again; every replica answers well after it.
    assert_eq!(files.scrub(&mut first, t0).await.unwrap().asked, 0);
    let mut second = scrubbing(&order[1]);
    let found = files.scrub(&mut second, t0 + every).await.unwrap();
    assert_eq!((found.asked, found.lost.len()), (2, 0), "{found:?}");
}

/// A record that names one node while R = 2 (an upload that verified one replica: its
/// server recorded the copy before its GOOD, the second failed, the client heard an
/// error): once it has been short for the grace period, the next node in order copies
/// the file onto itself and is added to the record. Before, such a record stayed at one
/// replica for good, since no node in it was gone (issue 47, item 5: the nemesis's
/// squatter makes one with an upload straight to one server).
#[tokio::test]
async fn a_record_short_of_r_with_every_node_listed_gets_a_copy_added() {
    let Some(etcd) = Etcd::start() else { return };
    let (_nodes, files) = cluster(&etcd).await;
    let order = order_of("one.bin", 3);
    let work = tempfile::tempdir().unwrap();
    let (path, bytes) = local(work.path(), "one.bin", 20_000, 3);
    std::fs::copy(&path, files.transfer().store(&order[0]).join("one.bin")).unwrap();
    let v = verify(&bytes);
    let record = FileRecord {
        alg: v.alg,
        digest: v.digest,
        size: v.size,
        nodes: vec![order[0].clone()],
        owner: None,
    };
    assert!(matches!(
        files.catalog().create("one.bin", &record).await.unwrap(),
        Created::New
    ));
    let grace = Duration::from_secs(30);
    let t0 = Instant::now();
    // The node the copy goes to, and one further down that must leave it to that one.
    let mut next = RepairPlanner::for_node(grace, &order[1]);
    let mut last = RepairPlanner::for_node(grace, &order[2]);
    for (planner, node) in [(&mut next, &order[1]), (&mut last, &order[2])] {
        let report = files
            .repair(planner, t0, store_of(&files, node))
            .await
            .unwrap();
        assert!(
            report.done.is_empty(),
            "within the grace period: {report:?}"
        );
    }
    let report = files
        .repair(&mut next, t0 + grace, store_of(&files, &order[1]))
        .await
        .unwrap();
    assert!(report.failed.is_empty(), "{report:?}");
    assert_eq!(report.done.len(), 1, "{report:?}");
    assert_eq!(report.done[0].gone, None);
    let now = files
        .catalog()
        .get("one.bin")
        .await
        .unwrap()
        .unwrap()
        .record;
    assert_eq!(now.nodes, order[..2]);
    assert_eq!(
        std::fs::read(files.transfer().store(&order[1]).join("one.bin")).unwrap(),
        bytes
    );
    // At R it rests: neither node copies again.
    rests(&files, &mut next, &order[1], t0 + grace * 3).await;
    rests(&files, &mut last, &order[2], t0 + grace * 3).await;
}

/// `node`'s repair round at `at` has nothing to do.
async fn rests(files: &ClusterFiles<Fake>, planner: &mut RepairPlanner, node: &str, at: Instant) {
    let report = files
        .repair(planner, at, store_of(files, node))
        .await
        .unwrap();
    assert!(
        report.done.is_empty() && report.failed.is_empty(),
        "{node}: {report:?}"
    );
}

/// The first name `name{i}.bin` whose first two nodes in order `include` node `node`
/// (or leave it out).
fn name_placed(node: &str, include: bool) -> String {
    (0..)
        .map(|i| format!("name{i}.bin"))
        .find(|name| order_of(name, 3)[..2].contains(&node.to_string()) == include)
        .unwrap()
}

/// The names `node`'s clean-up round at `at` removed from `store`, sorted; a name it
/// failed to remove fails the test.
async fn cleaned(
    files: &ClusterFiles<Fake>,
    collector: &mut Collector,
    at: Instant,
    node: &str,
    store: &Path,
) -> Vec<String> {
    let report = files.clean_up(collector, at, node, store).await.unwrap();
    assert!(report.failed.is_empty(), "{report:?}");
    let mut removed = report.removed;
    removed.sort();
    removed
}

#[tokio::test]
async fn a_servers_clean_up_removes_what_no_record_lists_there_after_the_grace_period() {
    let Some(etcd) = Etcd::start() else { return };
    let (_nodes, files) = cluster(&etcd).await;
    let node = NODES[2];
    let store = files.transfer().store(node).to_owned();
    // Its own replica, kept.
    let mine = name_placed(node, true);
    put(&files, &mine, 3000, 19).await;
    // An extra replica of a file recorded elsewhere: kept while the record is short of
    // R live nodes (a repair may record it), removed once it is not.
    let extra = name_placed(node, false);
    let (bytes, _) = put(&files, &extra, 3000, 20).await;
    std::fs::write(store.join(&extra), &bytes).unwrap();
    // Other bytes under a name recorded elsewhere, and a name no record has: removed.
    let squat = (0..)
        .map(|i| format!("squat{i}.bin"))
        .find(|name| !order_of(name, 3)[..2].contains(&node.to_string()))
        .unwrap();
    put(&files, &squat, 3000, 21).await;
    std::fs::write(store.join(&squat), b"other bytes").unwrap();
    std::fs::write(store.join("orphan.bin"), b"left by a failed put").unwrap();
    // The service's temporary file, never touched.
    std::fs::write(store.join(".orphan.bin.rdmactor-tmp-1"), b"partial").unwrap();
    let grace = Duration::from_secs(600);
    // R = 3: the extra replica's record (two nodes) is short, so its copy here stays.
    let mut collector = Collector::new(node, grace, Duration::from_secs(60)).with_replicas(3);
    let t0 = Instant::now();
    assert!(cleaned(&files, &mut collector, t0, node, &store)
        .await
        .is_empty());
    let mut want = vec!["orphan.bin".to_string(), squat.clone()];
    want.sort();
    assert_eq!(
        cleaned(&files, &mut collector, t0 + grace, node, &store).await,
        want
    );
    let mut left: Vec<String> = std::fs::read_dir(&store)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    let mut kept = vec![
        mine.clone(),
        extra.clone(),
        ".orphan.bin.rdmactor-tmp-1".to_string(),
    ];
    kept.sort();
    assert_eq!(left, kept);
    // R = 2: the record names two live nodes, so the extra copy goes after the grace,
    // but only while both answer that they hold its bytes: with one listed copy lost
    // unseen (a wiped store), the copy here is kept.
    let listed = order_of(&extra, 3)[0].clone();
    let listed_copy = files.transfer().store(&listed).join(&extra);
    std::fs::rename(&listed_copy, store.join(".aside")).unwrap();
    let mut collector = Collector::new(node, grace, Duration::from_secs(60));
    let t1 = t0 + grace * 2;
    for at in [t1, t1 + grace] {
        assert!(cleaned(&files, &mut collector, at, node, &store)
            .await
            .is_empty());
    }
    assert!(store.join(&extra).exists());
    std::fs::rename(store.join(".aside"), &listed_copy).unwrap();
    let t2 = t1 + grace * 2;
    assert!(cleaned(&files, &mut collector, t2, node, &store)
        .await
        .is_empty());
    assert_eq!(
        cleaned(&files, &mut collector, t2 + grace, node, &store).await,
        [extra.as_str()]
    );
    assert!(!store.join(&extra).exists() && store.join(&mine).exists());
}

/// A record that names every live node and one gone past the grace period (a server
/// recorded its copy before its GOOD and died before the GOOD arrived, and the client
/// placed the file on the next node too): no copy can replace it, so the record's first
/// live node takes it off, and the file stays whole on the others.
#[tokio::test]
async fn a_gone_node_is_taken_off_a_record_that_every_live_node_holds() {
    let Some(etcd) = Etcd::start() else { return };
    let (nodes, files) = cluster(&etcd).await;
    let mut regs = by_node(nodes);
    let (bytes, record) = put(&files, "f", 3000, 7).await;
    // The third node records a copy of its own, as a server's recorder does.
    let third = ids()
        .into_iter()
        .find(|n| !record.nodes.contains(n))
        .unwrap();
    let mut copy = record.clone();
    copy.nodes.clear();
    files.catalog().add_copy("f", &copy, &third).await.unwrap();
    std::fs::write(files.transfer().store(&third).join("f"), &bytes).unwrap();
    let gone = record.nodes[0].clone();
    leave(&mut regs, &files, &gone, 2).await;
    let stored = files.catalog().get("f").await.unwrap().unwrap().record;
    let first_live = stored.nodes.iter().find(|n| **n != gone).unwrap().clone();
    let other = ids()
        .into_iter()
        .find(|n| *n != gone && *n != first_live)
        .unwrap();
    let grace = Duration::from_secs(5);
    let t0 = Instant::now();
    let mut mine = RepairPlanner::for_node(grace, &first_live);
    let mut theirs = RepairPlanner::for_node(grace, &other);
    for (planner, node) in [(&mut mine, &first_live), (&mut theirs, &other)] {
        let report = files
            .repair(planner, t0, store_of(&files, node))
            .await
            .unwrap();
        assert!(
            report.forgotten.is_empty() && report.done.is_empty(),
            "{report:?}"
        );
    }
    let report = files
        .repair(&mut theirs, t0 + grace, store_of(&files, &other))
        .await
        .unwrap();
    assert!(
        report.forgotten.is_empty(),
        "only the first live node: {report:?}"
    );
    let report = files
        .repair(&mut mine, t0 + grace, store_of(&files, &first_live))
        .await
        .unwrap();
    assert_eq!(report.forgotten.len(), 1, "{report:?}");
    assert!(report.done.is_empty(), "no copy: {report:?}");
    let now = files.catalog().get("f").await.unwrap().unwrap().record;
    assert!(!now.nodes.contains(&gone), "{now:?}");
    assert_eq!(now.nodes.len(), 2, "{now:?}");
    let out = tempfile::tempdir().unwrap();
    let fetched = files.get("f", out.path()).await.unwrap();
    assert!(std::fs::read(fetched.path).unwrap() == bytes);
}

/// Issues 46/47: a repaired copy is its file's owner's, as the replica it replaces
/// was. The copy is fetched into the repairing server's store (`store`) or uploaded
/// through a scratch directory (`ft repair`), each as a copy for the record's owner;
/// the scratch copy itself is for no one.
async fn a_repaired_copy_is_stored_for_its_records_owner(store: bool) {
    let Some(etcd) = Etcd::start() else { return };
    let (nodes, files) = cluster(&etcd).await;
    let mut regs = by_node(nodes);
    let order = order_of("o.bin", 3);
    let bytes = rdmactor_testkit::pattern(25_000, 4);
    alices(&files, "o.bin", &bytes, &order[..2]).await;
    leave(&mut regs, &files, &order[0], 2).await;
    let grace = Duration::from_secs(30);
    let scratch = tempfile::tempdir().unwrap();
    let (mut planner, staging) = repairer(&files, &order[2], grace, store, scratch.path());
    let t0 = Instant::now();
    files.repair(&mut planner, t0, staging).await.unwrap();
    let report = files
        .repair(&mut planner, t0 + grace, staging)
        .await
        .unwrap();
    assert_eq!(report.done.len(), 1, "{report:?}");
    let copy = files.transfer().store(&order[2]).join("o.bin");
    assert_eq!(std::fs::read(&copy).unwrap(), bytes);
    let stored_for = files.transfer().stored_for.borrow().clone();
    assert!(
        stored_for.contains(&(copy, Some("alice".into()))),
        "{stored_for:?}"
    );
    let now = files.catalog().get("o.bin").await.unwrap().unwrap().record;
    assert_eq!(now.owner.as_deref(), Some("alice"));
}

#[tokio::test]
async fn a_servers_repair_fetches_its_copy_for_the_records_owner() {
    a_repaired_copy_is_stored_for_its_records_owner(true).await;
}

#[tokio::test]
async fn a_repair_through_scratch_uploads_its_copy_for_the_records_owner() {
    a_repaired_copy_is_stored_for_its_records_owner(false).await;
}

/// Issue 47: owners delete cluster files. Every live replica's server is asked; the
/// record goes with the first copy (here the client removes it, as the fakes record
/// nothing); a node that is away keeps its copy, named by no record.
#[tokio::test]
async fn a_delete_removes_every_reachable_copy_and_the_record() {
    let Some(etcd) = Etcd::start() else { return };
    let (nodes, files) = cluster(&etcd).await;
    let mut regs = by_node(nodes);
    let (_, record) = put(&files, "d.bin", 5_000, 3).await;
    let (_, other) = put(&files, "e.bin", 5_000, 4).await;
    let deleted = files.delete("d.bin").await.unwrap();
    assert_eq!(deleted.removed, record.nodes);
    assert!(deleted.left.is_empty(), "{deleted:?}");
    for node in &record.nodes {
        assert!(!files.transfer().store(node).join("d.bin").exists());
    }
    assert!(files.catalog().get("d.bin").await.unwrap().is_none());
    let again = files.delete("d.bin").await.unwrap_err();
    assert!(matches!(again, FilesError::NotFound { .. }), "{again}");
    // One replica's node is away: its copy stays, and the record goes anyway.
    let away = other.nodes[0].clone();
    leave(&mut regs, &files, &away, 2).await;
    let deleted = files.delete("e.bin").await.unwrap();
    assert_eq!(deleted.removed, other.nodes[1..]);
    assert_eq!(deleted.left.len(), 1, "{deleted:?}");
    assert_eq!(deleted.left[0].0, away);
    assert!(files.transfer().store(&away).join("e.bin").exists());
    assert!(files.catalog().get("e.bin").await.unwrap().is_none());
}

/// The catalog's side of a delete: only the record's owner removes it, fenced by the
/// revision read; a replicator's copy cannot bring a removed record back, and a
/// repair's fenced update after the removal fails.
#[tokio::test]
async fn a_record_is_removed_by_its_owner_alone_and_stays_removed() {
    let Some(etcd) = Etcd::start() else { return };
    let catalog = Catalog::new(etcd.config(), "test").unwrap();
    let record = FileRecord {
        alg: "sha256".into(),
        digest: "d1".into(),
        size: 1,
        nodes: vec!["a".into(), "b".into()],
        owner: Some("alice".into()),
    };
    assert_eq!(catalog.create("f", &record).await.unwrap(), Created::New);
    let read = catalog.get("f").await.unwrap().unwrap();
    let lock = catalog
        .lock("f", Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    for who in [Some("bob"), None] {
        assert_eq!(
            catalog.remove("f", who).await.unwrap(),
            Removed::NotOwner(record.clone())
        );
    }
    assert_eq!(
        catalog.remove("f", Some("alice")).await.unwrap(),
        Removed::Removed
    );
    assert_eq!(
        catalog.remove("f", Some("alice")).await.unwrap(),
        Removed::Absent
    );
    // A copy made for alice by a replicator meanwhile is not recorded ...
    assert_eq!(catalog.add_replica("f", &record, "c").await.unwrap(), None);
    assert!(catalog.get("f").await.unwrap().is_none());
    // ... nor is a repair's update, fenced by the revision it read.
    let mut repaired = record.clone();
    repaired.nodes = vec!["c".into(), "b".into()];
    assert!(!catalog.replace(&read, &repaired, &lock).await.unwrap());
    assert!(catalog.get("f").await.unwrap().is_none());
    catalog.release(lock).await;
    // An upload of the name starts it again.
    assert_eq!(
        catalog.add_copy("f", &record, "c").await.unwrap(),
        AddedCopy::New
    );
}

/// Issue 47: owners overwrite cluster files. The record moves to the new bytes, still
/// the owner's, on the nodes that took them (the fakes record nothing, so the client
/// writes the version, by the rule a server's recorder follows).
#[tokio::test]
async fn an_owners_overwrite_moves_the_record_to_the_new_bytes() {
    let Some(etcd) = Etcd::start() else { return };
    let (_nodes, files) = cluster(&etcd).await;
    let order = order_of("v.bin", 3);
    let old = rdmactor_testkit::pattern(8_000, 1);
    alices(&files, "v.bin", &old, &order[..2]).await;
    let work = tempfile::tempdir().unwrap();
    let (path, new) = local(work.path(), "v.bin", 12_000, 2);
    let now = files.overwrite(&path, "v.bin").await.unwrap();
    assert_eq!(now.digest, verify(&new).digest);
    assert_eq!(now.nodes, order[..2]);
    assert_eq!(now.owner.as_deref(), Some("alice"));
    for node in &order[..2] {
        assert_eq!(
            std::fs::read(files.transfer().store(node).join("v.bin")).unwrap(),
            new
        );
    }
    // A plain put of the name is still refused.
    assert!(matches!(
        files.put(&path, "v.bin").await.unwrap_err(),
        FilesError::NameTaken { .. }
    ));
}

/// The catalog's rule for an overwrite: the owner's new bytes replace the record (on
/// the first node to store them; each other node adds itself), another owner's or
/// nobody's are refused.
#[tokio::test]
async fn only_the_records_owner_moves_it_to_new_bytes() {
    let Some(etcd) = Etcd::start() else { return };
    let catalog = Catalog::new(etcd.config(), "test").unwrap();
    let record = |digest: &str, owner: Option<&str>| FileRecord {
        alg: "sha256".into(),
        digest: digest.into(),
        size: 1,
        nodes: vec!["a".into(), "b".into()],
        owner: owner.map(str::to_owned),
    };
    catalog
        .create("f", &record("d1", Some("alice")))
        .await
        .unwrap();
    catalog.create("g", &record("d1", None)).await.unwrap();
    let theirs = record("d2", Some("bob"));
    assert!(matches!(
        catalog.add_version("f", &theirs, "a").await.unwrap(),
        AddedCopy::Taken(_)
    ));
    for who in [Some("alice"), None] {
        assert!(matches!(
            catalog
                .add_version("g", &record("d2", who), "a")
                .await
                .unwrap(),
            AddedCopy::Taken(_)
        ));
    }
    let mine = record("d2", Some("alice"));
    assert_eq!(
        catalog.add_version("f", &mine, "b").await.unwrap(),
        AddedCopy::Replaced
    );
    let now = catalog.get("f").await.unwrap().unwrap().record;
    assert_eq!(
        (now.digest.as_str(), now.nodes.clone()),
        ("d2", vec!["b".to_owned()])
    );
    assert_eq!(
        catalog.add_version("f", &mine, "a").await.unwrap(),
        AddedCopy::Added
    );
    // Plain uploads of other bytes are still taken.
    assert!(matches!(
        catalog
            .add_copy("f", &record("d3", Some("alice")), "c")
            .await
            .unwrap(),
        AddedCopy::Taken(_)
    ));
    let now = catalog.get("f").await.unwrap().unwrap().record;
    assert_eq!(now.nodes, ["b", "a"]);
    assert_eq!(now.owner.as_deref(), Some("alice"));
}

/// `bytes` stored as `name` on `nodes` and recorded there as alice's (as her upload
/// through servers that record their copies leaves them).
async fn alices(files: &ClusterFiles<Fake>, name: &str, bytes: &[u8], nodes: &[String]) {
    let held = verify(bytes);
    let record = FileRecord {
        alg: held.alg,
        digest: held.digest,
        size: held.size,
        nodes: nodes.to_vec(),
        owner: Some("alice".into()),
    };
    files.catalog().create(name, &record).await.unwrap();
    for node in nodes {
        std::fs::write(files.transfer().store(node).join(name), bytes).unwrap();
    }
}

/// Who repairs: the server of `node` onto its own store (`store`), or a tool
/// (`ft repair`) through a scratch directory at `scratch`.
fn repairer<'a>(
    files: &'a ClusterFiles<Fake>,
    node: &'a str,
    grace: Duration,
    store: bool,
    scratch: &'a Path,
) -> (RepairPlanner, Staging<'a>) {
    if store {
        (RepairPlanner::for_node(grace, node), store_of(files, node))
    } else {
        (RepairPlanner::new(grace), Staging::Through(scratch))
    }
}
