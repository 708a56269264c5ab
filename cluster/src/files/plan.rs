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
//!   listed to the next node in rendezvous order that holds none).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::FileRecord;
use crate::pick::rendezvous_order;

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

/// A copy that restores a file's replica count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repair {
    /// The file.
    pub name: String,
    /// The node gone longer than the grace period.
    pub gone: String,
    /// A listed node holding a replica, to copy from.
    pub from: String,
    /// The node to copy to: the next in rendezvous order that holds none.
    pub to: String,
}

/// Decides repairs. Order: [`handle_live`](Self::handle_live) with the nodes listed
/// (not draining) whenever they change, then [`poll_repairs`](Self::poll_repairs) with
/// the catalog and `now`.
///
/// A node counts as gone from the first time a call saw it absent while a record names
/// it; it is forgiven as soon as it is listed again (a restart within the grace period
/// costs no copy).
///
/// Inside a cluster's servers, every node runs a planner of its own
/// ([`for_node`](Self::for_node)) and carries out only the copies *to* itself: the
/// target is chosen by rendezvous hashing over the live nodes, which every node computes
/// alike, so each copy has one repairer without any election, and the new replica's
/// node is the one that wants it. The file's lock and the revision fence still guard
/// the moments when two nodes' views of who is live differ.
#[derive(Debug)]
pub struct RepairPlanner {
    grace: Duration,
    live: Vec<String>,
    absent_since: HashMap<String, Instant>,
    /// Only the copies to this node (`None`: every copy).
    only_to: Option<String>,
}

impl RepairPlanner {
    /// Repairs a file once one of its nodes has been gone for `grace`.
    pub fn new(grace: Duration) -> RepairPlanner {
        RepairPlanner {
            grace,
            live: Vec::new(),
            absent_since: HashMap::new(),
            only_to: None,
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

    /// The nodes listed now.
    pub fn handle_live(&mut self, live: Vec<String>) {
        self.absent_since.retain(|node, _| !live.contains(node));
        self.live = live;
    }

    /// The copies due now, at most one per file (the next poll, after the record
    /// changed, names the next). Files whose every node is gone, or with no node left
    /// to copy to, wait.
    #[must_use]
    pub fn poll_repairs(&mut self, now: Instant, files: &[(String, FileRecord)]) -> Vec<Repair> {
        let mut due = Vec::new();
        for (name, record) in files {
            let Some(from) = record.nodes.iter().find(|n| self.live.contains(n)) else {
                continue;
            };
            for node in record.nodes.iter().filter(|n| !self.live.contains(n)) {
                self.absent_since.entry(node.clone()).or_insert(now);
            }
            let gone = record.nodes.iter().find(|n| {
                self.gone_for(now, n)
                    .is_some_and(|gone_for| gone_for >= self.grace)
            });
            let Some(gone) = gone else { continue };
            let to = replica_order(name, &self.live)
                .into_iter()
                .find(|n| !record.nodes.contains(n));
            let mine = |to: &String| self.only_to.as_ref().is_none_or(|me| me == to);
            if let Some(to) = to.filter(|to| mine(to)) {
                due.push(Repair {
                    name: name.clone(),
                    gone: gone.clone(),
                    from: from.clone(),
                    to: to.clone(),
                });
            }
        }
        due
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
