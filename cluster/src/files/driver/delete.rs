//! An owner's delete across the cluster: the server of each listed replica is asked to
//! remove its copy. Each server's recorder forgets the record before its copy goes
//! (`CatalogRecorder`), so the first server that removes a copy removes the record, and
//! no record ever names bytes that are gone. A node that is away keeps a copy that no
//! record names, which its clean-up (`--clean-up-after-secs`) removes; a later put of
//! the name passes over it if its bytes differ.

use super::{ClusterFiles, FilesError};
use crate::files::catalog::Removed;
use crate::files::transfer::{FileTransfer, TransferError};
use crate::files::FileRecord;

/// What a delete did.
#[derive(Debug, Clone)]
pub struct Deleted {
    /// The record as it was before the delete.
    pub record: FileRecord,
    /// The nodes whose copy was removed.
    pub removed: Vec<String>,
    /// The nodes whose copy is left, and why (not listed now, unreachable): named by
    /// no record any more.
    pub left: Vec<(String, String)>,
}

impl<T: FileTransfer> ClusterFiles<T> {
    /// Deletes `name` from the cluster: asks the server of each node its record names
    /// to remove its copy (allowed to the file's owner alone, by each server).
    ///
    /// # Errors
    ///
    /// [`FilesError::NotFound`] when the catalog has no such file;
    /// [`FilesError::DeleteFailed`] when no server removed its copy (none reached, or
    /// each refused: another's file is refused as a missing one), with each node's
    /// reason; [`FilesError::Registry`].
    pub async fn delete(&self, name: &str) -> Result<Deleted, FilesError> {
        let Some(stored) = self.catalog.get(name).await? else {
            return Err(FilesError::NotFound {
                name: name.to_owned(),
                cluster: self.cluster.clone(),
            });
        };
        let live = self.members.live();
        let mut done = Deleted {
            record: stored.record.clone(),
            removed: Vec::new(),
            left: Vec::new(),
        };
        for node in &stored.record.nodes {
            let Some(info) = live.iter().find(|n| n.node == *node) else {
                done.left
                    .push((node.clone(), "not listed in the registry".into()));
                continue;
            };
            match self.transfer.delete(info.record.addr, name).await {
                Ok(()) => done.removed.push(node.clone()),
                Err(TransferError::NotFound) => done
                    .left
                    .push((node.clone(), "no such file, or not this client's".into())),
                Err(e) => done.left.push((node.clone(), e.to_string())),
            }
        }
        if done.removed.is_empty() {
            return Err(FilesError::DeleteFailed {
                name: name.to_owned(),
                attempts: done.left,
            });
        }
        // Servers with a recorder forgot the record already; where none did (servers
        // without one, as in tests), the client removes it, as `put` records where no
        // server did.
        if let Some(now) = self.catalog.get(name).await? {
            if let Removed::NotOwner(record) = self
                .catalog
                .remove(name, now.record.owner.as_deref())
                .await?
            {
                tracing::warn!(%name, ?record, "cluster files: the record changed owner during a delete");
            }
        }
        Ok(done)
    }
}
