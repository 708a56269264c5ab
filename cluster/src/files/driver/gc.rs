//! Clean-up rounds of a server's own store: what [`Collector`] decides, carried out.
//! Opt-in: a store that also serves files outside the cluster (uploaded straight to the
//! server) would lose them after the grace period.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Instant;

use super::{holds, ClusterFiles, FilesError};
use crate::files::plan::Collector;
use crate::files::transfer::FileTransfer;
use crate::files::FileRecord;

/// What one clean-up round did.
#[derive(Debug, Default)]
pub struct CleanupReport {
    /// Names removed from the store.
    pub removed: Vec<String>,
    /// Names that could not be removed, and why.
    pub failed: Vec<(String, String)>,
}

impl<T: FileTransfer> ClusterFiles<T> {
    /// One clean-up round of node `node`'s store at `dir` (this process serves it), if
    /// `collector` has one due: the names it holds that no record lists for it, for the
    /// collector's grace period, are removed. Names a record lists elsewhere are asked
    /// about first (the node's own `Stat`) while that record names fewer than R live
    /// nodes: the recorded bytes are then kept, for a repair to record.
    ///
    /// # Errors
    ///
    /// The store or the catalog cannot be listed.
    pub async fn clean_up(
        &self,
        collector: &mut Collector,
        now: Instant,
        node: &str,
        dir: &Path,
    ) -> Result<CleanupReport, FilesError> {
        let mut report = CleanupReport::default();
        if !collector.poll_round(now) {
            return Ok(report);
        }
        // One reading of the registry for the round: this node's address, and the live
        // nodes a record must name R of before a copy outside it may go.
        let members = self.members.live();
        let Some(addr) = members
            .iter()
            .find(|n| n.node == node)
            .map(|n| n.record.addr)
        else {
            // Not listed (yet, or draining): nothing to ask itself through.
            return Ok(report);
        };
        let held = stored_names(dir).map_err(|e| FilesError::Store {
            dir: dir.to_owned(),
            reason: e.to_string(),
        })?;
        let files: HashMap<String, FileRecord> = self.records().await?.into_iter().collect();
        let live: HashSet<String> = members.into_iter().map(|n| n.node).collect();
        let mut other = HashSet::new();
        // This node's own answers, on one connection (see `FileTransfer::stat_many`).
        let ask: Vec<String> = collector
            .to_ask(&held, &files, &live)
            .into_iter()
            .cloned()
            .collect();
        for (name, found) in ask.iter().zip(self.transfer.stat_many(addr, &ask).await) {
            // An unanswered question keeps the file.
            if let Ok(found) = found {
                if !holds(&files[name], &found) {
                    other.insert(name.clone());
                }
            }
        }
        for name in collector.poll_removals(now, &held, &files, &live, &other) {
            // Other bytes are never a file's last copy; the recorded bytes may be.
            let removed = if files.contains_key(&name) && !other.contains(&name) {
                self.remove_unlisted(&name, node, dir, collector.replicas())
                    .await
            } else {
                remove(dir, &name)
            };
            match removed {
                Ok(true) => {
                    tracing::info!(%name, "cluster files: removed, no record lists it here");
                    collector.handle_removed(&name);
                    report.removed.push(name);
                }
                // Gone already, or recorded here meanwhile: its clock starts over.
                Ok(false) => collector.handle_removed(&name),
                Err(why) => report.failed.push((name, why)),
            }
        }
        Ok(report)
    }

    /// Removes `node`'s copy of a recorded file the record does not list, under the
    /// file's repair lock, and only if, read under it, the record still does not list
    /// `node` and at least `replicas` of the live nodes it lists answer that they hold
    /// its bytes. A repair recording this copy meanwhile (it takes the same lock) keeps
    /// it, and so does a record whose listed copies were lost unseen (a wiped store the
    /// scrub has not reached yet): this copy may then be the last one. Whether it was
    /// removed (not when kept so, or gone already).
    async fn remove_unlisted(
        &self,
        name: &str,
        node: &str,
        dir: &Path,
        replicas: usize,
    ) -> Result<bool, String> {
        let lock = self
            .catalog
            .lock(name, self.lock_ttl)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("another repairer holds the file's lock")?;
        let result = match self.catalog.get(name).await {
            Ok(Some(now)) if now.record.nodes.iter().any(|n| n == node) => Ok(false),
            Ok(Some(now)) if self.holders(name, &now.record).await < replicas => Ok(false),
            Ok(_) => remove(dir, name),
            Err(e) => Err(e.to_string()),
        };
        self.catalog.release(lock).await;
        result
    }

    /// How many live nodes `record` lists answer that they hold its bytes under `name`.
    async fn holders(&self, name: &str, record: &FileRecord) -> usize {
        let mut holders = 0;
        for listed in self.members.live() {
            if !record.nodes.contains(&listed.node) {
                continue;
            }
            if let Ok(found) = self.transfer.stat(listed.record.addr, name).await {
                holders += usize::from(holds(record, &found));
            }
        }
        holders
    }
}

/// Removes `dir/name`; `false` if it was gone already.
fn remove(dir: &Path, name: &str) -> Result<bool, String> {
    match std::fs::remove_file(dir.join(name)) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}

/// The plain files of `dir` a `Fetch` could ask for: hidden names (the service's
/// temporary files among them) are never the cluster's.
fn stored_names(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if !entry.file_type()?.is_file() {
            continue;
        }
        if let Some(name) = entry.file_name().to_str() {
            if !name.starts_with('.') {
                names.push(name.to_owned());
            }
        }
    }
    Ok(names)
}
