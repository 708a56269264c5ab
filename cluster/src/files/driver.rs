//! The driver: carries out [`UploadPlan`], [`fetch_order`], [`fallback_order`] and
//! [`RepairPlanner`](super::RepairPlanner)'s decisions with a [`FileTransfer`] and the
//! [`Catalog`]. It decides nothing itself (repairs: `driver/repair.rs`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::catalog::{AddedCopy, Catalog, Created};
use super::plan::{fallback_order, fetch_order, PlacementError, Repair, UploadPlan, Verified};
use super::transfer::{FileTransfer, TransferError};
use super::FileRecord;
use crate::etcd::EtcdConfig;
use crate::membership::Membership;
use crate::{Error, NodeInfo};

mod delete;
mod gc;
mod repair;
mod scrub;

pub use delete::Deleted;
pub use gc::CleanupReport;
pub use repair::Staging;
pub use scrub::ScrubReport;

/// The service whose nodes hold files.
pub const FILES_SERVICE: &str = "files";

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
    /// A node's own store could not be read.
    #[error("{}: {reason}", dir.display())]
    Store {
        /// The store.
        dir: PathBuf,
        /// Why.
        reason: String,
    },
    /// No server removed its copy of a file being deleted.
    #[error("{name}: not deleted: {}", attempts.iter().map(|(n, r)| format!("node {n}: {r}")).collect::<Vec<_>>().join("; "))]
    DeleteFailed {
        /// The file.
        name: String,
        /// Each node, and why its copy stayed.
        attempts: Vec<(String, String)>,
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
    /// Copies made and recorded; `to` is the node recorded (a node that held the
    /// recorded bytes already is recorded without a copy).
    pub done: Vec<Repair>,
    /// Copies due but not made, and why (lock held elsewhere, source failed, record
    /// changed meanwhile, ...).
    pub failed: Vec<(Repair, String)>,
    /// Gone nodes taken off records that every live node held already (no copy could
    /// replace them).
    pub forgotten: Vec<super::Forget>,
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
        })
    }

    /// Replicas per file (default 2; at least 1).
    pub fn with_replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas.max(1);
        self
    }

    /// Replicas per file.
    pub fn replicas(&self) -> usize {
        self.replicas
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

    /// Every file's name and record, for a round of repairs, scrubs or clean-up.
    async fn records(&self) -> Result<Vec<(String, FileRecord)>, FilesError> {
        Ok(self
            .catalog
            .list()
            .await?
            .into_iter()
            .map(|s| (s.name, s.record))
            .collect())
    }

    /// The live nodes, told to `planner` too, and every record: what a round of the
    /// planner starts from.
    async fn round(
        &self,
        planner: &mut super::RepairPlanner,
    ) -> Result<(Vec<NodeInfo>, Vec<(String, FileRecord)>), FilesError> {
        let live = self.members.live();
        planner.handle_live(live.iter().map(|n| n.node.clone()).collect());
        Ok((live, self.records().await?))
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
        self.upload_to_r(path, name, None).await
    }

    /// Replaces `name`'s bytes with `path`'s, as its owner: uploads to R nodes asking
    /// each to overwrite, and each server moves the record to the new bytes as its copy
    /// lands (`Catalog::add_version`; only the record's owner may, and a file nobody
    /// owns is never overwritten). Nodes that held the old bytes and took no new copy
    /// drop out of the record; their copies are left for their clean-up. A name with no
    /// record is put as new. Not atomic: until the first new copy is recorded, readers
    /// get the old bytes, and a failure part way leaves the record on whichever bytes
    /// were recorded last, each listed node holding them.
    ///
    /// # Errors
    ///
    /// As [`put`](Self::put); [`FilesError::Placement`] names the nodes that refused
    /// (another's file: "a cluster's file is overwritten by its owner alone").
    pub async fn overwrite(&self, path: &Path, name: &str) -> Result<FileRecord, FilesError> {
        let before = self.catalog.get(name).await?;
        self.upload_to_r(path, name, Some(before)).await
    }

    /// Uploads to R nodes in rendezvous order and returns the record. `overwrite`:
    /// `Some(the record read before)` to replace the name's bytes.
    async fn upload_to_r(
        &self,
        path: &Path,
        name: &str,
        overwrite: Option<Option<super::catalog::Stored>>,
    ) -> Result<FileRecord, FilesError> {
        let how = super::transfer::Upload {
            copy_for: None,
            overwrite: overwrite.is_some(),
        };
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
            match self.transfer.upload(addr, path, name, how).await {
                Ok(verified) => plan.handle_good(node, verified),
                Err(TransferError::Exists) if !plan.good_nodes().is_empty() => {
                    let held = self.transfer.stat(addr, name).await.ok();
                    plan.handle_exists(node, held);
                }
                Err(reason) => {
                    tracing::info!(%name, %node, %reason, "cluster files: upload failed; trying the next node");
                    plan.handle_failed(node, reason.to_string());
                }
            }
        }
        let record = plan.outcome().expect("no node left to try")?;
        // Servers record their own copies before they answer GOOD (`CatalogRecorder`),
        // so by now the record names every node that verified the file, and a client
        // needs no write access to the catalog.
        let before = overwrite.as_ref().and_then(Option::as_ref);
        match self.catalog.get(name).await? {
            Some(stored) if stored.record.same_bytes(&record) => return Ok(stored.record),
            // Unchanged by the overwrite: its servers record nothing.
            Some(stored) if before.is_some_and(|b| b.mod_revision == stored.mod_revision) => {}
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
        if let Some(before) = before {
            let version = FileRecord {
                owner: before.record.owner.clone(),
                ..record.clone()
            };
            for node in &record.nodes {
                if let AddedCopy::Taken(existing) =
                    self.catalog.add_version(name, &version, node).await?
                {
                    return Err(FilesError::NameTaken {
                        name: name.to_owned(),
                        existing,
                    });
                }
            }
            return Ok(self.catalog.get(name).await?.map_or(version, |s| s.record));
        }
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
    /// digest: the record's nodes first, then the other live nodes in rendezvous order
    /// (see [`fallback_order`]), each of those asked what it holds before anything
    /// moves. No fetch reads more than the record's size.
    ///
    /// # Errors
    ///
    /// [`FilesError::NotFound`], [`FilesError::FetchFailed`] naming each node tried
    /// and why, [`FilesError::Registry`].
    pub async fn get(&self, name: &str, dir: &Path) -> Result<Fetched, FilesError> {
        let Some(stored) = self.catalog.get(name).await? else {
            return Err(FilesError::NotFound {
                name: name.to_owned(),
                cluster: self.cluster.clone(),
            });
        };
        let record = &stored.record;
        let live = self.live().await;
        let ids: Vec<String> = live.iter().map(|n| n.node.clone()).collect();
        let listed = fetch_order(record, &ids).into_iter().map(|n| (n, true));
        let others = fallback_order(name, record, &ids)
            .into_iter()
            .map(|n| (n, false));
        let mut failed = Vec::new();
        for (node, in_record) in listed.chain(others) {
            let Some(info) = live.iter().find(|n| n.node == node) else {
                failed.push((node, "not listed in the registry".to_owned()));
                continue;
            };
            let addr = info.record.addr;
            if !in_record {
                match self.transfer.stat(addr, name).await {
                    Ok(held) if holds(record, &held) => {}
                    Ok(held) => {
                        failed.push((node, other_bytes(&held, record)));
                        continue;
                    }
                    Err(e) => {
                        failed.push((node, e.to_string()));
                        continue;
                    }
                }
            }
            match self.fetch_checked(addr, name, dir, record).await {
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

    /// Fetches at most the record's size and checks against `record`; a file with
    /// other bytes is removed. A node that announces a larger file is refused before
    /// its bytes move, so one bad replica costs a message, not a copy.
    async fn fetch_checked(
        &self,
        addr: SocketAddr,
        name: &str,
        dir: &Path,
        record: &FileRecord,
    ) -> Result<PathBuf, String> {
        let verified = self
            .transfer
            .fetch(addr, name, dir, record.size, None)
            .await
            .map_err(|e| e.to_string())?;
        let path = dir.join(name);
        if !holds(record, &verified) {
            let _ = std::fs::remove_file(&path);
            return Err(other_bytes(&verified, record));
        }
        Ok(path)
    }
}

/// Whether `held` is the recorded file's bytes.
fn holds(record: &FileRecord, held: &Verified) -> bool {
    held.alg == record.alg && held.digest == record.digest && held.size == record.size
}

/// Why `held` is not the record's file, in words.
fn other_bytes(held: &Verified, record: &FileRecord) -> String {
    format!(
        "holds other bytes: {} bytes, {} {} (the catalog says {} bytes, {} {})",
        held.size, held.alg, held.digest, record.size, record.alg, record.digest
    )
}
