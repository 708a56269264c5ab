//! Where a file's replicas go, where a fetch reads, and when a replica is copied anew:
//! plain state machines and functions, no I/O and no clock (the caller passes `now`),
//! so every rule is unit tested here and the drivers only carry them out.
//!
//! - [`replica_order`]: the nodes in rendezvous order for the file's name. The first R
//!   are its replicas; the rest are fallbacks, in the order every client agrees on.
//! - [`UploadPlan`]: one upload to R nodes, node after node; a node that fails is
//!   replaced by the next in order; the file is placed once R nodes verified the same
//!   digest.
//! - [`fetch_order`]: the record's nodes that are listed first, then the others.
//! - [`RepairPlanner`]: notices when a node holding replicas left the registry, and once
//!   it has been gone for the grace period names a copy to make (from a replica still
//!   listed to the next node in rendezvous order that holds none), backing off after
//!   failures ([`Backoff`]) and passing over nodes that hold other bytes under the name.
//!   With [`with_scrub`](RepairPlanner::with_scrub) it also names the files whose
//!   listed nodes to ask what they hold ([`Scrub`]), and replaces at once a node found
//!   without the recorded bytes.
//! - [`fallback_order`]: the live nodes outside a record a fetch tries last.
//! - [`Collector`]: which files of a node's own store no record lists for it, for long
//!   enough to remove.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use super::FileRecord;
use crate::pick::rendezvous_order;

mod backoff;
mod gc;
mod scrub;

pub use backoff::{Backoff, FailureKind};
pub use gc::Collector;
pub use scrub::{Found, Scrub};

/// The node ids in rendezvous order for the file `name`.
pub fn replica_order<'a>(name: &str, nodes: &'a [String]) -> Vec<&'a String> {
    rendezvous_order(name.as_bytes(), nodes, |n| n.as_str())
}

/// What one replica's server verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The digest's algorithm (`sha256`).
    pub alg: String,
    /// The digest, lowercase hex.
    pub digest: String,
    /// Bytes.
    pub size: u64,
}

/// Why an upload could not place its replicas.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlacementError {
    /// Fewer nodes verified the file than it needs; `failed` names each other node
    /// tried and why.
    #[error("{name}: {good} of {want} replicas verified ({}); failed: {}",
        if good_nodes.is_empty() { "none".to_string() } else { good_nodes.join(", ") },
        if failed.is_empty() { "no other node listed".to_string() } else {
            failed.iter().map(|(n, r)| format!("node {n}: {r}")).collect::<Vec<_>>().join("; ") })]
    TooFewReplicas {
        /// The file.
        name: String,
        /// Replicas wanted.
        want: usize,
        /// Replicas verified.
        good: usize,
        /// The nodes that verified it.
        good_nodes: Vec<String>,
        /// The nodes that failed, and why.
        failed: Vec<(String, String)>,
    },
    /// Two nodes verified different digests: the local file changed during the upload.
    #[error("{name}: node {first} verified {first_digest} but node {other} verified {other_digest} (the file changed while it was uploaded?)")]
    DigestMismatch {
        /// The file.
        name: String,
        /// The first node.
        first: String,
        /// Its digest.
        first_digest: String,
        /// The node that disagreed.
        other: String,
        /// Its digest.
        other_digest: String,
    },
}

/// One upload to R nodes. Order: [`poll_target`](Self::poll_target) names a node, the
/// driver uploads and answers with [`handle_good`](Self::handle_good) or
/// [`handle_failed`](Self::handle_failed); when `poll_target` gives `None`,
/// [`outcome`](Self::outcome) is ready.
#[derive(Debug)]
pub struct UploadPlan {
    name: String,
    want: usize,
    queue: VecDeque<String>,
    good: Vec<(String, Verified)>,
    failed: Vec<(String, String)>,
    mismatch: Option<PlacementError>,
}

