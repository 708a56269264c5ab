//! The driver: carries out [`UploadPlan`], [`fetch_order`] and [`RepairPlanner`]'s
//! decisions with a [`FileTransfer`] and the [`Catalog`]. It decides nothing itself.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::catalog::{Catalog, Created};
use super::plan::{fetch_order, PlacementError, Repair, RepairPlanner, UploadPlan, Verified};
use super::FileRecord;
use crate::etcd::EtcdConfig;
use crate::membership::Membership;
use crate::{Error, NodeInfo};

/// The service whose nodes hold files.
pub const FILES_SERVICE: &str = "files";

/// Moves one file to or from one node, verified by its server: the `files` service
/// over RDMA ([`RdmaFiles`](super::RdmaFiles)), or a test's fake.
pub trait FileTransfer {
    /// Uploads the local file `path` as `name` to the node at `addr`; returns what the
    /// node verified (it answered GOOD), or why not.
    fn upload(
        &self,
        addr: SocketAddr,
        path: &Path,
        name: &str,
    ) -> impl Future<Output = Result<Verified, String>>;
    /// Fetches `name` from the node at `addr` into `dir/name`; returns what was
    /// verified on arrival, or why not (then no file is left).
    fn fetch(
        &self,
        addr: SocketAddr,
        name: &str,
        dir: &Path,
    ) -> impl Future<Output = Result<Verified, String>>;
}

/// Why a cluster file operation failed; each names the file, and the nodes and reasons.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FilesError {
    /// etcd could not be read or written.
    #[error(transparent)]
    Registry(#[from] Error),
    /// No node of the `files` service is listed.
    #[error("cluster {cluster:?}: no live node serves \"files\"")]
    NoNodes {
        /// The cluster.
        cluster: String,
    },
    /// The replicas could not be placed.
    #[error(transparent)]
    Placement(#[from] PlacementError),
    /// The name is taken by other bytes (created once, by whoever recorded it first).
    #[error("{name}: the name is taken by a file of {} bytes, {} {} on {}", existing.size, existing.alg, existing.digest, existing.nodes.join(", "))]
    NameTaken {
        /// The file.
        name: String,
        /// What the catalog holds.
        existing: FileRecord,
    },
    /// The catalog has no such file.
    #[error("{name}: no such file in cluster {cluster:?}")]
    NotFound {
        /// The file.
        name: String,
        /// The cluster.
        cluster: String,
    },
    /// No replica could be fetched with the recorded digest.
    #[error("{name}: no replica could be fetched: {}", attempts.iter().map(|(n, r)| format!("node {n}: {r}")).collect::<Vec<_>>().join("; "))]
    FetchFailed {
        /// The file.
        name: String,
        /// Each node tried, and why it failed.
        attempts: Vec<(String, String)>,
    },
}

/// A fetched file.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// Where it is now.
    pub path: PathBuf,
    /// The node it came from.
    pub node: String,
    /// Its record (the digest it was checked against).
    pub record: FileRecord,
    /// Replicas tried before, and why they failed.
    pub failed: Vec<(String, String)>,
}

/// What one repair round did.
#[derive(Debug, Default)]
pub struct RepairReport {
    /// Copies made and recorded.
    pub done: Vec<Repair>,
    /// Copies due but not made, and why (lock held elsewhere, source failed, record
    /// changed meanwhile, ...).
    pub failed: Vec<(Repair, String)>,
}

/// Files replicated over the nodes of a cluster's `files` service.
#[derive(Debug)]
pub struct ClusterFiles<T> {
    transfer: T,
    cluster: String,
    catalog: Catalog,
    members: Membership,
    replicas: usize,
    discovery_wait: Duration,
    lock_ttl: Duration,
    scratch: AtomicU64,
}

impl<T: FileTransfer> ClusterFiles<T> {
    /// Files of `cluster`, moved by `transfer`: R = 2, waiting up to 5 s for the
    /// registry's first answer. Starts watching the registry: call inside a tokio
    /// runtime.
    ///
    /// # Errors
    ///
    /// A bad cluster name; no endpoint.
    pub fn new(transfer: T, etcd: EtcdConfig, cluster: &str) -> Result<Self, Error> {
        Ok(ClusterFiles {
            catalog: Catalog::new(etcd.clone(), cluster)?,
            members: Membership::watch(etcd, cluster, FILES_SERVICE)?,
            transfer,
            cluster: cluster.to_owned(),
            replicas: 2,
            discovery_wait: Duration::from_secs(5),
            lock_ttl: Duration::from_secs(10),
            scratch: AtomicU64::new(0),
        })
    }

