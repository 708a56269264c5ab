//! Repair rounds: the copies [`RepairPlanner`] names, each under its file's lock and
//! fenced by the record's revision, with what each copy met told back to the planner
//! (made, failed and of which kind, nodes found holding other bytes).
//!
//! A copy never moves bytes it can tell are wrong: the source is asked what it holds
//! first, every fetch is bounded by the record's size, and a target that already holds
//! the name is asked what it holds rather than counted as a failure (the recorded
//! bytes: recorded as a replica; other bytes: passed over).

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Instant;

use futures::stream::{self, StreamExt};

use super::{holds, other_bytes, ClusterFiles, FilesError, RepairReport};
use crate::files::catalog::Stored;
use crate::files::plan::{FailureKind, Forget, Repair, RepairPlanner};
use crate::files::transfer::{FileTransfer, TransferError, Upload};
use crate::files::FileRecord;
use crate::NodeInfo;

/// Where a repair's copy passes through.
///
/// Choice (issue 47): a server repairs onto itself ([`RepairPlanner::for_node`]) and
/// gives [`Staging::Store`]; the copy is then fetched straight into its own `files`
/// store, through the files service's own receiver: a hidden temporary file in the
/// store, admitted only if the record's size fits the store's largest file and the
/// disk's free space (reserved before any byte moves), given its name only once
/// verified. One copy, in place when recorded, nothing outside the store. What it does
/// not do: count against the per-client shares the server's quota owner keeps for
/// uploads (a repair is the server's own work, not a client's).
#[derive(Debug, Clone, Copy)]
pub enum Staging<'a> {
    /// This process serves node `node`'s `files` store at `dir`, which takes files of
    /// at most `max_size` bytes. Copies to another node pass through a private
    /// directory in `dir`, as with [`Staging::Through`].
    Store {
        /// The node whose store it is.
        node: &'a str,
        /// The store.
        dir: &'a Path,
        /// Its largest file.
        max_size: u64,
    },
    /// Copies are fetched into a private directory (mode 0700, an unpredictable name,
    /// hidden) made in this directory for each copy, then uploaded to their node; the
    /// directory is removed after.
    Through(&'a Path),
}

impl Staging<'_> {
    fn dir(&self) -> &Path {
        match self {
            Staging::Store { dir, .. } => dir,
            Staging::Through(dir) => dir,
        }
    }
}

/// Copies one repair round makes at once.
const COPIES_AT_ONCE: usize = 4;

/// Why a copy was not made. `kind`: what the planner backs off on; `None` when there is
/// nothing to wait for (a node was passed over: the next round copies elsewhere).
struct Unmade {
    kind: Option<FailureKind>,
    why: String,
}

impl Unmade {
    fn new(kind: FailureKind, why: impl Into<String>) -> Unmade {
        Unmade {
            kind: Some(kind),
            why: why.into(),
        }
    }
}

impl<T: FileTransfer> ClusterFiles<T> {
    /// One repair round: tells `planner` the live nodes, carries out the copies it
    /// names, each under its file's lock, and tells it how each ended.
    ///
    /// # Errors
    ///
    /// The catalog cannot be listed. A failed copy is reported, not an error.
    pub async fn repair(
        &self,
        planner: &mut RepairPlanner,
        now: Instant,
        staging: Staging<'_>,
    ) -> Result<RepairReport, FilesError> {
        let (live, files) = self.round(planner).await?;
        let mut report = RepairReport::default();
        // Copies of different files are independent (each under its own lock, into its
        // own reserved temporary file), and each waits mostly on etcd and the network:
        // a few at once, so that a wiped store's hundreds of files come back in minutes.
        let live = &live;
        let copies: Vec<_> = stream::iter(planner.poll_repairs(now, &files))
            .map(|repair| async move {
                let mut passed = Vec::new();
                let result = self.copy(&repair, live, staging, &mut passed).await;
                (repair, passed, result)
            })
            .buffer_unordered(COPIES_AT_ONCE)
            .collect()
            .await;
        for (repair, passed, result) in copies {
            for node in &passed {
                planner.handle_other_bytes(&repair.name, node);
            }
            match result {
                Ok(to) => {
                    planner.handle_done(&repair);
                    let made = Repair { to, ..repair };
                    tracing::info!(?made, "cluster files: replica restored");
                    report.done.push(made);
                }
                Err(Unmade { kind, why }) => {
                    let why = match kind {
                        Some(kind) => {
                            let wait = planner.handle_failed(now, &repair, kind);
                            format!("{why} (next attempt in {} s)", wait.as_secs())
                        }
                        None => why,
                    };
                    tracing::warn!(?repair, %why, "cluster files: repair not made");
                    report.failed.push((repair, why));
                }
            }
        }
        for forget in planner.poll_forgets(now, &files) {
            match self.forget(&forget).await {
                Ok(()) => {
                    tracing::info!(?forget, "cluster files: a gone node taken off a record");
                    report.forgotten.push(forget);
                }
                Err(why) => tracing::warn!(?forget, %why, "cluster files: gone node kept"),
            }
        }
        Ok(report)
    }