impl UploadPlan {
    /// An upload of `name` to `replicas` of `nodes` (the live nodes, any order).
    pub fn new(name: &str, nodes: &[String], replicas: usize) -> UploadPlan {
        UploadPlan {
            name: name.to_owned(),
            want: replicas.max(1),
            queue: replica_order(name, nodes).into_iter().cloned().collect(),
            good: Vec::new(),
            failed: Vec::new(),
            mismatch: None,
        }
    }

    /// The next node to upload to; `None` once placed, failed, or out of nodes.
    #[must_use]
    pub fn poll_target(&mut self) -> Option<String> {
        if self.mismatch.is_some() || self.good.len() >= self.want {
            return None;
        }
        self.queue.pop_front()
    }

    /// `node` answered GOOD, having verified `verified`.
    pub fn handle_good(&mut self, node: String, verified: Verified) {
        if let Some((first, seen)) = self.good.first() {
            if *seen != verified && self.mismatch.is_none() {
                self.mismatch = Some(PlacementError::DigestMismatch {
                    name: self.name.clone(),
                    first: first.clone(),
                    first_digest: seen.digest.clone(),
                    other: node.clone(),
                    other_digest: verified.digest.clone(),
                });
            }
        }
        self.good.push((node, verified));
    }

    /// `node` already holds a file of the name, and `held` is what it holds (`None`:
    /// unknown). The same bytes another node verified for this upload are a replica of
    /// it: a repair may have copied the first copy there while this client was still
    /// trying a dead node (seen on the wire: "1 of 2 replicas verified (a); node c: a
    /// file of that name exists"). Anything else is a failure, and the next node is
    /// tried.
    pub fn handle_exists(&mut self, node: String, held: Option<Verified>) {
        match (held, self.good.first()) {
            (Some(held), Some((_, ours))) if held == *ours => self.handle_good(node, held),
            (Some(_), Some(_)) => {
                self.handle_failed(node, "a file of that name exists, with other bytes".into())
            }
            _ => self.handle_failed(node, "a file of that name exists".into()),
        }
    }

    /// The upload to `node` failed (refused, BAD, lost connection) for `reason`.
    pub fn handle_failed(&mut self, node: String, reason: String) {
        self.failed.push((node, reason));
    }

    /// The nodes that verified the file so far.
    pub fn good_nodes(&self) -> Vec<String> {
        self.good.iter().map(|(n, _)| n.clone()).collect()
    }

    /// The record to write (R nodes verified the same digest), or why not; `None`
    /// while nodes are left to try.
    pub fn outcome(&self) -> Option<Result<FileRecord, PlacementError>> {
        if let Some(err) = &self.mismatch {
            return Some(Err(err.clone()));
        }
        if self.good.len() >= self.want {
            let v = &self.good[0].1;
            return Some(Ok(FileRecord {
                alg: v.alg.clone(),
                digest: v.digest.clone(),
                size: v.size,
                nodes: self.good_nodes(),
                owner: None,
            }));
        }
        if !self.queue.is_empty() {
            return None;
        }
        Some(Err(PlacementError::TooFewReplicas {
            name: self.name.clone(),
            want: self.want,
            good: self.good.len(),
            good_nodes: self.good_nodes(),
            failed: self.failed.clone(),
        }))
    }
}

/// Where to fetch `record` from: its nodes that are `live` first, in the record's order,
/// then its others (the registry may lag behind a node that is back).
pub fn fetch_order(record: &FileRecord, live: &[String]) -> Vec<String> {
    let (mut first, rest): (Vec<String>, Vec<String>) =
        record.nodes.iter().cloned().partition(|n| live.contains(n));
    first.extend(rest);
    first
}

/// The live nodes a fetch tries once the record's own failed, in rendezvous order: a
/// replica the record lost track of (a node that was cut off and came back, a copy
/// whose record update was fenced) may still be there; each is checked against the
/// record's digest like any other.
pub fn fallback_order(name: &str, record: &FileRecord, live: &[String]) -> Vec<String> {
    replica_order(name, live)
        .into_iter()
        .filter(|n| !record.nodes.contains(n))
        .cloned()
        .collect()
}

