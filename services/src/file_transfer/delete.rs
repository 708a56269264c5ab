//! Removing a stored file at its owner's `Delete`: the server's blocking job (the
//! client's question is `client/delete.rs`).
//!
//! Order of the job: the file is opened and its owner read from the open file (so the
//! check and the attribute are the same inode's), the [`Recorder`] forgets it, and only
//! then is the name removed. A cluster's catalog thus never names bytes that are gone;
//! the other way round (a record forgotten, the unlink failing) leaves a copy no record
//! names, which a server's clean-up removes.

use std::path::PathBuf;
use std::sync::Arc;

use super::recorder::Recorder;
use super::sender::open_fetched;
use super::wire::RejectReason;

/// The blocking part of a `Delete` the server allowed (see the module docs).
#[derive(Debug)]
pub struct DeleteJob {
    /// The store.
    pub dir: PathBuf,
    /// The file's name in it.
    pub name: String,
    /// The identity whose file it must be, told by the open file's owner attribute;
    /// `None` when the connection may remove it whoever owns it.
    pub owner: Option<String>,
    /// Told before the name is removed ([`Recorder::forget`]).
    pub recorder: Option<Arc<dyn Recorder>>,
}

impl DeleteJob {
    /// Blocks (an open, the recorder's call, an unlink and a directory fsync).
    ///
    /// # Errors
    ///
    /// The reason to send back in a `Reject`: [`RejectReason::NotFound`] for a missing
    /// file or another's (the same answer, so it tells nothing of others' files), a bad
    /// name, or [`RejectReason::Unavailable`] when the recorder or the file system
    /// refused (the file is kept when the recorder refused).
    pub fn run(self) -> Result<(), RejectReason> {
        let file = open_fetched(&self.dir, &self.name)?;
        let owner = super::ownership::owner_of(&file).ok().flatten();
        drop(file);
        if let Some(who) = &self.owner {
            if owner.as_deref() != Some(who.as_str()) {
                return Err(RejectReason::NotFound);
            }
        }
        if let Some(recorder) = &self.recorder {
            recorder
                .forget(&self.name, owner.as_deref())
                .map_err(|why| RejectReason::Unavailable {
                    reason: format!("kept: the catalog did not forget it: {why}"),
                })?;
        }
        let path = self.dir.join(&self.name);
        std::fs::remove_file(&path).map_err(|e| RejectReason::Unavailable {
            reason: format!("removing {}: {e}", path.display()),
        })?;
        // The removal outlives a crash once the directory is on disk.
        if let Err(e) = std::fs::File::open(&self.dir).and_then(|d| d.sync_all()) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "fsync of the store after a delete");
        }
        Ok(())
    }
}