    /// Takes `forget.gone` off its file's record, under the file's lock and fenced by
    /// the revision read under it, if the record still names it among other nodes.
    async fn forget(&self, forget: &Forget) -> Result<(), String> {
        let lock = self
            .catalog
            .lock(&forget.name, self.lock_ttl)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("another repairer holds the file's lock")?;
        let result = self
            .rewrite(&forget.name, &lock, |now| {
                let mut nodes = now.nodes.clone();
                nodes.retain(|n| *n != forget.gone);
                if nodes.is_empty() || nodes.len() == now.nodes.len() {
                    return Err(Unmade::new(FailureKind::Changed, "the record changed"));
                }
                Ok(nodes)
            })
            .await
            .map_err(|unmade| unmade.why);
        self.catalog.release(lock).await;
        result
    }

    /// One copy under the file's lock, fenced by the record's revision; returns the
    /// node recorded in place of the gone one. The nodes before the target are asked
    /// before the lock is taken: while the first of them copies the file (holding the
    /// lock), the others learn that it holds nothing yet and wait, without queueing on
    /// the lock.
    async fn copy(
        &self,
        repair: &Repair,
        live: &[NodeInfo],
        staging: Staging<'_>,
        passed: &mut Vec<String>,
    ) -> Result<String, Unmade> {
        let found = if repair.ahead.is_empty() {
            None
        } else {
            let seen = self.read(repair).await?;
            self.ask_ahead(repair, live, &seen.record, passed)
                .await?
                .map(|node| (node, seen.record))
        };
        let lock = self
            .catalog
            .lock(&repair.name, self.lock_ttl)
            .await
            .map_err(|e| Unmade::new(FailureKind::Registry, e.to_string()))?
            .ok_or_else(|| {
                Unmade::new(
                    FailureKind::Locked,
                    "another repairer holds the file's lock",
                )
            })?;
        let result = async {
            // Read under the lock: what the fenced update compares against.
            let stored = self.read(repair).await?;
            let new = match found {
                Some((node, seen)) if seen.same_bytes(&stored.record) => node,
                Some(_) => return Err(Unmade::new(FailureKind::Changed, "the record changed")),
                None => {
                    self.place(repair, live, &stored.record, staging, passed)
                        .await?;
                    repair.to.clone()
                }
            };
            self.record(repair, &stored, &new, &lock).await?;
            Ok(new)
        }
        .await;
        self.catalog.release(lock).await;
        result
    }

    /// The file's record, if it still needs `repair`.
    async fn read(&self, repair: &Repair) -> Result<Stored, Unmade> {
        let stored = self
            .catalog
            .get(&repair.name)
            .await
            .map_err(|e| Unmade::new(FailureKind::Registry, e.to_string()))?
            .ok_or_else(|| Unmade::new(FailureKind::Changed, "the file was deleted"))?;
        let nodes = &stored.record.nodes;
        let needed = match &repair.gone {
            Some(gone) => nodes.contains(gone),
            None => nodes.len() < self.replicas,
        };
        if !needed || nodes.contains(&repair.to) || repair.ahead.iter().any(|n| nodes.contains(n)) {
            return Err(Unmade::new(
                FailureKind::Changed,
                "the record changed (repaired by another)",
            ));
        }
        Ok(stored)
    }