/// How many nodes before itself in a file's rendezvous order a server's planner
/// ([`RepairPlanner::for_node`]) asks to step aside before it copies the file to itself.
/// Further down it leaves the copy to the nodes before it: bounds the questions each
/// round costs, and means a client that squats other bytes under a name on more nodes
/// than this, all in a row of the name's order, holds up its repair (a scrub or a
/// clean-up of names no record lists would end that).
pub const MAX_AHEAD: usize = 8;

/// A copy that restores a file's replica count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repair {
    /// The file.
    pub name: String,
    /// The node gone longer than the grace period; `None` when the record has named
    /// fewer than R nodes, all listed, for the grace period (an upload that reached
    /// fewer than R nodes, each of which recorded its copy): the copy adds a node.
    pub gone: Option<String>,
    /// A listed node holding a replica, to copy from.
    pub from: String,
    /// The node to copy to: the next in rendezvous order that holds no listed replica
    /// and was not seen holding other bytes under the name.
    pub to: String,
    /// The nodes before `to` in that order that a server's planner asks first (see
    /// [`RepairPlanner::for_node`]): one holding the recorded bytes is recorded instead
    /// of a copy; one holding other bytes is passed over; one holding nothing, or that
    /// cannot be asked, makes the copy itself, so `to` waits. Empty when one planner
    /// makes every copy.
    pub ahead: Vec<String>,
}

/// A node taken off a file's record without a copy (see
/// [`RepairPlanner::poll_forgets`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forget {
    /// The file.
    pub name: String,
    /// The node gone longer than the grace period.
    pub gone: String,
}

/// Decides repairs. Order: [`handle_live`](Self::handle_live) with the nodes listed
/// (not draining) whenever they change, then [`poll_repairs`](Self::poll_repairs) with
/// the catalog and `now`, then for each copy one of [`handle_done`](Self::handle_done)
/// or [`handle_failed`](Self::handle_failed), and [`handle_other_bytes`](Self::handle_other_bytes)
/// for each node found holding other bytes under a file's name. With
/// [`with_scrub`](Self::with_scrub), before `poll_repairs`:
/// [`poll_scrubs`](Self::poll_scrubs), and [`handle_scrubbed`](Self::handle_scrubbed)
/// with each answer.
///
/// A node counts as gone from the first time a call saw it absent while a record names
/// it; it is forgiven as soon as it is listed again (a restart within the grace period
/// costs no copy).
///
/// A failed copy is not proposed again until its [`Backoff`] lets it: the wait grows
/// per file and kind of failure, so a copy that cannot succeed costs a few attempts an
/// hour, not one every round. A node seen holding other bytes under a file's name (a
/// leftover of an older file, or a squatter) is passed over as that file's target, so
/// the copy goes to the next node in order instead of meeting `Exists` for ever; what
/// was learned is forgotten once the file is repaired or the node leaves.
///
/// Inside a cluster's servers, every node runs a planner of its own
/// ([`for_node`](Self::for_node)) and carries out only the copies *to* itself: the
/// target is chosen by rendezvous hashing over the live nodes, which every node computes
/// alike, so each copy has one repairer without any election, and the new replica's
/// node is the one that wants it. What one node learned (the node before it holds
/// other bytes) the others cannot know, so a node further down the order asks the nodes
/// before it ([`Repair::ahead`], at most [`MAX_AHEAD`]) and copies only once each of
/// them holds other bytes. The file's lock and the revision fence still guard the
/// moments when two nodes' views differ.
#[derive(Debug)]
pub struct RepairPlanner {
    grace: Duration,
    live: Vec<String>,
    absent_since: HashMap<String, Instant>,
    /// Only the copies to this node (`None`: every copy).
    only_to: Option<String>,
    backoff: Backoff,
    /// Per file, the nodes seen holding other bytes under its name.
    other_bytes: HashMap<String, HashSet<String>>,
    /// Per file, the listed nodes a scrub found without the recorded bytes: replaced
    /// at once, as a node gone past the grace period is.
    lost: HashMap<String, HashSet<String>>,
    scrub: Option<scrub::Scrubbing>,
    /// R: a record naming fewer nodes for the grace period gets a copy added.
    replicas: usize,
    /// Per file whose record names fewer than R nodes, since when it was seen so.
    short_since: HashMap<String, Instant>,
}

