//! Clean-up of a node's own store: names no record lists for the node, left there by an
//! upload that reached fewer than R nodes, or put there by a client under a recorded
//! name with other bytes (which repairs then pass over). Each is removed once it has
//! been seen so, round after round, for a grace period: long enough that a `put` in
//! progress (its replicas are stored before its record is written) is never touched.
//!
//! Kept: every name a record lists for the node, and the recorded bytes on a node the
//! record does not list while the record names fewer than R live nodes (an extra
//! replica: a fetch falls back on it, and this node's repair records it instead of
//! copying). Once the record names R live nodes the extra copy is no longer needed, and
//! it goes after the grace period like any other: a host that returns after its files
//! were repaired elsewhere would otherwise keep their bytes, uncounted, for ever.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::FileRecord;

/// Decides which of a node's files to remove. Order, each round:
/// [`poll_round`](Self::poll_round); if due, [`to_ask`](Self::to_ask) with the names
/// the store holds, ask the node what it holds under each of those, then
/// [`poll_removals`](Self::poll_removals) with the names found holding other bytes.
#[derive(Debug)]
pub struct Collector {
    node: String,
    grace: Duration,
    every: Duration,
    /// R: a record naming this many live nodes needs no extra copy here.
    replicas: usize,
    last_round: Option<Instant>,
    /// When each name was first seen removable, in the rounds since.
    removable_since: HashMap<String, Instant>,
}

impl Collector {
    /// Cleans node `node`'s store of names removable for `grace`, looking once every
    /// `every`.
    pub fn new(node: &str, grace: Duration, every: Duration) -> Collector {
        Collector {
            node: node.to_owned(),
            grace,
            every,
            replicas: 2,
            last_round: None,
            removable_since: HashMap::new(),
        }
    }

    /// The cluster's R (default 2), as the uploads and repairs use it.
    pub fn with_replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas.max(1);
        self
    }

    /// R, as given to [`with_replicas`](Self::with_replicas).
    pub fn replicas(&self) -> usize {
        self.replicas
    }

    /// Whether the record names R nodes of `live`: then nothing outside it is needed.
    fn complete(&self, record: &FileRecord, live: &HashSet<String>) -> bool {
        record.nodes.iter().filter(|n| live.contains(*n)).count() >= self.replicas
    }

    /// Whether a round is due at `now` (then it counts as made).
    pub fn poll_round(&mut self, now: Instant) -> bool {
        let due = self
            .last_round
            .is_none_or(|last| now.saturating_duration_since(last) >= self.every);
        if due {
            self.last_round = Some(now);
        }
        due
    }

    /// The names among `held` whose record exists, does not list this node, and names
    /// fewer than R `live` nodes: the node must be asked whether it holds the recorded
    /// bytes under them (then they are kept, for a repair to record).
    pub fn to_ask<'a>(
        &self,
        held: &'a [String],
        files: &HashMap<String, FileRecord>,
        live: &HashSet<String>,
    ) -> Vec<&'a String> {
        held.iter()
            .filter(|name| {
                files
                    .get(*name)
                    .is_some_and(|r| !r.nodes.contains(&self.node) && !self.complete(r, live))
            })
            .collect()
    }

    /// The names among `held` to remove now, seen so in every round for `grace`: no
    /// record at all, or a record that does not list this node while either the node
    /// holds `other_bytes` under the name or the record names R `live` nodes.
    #[must_use]
    pub fn poll_removals(
        &mut self,
        now: Instant,
        held: &[String],
        files: &HashMap<String, FileRecord>,
        live: &HashSet<String>,
        other_bytes: &HashSet<String>,
    ) -> Vec<String> {
        let removable: HashSet<&String> = held
            .iter()
            .filter(|name| match files.get(*name) {
                None => true,
                Some(record) => {
                    !record.nodes.contains(&self.node)
                        && (other_bytes.contains(*name) || self.complete(record, live))
                }
            })
            .collect();
        self.removable_since
            .retain(|name, _| removable.contains(name));
        let mut due = Vec::new();
        for name in removable {
            let since = *self.removable_since.entry(name.clone()).or_insert(now);
            if now.saturating_duration_since(since) >= self.grace {
                due.push(name.clone());
            }
        }
        due.sort();
        due
    }

    /// `name` was removed: its clock starts over should it appear again.
    pub fn handle_removed(&mut self, name: &str) {
        self.removable_since.remove(name);
    }
}