    /// Replicas per file (default 2; at least 1).
    pub fn with_replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas.max(1);
        self
    }

    /// The catalog.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// The watch of the `files` nodes.
    pub fn membership(&self) -> &Membership {
        &self.members
    }

    /// The transfer.
    pub fn transfer(&self) -> &T {
        &self.transfer
    }

    async fn live(&self) -> Vec<NodeInfo> {
        self.members
            .wait_for(self.discovery_wait, |n| {
                n.iter().any(|n| !n.record.draining)
            })
            .await;
        self.members.live()
    }

    /// Uploads `path` as `name` to R nodes and records it.
    ///
    /// # Errors
    ///
    /// [`FilesError::NameTaken`] (before uploading, or after if another client won the
    /// race with other bytes), [`FilesError::Placement`] naming each failed node,
    /// [`FilesError::NoNodes`], [`FilesError::Registry`].
    pub async fn put(&self, path: &Path, name: &str) -> Result<FileRecord, FilesError> {
        if let Some(existing) = self.catalog.get(name).await? {
            return Err(FilesError::NameTaken {
                name: name.to_owned(),
                existing: existing.record,
            });
        }
        let live = self.live().await;
        if live.is_empty() {
            return Err(FilesError::NoNodes {
                cluster: self.cluster.clone(),
            });
        }
        let ids: Vec<String> = live.iter().map(|n| n.node.clone()).collect();
        let mut plan = UploadPlan::new(name, &ids, self.replicas);
        while let Some(node) = plan.poll_target() {
            let addr = live
                .iter()
                .find(|n| n.node == node)
                .expect("planned from the list")
                .record
                .addr;
            match self.transfer.upload(addr, path, name).await {
                Ok(verified) => plan.handle_good(node, verified),
                Err(reason) => {
                    tracing::info!(%name, %node, %reason, "cluster files: upload failed; trying the next node");
                    plan.handle_failed(node, reason);
                }
            }
        }
        let record = plan.outcome().expect("no node left to try")?;
        // Servers record their own copies before they answer GOOD (`CatalogRecorder`),
        // so by now the record names every node that verified the file, and a client
        // needs no write access to the catalog.
        match self.catalog.get(name).await? {
            Some(stored) if stored.record.same_bytes(&record) => return Ok(stored.record),
            Some(stored) => {
                return Err(FilesError::NameTaken {
                    name: name.to_owned(),
                    existing: stored.record,
                })
            }
            None => {}
        }
        // Servers that record nothing (a test's transfer, a server started without
        // --cluster) leave it to the client, where etcd lets it write.
        match self.catalog.create(name, &record).await? {
            Created::New => Ok(record),
            Created::Exists(existing) if existing.same_bytes(&record) => Ok(existing),
            Created::Exists(existing) => Err(FilesError::NameTaken {
                name: name.to_owned(),
                existing,
            }),
        }
    }

    /// Fetches `name` into `dir/name` from a replica, checked against the recorded
    /// digest.
    ///
    /// # Errors
    ///
    /// [`FilesError::NotFound`], [`FilesError::FetchFailed`] naming each replica and
    /// why, [`FilesError::Registry`].
    pub async fn get(&self, name: &str, dir: &Path) -> Result<Fetched, FilesError> {
        let Some(stored) = self.catalog.get(name).await? else {
            return Err(FilesError::NotFound {
                name: name.to_owned(),
                cluster: self.cluster.clone(),
            });
        };
        let live = self.live().await;
        let ids: Vec<String> = live.iter().map(|n| n.node.clone()).collect();
        let mut failed = Vec::new();
        for node in fetch_order(&stored.record, &ids) {
            let Some(info) = live.iter().find(|n| n.node == node) else {
                failed.push((node, "not listed in the registry".to_owned()));
                continue;
            };
            match self
                .fetch_checked(info.record.addr, name, dir, &stored.record)
                .await
            {
                Ok(path) => {
                    return Ok(Fetched {
                        path,
                        node,
                        record: stored.record,
                        failed,
                    })
                }
                Err(reason) => failed.push((node, reason)),
            }
        }
        Err(FilesError::FetchFailed {
            name: name.to_owned(),
            attempts: failed,
        })
    }

    /// Fetches and checks against `record`; a file with other bytes is removed.
    async fn fetch_checked(
        &self,
        addr: SocketAddr,
        name: &str,
        dir: &Path,
        record: &FileRecord,
    ) -> Result<PathBuf, String> {
        let verified = self.transfer.fetch(addr, name, dir).await?;
        let path = dir.join(name);
        if verified.digest != record.digest || verified.size != record.size {
            let _ = std::fs::remove_file(&path);
            return Err(format!(
                "holds other bytes: {} bytes, {} {} (the catalog says {} bytes, {})",
                verified.size, verified.alg, verified.digest, record.size, record.digest
            ));
        }
        Ok(path)
    }

    /// One repair round: tells `planner` the live nodes, and carries out the copies it
    /// names, each under its file's lock, staging through `scratch` (a local directory).
    ///
    /// # Errors
    ///
    /// The catalog cannot be listed. A failed copy is reported, not an error.
    pub async fn repair(
        &self,
        planner: &mut RepairPlanner,
        now: Instant,
        scratch: &Path,
    ) -> Result<RepairReport, FilesError> {
        let live = self.members.live();
        planner.handle_live(live.iter().map(|n| n.node.clone()).collect());
        let files: Vec<(String, FileRecord)> = self
            .catalog
            .list()
            .await?
            .into_iter()
            .map(|s| (s.name, s.record))
            .collect();
        let mut report = RepairReport::default();
        for repair in planner.poll_repairs(now, &files) {
            match self.copy(&repair, &live, scratch).await {
                Ok(()) => {
                    tracing::info!(?repair, "cluster files: replica restored");
                    report.done.push(repair);
                }
                Err(why) => {
                    tracing::warn!(?repair, %why, "cluster files: repair not made");
                    report.failed.push((repair, why));
                }
            }
        }
        Ok(report)
    }

    /// One copy under the file's lock, fenced by the record's revision.
    async fn copy(&self, repair: &Repair, live: &[NodeInfo], scratch: &Path) -> Result<(), String> {
        let addr = |node: &str| {
            live.iter()
                .find(|n| n.node == node)
                .map(|n| n.record.addr)
                .ok_or_else(|| format!("node {node} is no longer listed"))
        };
        let (from, to) = (addr(&repair.from)?, addr(&repair.to)?);
        let lock = self
            .catalog
            .lock(&repair.name, self.lock_ttl)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("another repairer holds the file's lock")?;
        let dir = scratch.join(format!(
            "repair-{}-{}",
            std::process::id(),
            self.scratch.fetch_add(1, Ordering::Relaxed)
        ));
        let result = async {
            // Read under the lock: what the fenced update compares against.
            let stored = self
                .catalog
                .get(&repair.name)
                .await
                .map_err(|e| e.to_string())?
                .ok_or("the file was deleted")?;
            if !stored.record.nodes.contains(&repair.gone)
                || stored.record.nodes.contains(&repair.to)
            {
                return Err("the record changed (repaired by another)".to_owned());
            }
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let path = self
                .fetch_checked(from, &repair.name, &dir, &stored.record)
                .await
                .map_err(|e| format!("fetch from node {}: {e}", repair.from))?;
            let verified = self
                .transfer
                .upload(to, &path, &repair.name)
                .await
                .map_err(|e| format!("upload to node {}: {e}", repair.to))?;
            if verified.digest != stored.record.digest {
                return Err(format!("node {} verified {}", repair.to, verified.digest));
            }
            let mut record = stored.record.clone();
            for node in &mut record.nodes {
                if *node == repair.gone {
                    node.clone_from(&repair.to);
                }
            }
            match self.catalog.replace(&stored, &record, &lock).await {
                Ok(true) => Ok(()),
                Ok(false) => {
                    Err("fenced: the record or the lock changed during the copy".to_owned())
                }
                Err(e) => Err(e.to_string()),
            }
        }
        .await;
        let _ = std::fs::remove_dir_all(&dir);
        self.catalog.release(lock).await;
        result
    }
}