    /// Asks the nodes before the target in the name's order what they hold: the first
    /// that holds the recorded bytes is the new replica; those with other bytes are
    /// passed over; one with nothing is left to copy it itself (this copy waits).
    async fn ask_ahead(
        &self,
        repair: &Repair,
        live: &[NodeInfo],
        record: &FileRecord,
        passed: &mut Vec<String>,
    ) -> Result<Option<String>, Unmade> {
        for node in &repair.ahead {
            let held = match addr_of(live, node, FailureKind::Ahead) {
                Ok(addr) => self.transfer.stat(addr, &repair.name).await,
                Err(unmade) => return Err(unmade),
            };
            match held {
                Ok(held) if holds(record, &held) => return Ok(Some(node.clone())),
                Ok(_) => passed.push(node.clone()),
                Err(e) => {
                    return Err(Unmade::new(
                        FailureKind::Ahead,
                        format!(
                            "node {node}, before this one in the name's order, holds no other bytes ({e}): it copies the file itself"
                        ),
                    ))
                }
            }
        }
        Ok(None)
    }

    /// Makes the copy from `repair.from` to `repair.to`, or finds that `to` holds the
    /// recorded bytes already.
    async fn place(
        &self,
        repair: &Repair,
        live: &[NodeInfo],
        record: &FileRecord,
        staging: Staging<'_>,
        passed: &mut Vec<String>,
    ) -> Result<(), Unmade> {
        let (name, to) = (&repair.name, &repair.to);
        let from = addr_of(live, &repair.from, FailureKind::Source)?;
        let to_addr = addr_of(live, to, FailureKind::Target)?;
        // A source with other bytes (or a record no replica matches) costs a message,
        // not a copy. It may hash the file to answer (unless it knows the digest, as
        // after an upload), and the fetch reads it again.
        let source =
            |why: String| Unmade::new(FailureKind::Source, format!("node {}: {why}", repair.from));
        match self.transfer.stat(from, name).await {
            Ok(held) if holds(record, &held) => {}
            Ok(held) => return Err(source(other_bytes(&held, record))),
            Err(e) => return Err(source(e.to_string())),
        }
        let target = |why: String| Unmade::new(FailureKind::Target, format!("node {to}: {why}"));
        let put = match staging {
            Staging::Store {
                node,
                dir,
                max_size,
            } if node == to => {
                if record.size > max_size {
                    return Err(target(format!(
                        "the file's {} bytes are more than the {max_size} its store takes",
                        record.size
                    )));
                }
                // Into the store as the file's owner's: the owner fetches the copy
                // from this node as from the others.
                let owner = record.owner.as_deref();
                match self
                    .transfer
                    .fetch(from, name, dir, record.size, owner)
                    .await
                {
                    Ok(held) if !holds(record, &held) => {
                        // Fetched anew (an existing file is never replaced): ours to remove.
                        let _ = std::fs::remove_file(dir.join(name));
                        return Err(source(other_bytes(&held, record)));
                    }
                    Err(TransferError::Exists) => Err(TransferError::Exists),
                    Err(e) => return Err(source(e.to_string())),
                    ok => ok,
                }
            }
            _ => {
                // Ask the target first: its `Exists` would come only after the fetch.
                match self.transfer.stat(to_addr, name).await {
                    Err(TransferError::NotFound) => {}
                    Ok(held) => return held_already(record, to, &held, passed),
                    Err(e) => return Err(target(e.to_string())),
                }
                let private = tempfile::Builder::new()
                    .prefix(".repair-")
                    .permissions(std::fs::Permissions::from_mode(0o700))
                    .tempdir_in(staging.dir())
                    .map_err(|e| {
                        Unmade::new(
                            FailureKind::Staging,
                            format!("{}: {e}", staging.dir().display()),
                        )
                    })?;
                let path = self
                    .fetch_checked(from, name, private.path(), record)
                    .await
                    .map_err(source)?;
                let how = Upload {
                    copy_for: record.owner.as_deref(),
                    overwrite: false,
                };
                self.transfer.upload(to_addr, &path, name, how).await
            }
        };
        match put {
            Ok(held) if holds(record, &held) => Ok(()),
            Ok(held) => Err(target(format!("verified {}", other_bytes(&held, record)))),
            // Held before: a replica the record lost track of, or other bytes.
            Err(TransferError::Exists) => match self.transfer.stat(to_addr, name).await {
                Ok(held) => held_already(record, to, &held, passed),
                Err(e) => Err(target(format!(
                    "holds the name, but asking what failed: {e}"
                ))),
            },
            Err(e) => Err(target(e.to_string())),
        }
    }