impl RepairPlanner {
    /// Waits after a copy's first failure; doubled after each next one of its kind.
    pub const BACKOFF_BASE: Duration = Duration::from_secs(5);
    /// The longest wait after failures.
    pub const BACKOFF_CAP: Duration = Duration::from_secs(600);

    /// Repairs a file once one of its nodes has been gone for `grace`.
    pub fn new(grace: Duration) -> RepairPlanner {
        RepairPlanner {
            grace,
            live: Vec::new(),
            absent_since: HashMap::new(),
            only_to: None,
            backoff: Backoff::new(Self::BACKOFF_BASE, Self::BACKOFF_CAP),
            other_bytes: HashMap::new(),
            lost: HashMap::new(),
            scrub: None,
            replicas: 2,
            short_since: HashMap::new(),
        }
    }

    /// Like [`new`](Self::new), but names only the copies whose new replica goes to
    /// `node`: the planner of a server that repairs onto itself.
    pub fn for_node(grace: Duration, node: &str) -> RepairPlanner {
        RepairPlanner {
            only_to: Some(node.to_owned()),
            ..RepairPlanner::new(grace)
        }
    }

    /// Waits `base` after a failed copy, doubling per failure of the same kind up to
    /// `cap` (defaults [`BACKOFF_BASE`](Self::BACKOFF_BASE),
    /// [`BACKOFF_CAP`](Self::BACKOFF_CAP)).
    pub fn with_backoff(mut self, base: Duration, cap: Duration) -> Self {
        self.backoff = Backoff::new(base, cap);
        self
    }