    /// Records `new` in place of the gone node (added, for a record short of R), if the
    /// record holds the bytes read and
    /// the lock is still held. The record is read again first: `new`'s server may have
    /// recorded its copy itself on the way (a `CatalogRecorder` does, before its GOOD),
    /// and that change is this copy's own, not another repairer's (the lock keeps those
    /// out).
    async fn record(
        &self,
        repair: &Repair,
        stored: &Stored,
        new: &str,
        lock: &crate::files::RepairLock,
    ) -> Result<(), Unmade> {
        self.rewrite(&stored.name, lock, |now| {
            if !now.same_bytes(&stored.record) {
                return Err(Unmade::new(
                    FailureKind::Changed,
                    "the record changed bytes during the copy",
                ));
            }
            let mut nodes: Vec<String> = Vec::with_capacity(now.nodes.len() + 1);
            let added = repair.gone.is_none().then_some(new);
            for node in now.nodes.iter().map(String::as_str).chain(added) {
                let node = if repair.gone.as_deref() == Some(node) {
                    new
                } else {
                    node
                };
                if !nodes.iter().any(|n| n == node) {
                    nodes.push(node.to_owned());
                }
            }
            Ok(nodes)
        })
        .await
    }

    /// Under `lock`: reads `name`'s record, gives it the nodes `nodes` makes of it (or
    /// its refusal), and writes it fenced by the revision read. What a repair's record
    /// update and a forgotten node share.
    async fn rewrite(
        &self,
        name: &str,
        lock: &crate::files::RepairLock,
        nodes: impl FnOnce(&FileRecord) -> Result<Vec<String>, Unmade>,
    ) -> Result<(), Unmade> {
        let changed = |why: &str| Unmade::new(FailureKind::Changed, why.to_owned());
        let now = self
            .catalog
            .get(name)
            .await
            .map_err(|e| Unmade::new(FailureKind::Registry, e.to_string()))?
            .ok_or_else(|| changed("the file was deleted"))?;
        let record = FileRecord {
            nodes: nodes(&now.record)?,
            ..now.record.clone()
        };
        match self.catalog.replace(&now, &record, lock).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(changed("fenced: the record or the lock changed")),
            Err(e) => Err(Unmade::new(FailureKind::Registry, e.to_string())),
        }
    }
}

/// What `to` holding `held` under the name already means: the recorded bytes are a
/// replica the record lost track of (recorded as is); other bytes make `to` passed
/// over, and the next node in the name's order takes the copy.
fn held_already(
    record: &FileRecord,
    to: &str,
    held: &crate::files::Verified,
    passed: &mut Vec<String>,
) -> Result<(), Unmade> {
    if holds(record, held) {
        return Ok(());
    }
    passed.push(to.to_owned());
    Err(Unmade {
        kind: None,
        why: format!(
            "node {to} {}: passed over, the next node in the name's order takes the copy",
            other_bytes(held, record)
        ),
    })
}

/// `node`'s address, or a failure of `kind` if it is no longer listed.
fn addr_of(live: &[NodeInfo], node: &str, kind: FailureKind) -> Result<SocketAddr, Unmade> {
    live.iter()
        .find(|n| n.node == node)
        .map(|n| n.record.addr)
        .ok_or_else(|| Unmade::new(kind, format!("node {node} is no longer listed")))
}