    /// R, the nodes every record should name (default 2, as `ClusterFiles`; at least
    /// 1). A record that names fewer, every one of them listed, for the grace period
    /// (an upload that verified fewer than R replicas: each recorded its own copy, so
    /// the file is recorded though its client heard an error) gets a copy added, to the
    /// next node in order, as a gone node's copy is made. The grace lets an upload
    /// under way place its next replica first.
    pub fn with_replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas.max(1);
        self
    }

    /// The nodes listed now.
    pub fn handle_live(&mut self, live: Vec<String>) {
        self.absent_since.retain(|node, _| !live.contains(node));
        for nodes in self.other_bytes.values_mut() {
            nodes.retain(|node| live.contains(node));
        }
        self.live = live;
    }

    /// The copies due now, at most one per file (the next poll, after the record
    /// changed, names the next). Files whose every node is gone, with no node left
    /// to copy to, or waiting after a failure, wait.
    #[must_use]
    pub fn poll_repairs(&mut self, now: Instant, files: &[(String, FileRecord)]) -> Vec<Repair> {
        let names: HashSet<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        self.backoff.retain(|name| names.contains(name));
        self.other_bytes
            .retain(|name, _| names.contains(name.as_str()));
        self.lost.retain(|name, _| names.contains(name.as_str()));
        self.short_since
            .retain(|name, _| names.contains(name.as_str()));
        let mut due = Vec::new();
        for (name, record) in files {
            let lost = self.lost.get(name);
            let is_lost = |n: &String| lost.is_some_and(|l| l.contains(n));
            let from = record
                .nodes
                .iter()
                .find(|n| self.live.contains(n) && !is_lost(n));
            let Some(from) = from else {
                continue;
            };
            for node in record.nodes.iter().filter(|n| !self.live.contains(n)) {
                self.absent_since.entry(node.clone()).or_insert(now);
            }
            let gone = record.nodes.iter().find(|n| {
                is_lost(n)
                    || self
                        .gone_for(now, n)
                        .is_some_and(|gone_for| gone_for >= self.grace)
            });
            let short = record.nodes.len() < self.replicas;
            if !short {
                self.short_since.remove(name);
            } else if gone.is_none() {
                let since = *self.short_since.entry(name.clone()).or_insert(now);
                if now.saturating_duration_since(since) < self.grace {
                    continue;
                }
            }
            if gone.is_none() && !short {
                // Needs no repair (any more): its next failure starts afresh.
                self.backoff.handle_success(name);
                self.other_bytes.remove(name);
                continue;
            }
            if !self.backoff.ready(now, name) {
                continue;
            }
            let passed = self.other_bytes.get(name);
            let candidates: Vec<&String> = replica_order(name, &self.live)
                .into_iter()
                .filter(|n| !record.nodes.contains(n) && passed.is_none_or(|p| !p.contains(*n)))
                .collect();
            let (to, ahead) = match &self.only_to {
                None => match candidates.first() {
                    Some(to) => (*to, Vec::new()),
                    None => continue,
                },
                Some(me) => match candidates.iter().position(|n| *n == me) {
                    Some(at) if at <= MAX_AHEAD => (candidates[at], candidates[..at].to_vec()),
                    _ => continue,
                },
            };
            due.push(Repair {
                name: name.clone(),
                gone: gone.cloned(),
                from: from.clone(),
                to: to.clone(),
                ahead: ahead.into_iter().cloned().collect(),
            });
        }
        due
    }

    /// The records that name a node gone longer than the grace period while every live
    /// node already holds the file: no copy can replace it, so it is only taken off
    /// the record. How such a record comes about: a server records its copy before its
    /// GOOD, and dies before the GOOD reaches the client, which then places the file on
    /// the next nodes too. Inside a server, only the record's first live node names
    /// them (one writer, no election).
    #[must_use]
    pub fn poll_forgets(&mut self, now: Instant, files: &[(String, FileRecord)]) -> Vec<Forget> {
        let mut due = Vec::new();
        for (name, record) in files {
            let Some(first) = record.nodes.iter().find(|n| self.live.contains(n)) else {
                continue;
            };
            if self.only_to.as_ref().is_some_and(|me| me != first)
                || self.live.iter().any(|n| !record.nodes.contains(n))
            {
                continue;
            }
            for node in record.nodes.iter().filter(|n| !self.live.contains(n)) {
                self.absent_since.entry(node.clone()).or_insert(now);
            }
            let gone = record.nodes.iter().find(|n| {
                self.gone_for(now, n)
                    .is_some_and(|gone_for| gone_for >= self.grace)
            });
            if let Some(gone) = gone {
                due.push(Forget {
                    name: name.clone(),
                    gone: gone.clone(),
                });
            }
        }
        due
    }

    /// `repair` was made (or the record no longer needs it): its file's waits and what
    /// was learned about it are forgotten.
    pub fn handle_done(&mut self, repair: &Repair) {
        self.backoff.handle_success(&repair.name);
        self.other_bytes.remove(&repair.name);
        self.lost.remove(&repair.name);
    }

    /// `repair` failed with `kind` at `now`; returns how long its file waits.
    pub fn handle_failed(&mut self, now: Instant, repair: &Repair, kind: FailureKind) -> Duration {
        self.backoff.handle_failure(now, &repair.name, kind)
    }

    /// `node` holds other bytes than the record under `name`: it is passed over as the
    /// file's target from now on.
    pub fn handle_other_bytes(&mut self, name: &str, node: &str) {
        self.other_bytes
            .entry(name.to_owned())
            .or_default()
            .insert(node.to_owned());
    }

    /// How long `node` has been seen gone, if it is.
    pub fn gone_for(&self, now: Instant, node: &str) -> Option<Duration> {
        self.absent_since
            .get(node)
            .map(|since| now.saturating_duration_since(*since))
    }
}

#[cfg(test)]
mod tests;
