//! Scrubbing: now and then each listed replica is asked what it holds, so that a node
//! that lost its copy (a disk replaced, a file removed by hand) or holds other bytes
//! under the name is noticed and replaced, instead of the file being one replica short
//! until a fetch happens to find out. Plain like the rest: the caller passes `now`.
//!
//! Who asks: inside the servers, the node a repair of the file would go to (the first
//! live node in rendezvous order that the record does not list), so that each file is
//! asked about by one node per period, and what it learns drives its own repair (the
//! copy goes to itself). A planner of every copy asks about every file. What one node
//! learned stays with it: if that node itself holds other bytes under the name (so it
//! cannot take the copy), the file stays a replica short until its next scrub after
//! those bytes are gone (a clean-up removes them, see [`Collector`](super::Collector)).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::{replica_order, FileRecord, RepairPlanner};

/// The listed nodes to ask what they hold under `name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scrub {
    /// The file.
    pub name: String,
    /// Its record's nodes that are listed now.
    pub nodes: Vec<String>,
}

/// What a node answered when asked about a file its record lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// The recorded bytes.
    Recorded,
    /// No file of that name.
    Missing,
    /// Other bytes under the name.
    OtherBytes,
}

/// How often each file is asked about, how many per round, and when each last was.
#[derive(Debug)]
pub(super) struct Scrubbing {
    every: Duration,
    per_round: usize,
    last: HashMap<String, Instant>,
}

impl RepairPlanner {
    /// Asks about each file's listed replicas once every `every`, at most `per_round`
    /// files per [`poll_scrubs`](Self::poll_scrubs) (the oldest first).
    pub fn with_scrub(mut self, every: Duration, per_round: usize) -> Self {
        self.scrub = Some(Scrubbing {
            every,
            per_round: per_round.max(1),
            last: HashMap::new(),
        });
        self
    }

    /// The files whose listed nodes to ask now (none without
    /// [`with_scrub`](Self::with_scrub)); answer each node with
    /// [`handle_scrubbed`](Self::handle_scrubbed).
    #[must_use]
    pub fn poll_scrubs(&mut self, now: Instant, files: &[(String, FileRecord)]) -> Vec<Scrub> {
        let Some(scrub) = self.scrub.as_mut() else {
            return Vec::new();
        };
        let names: HashSet<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        scrub.last.retain(|name, _| names.contains(name.as_str()));
        let mut due: Vec<(Option<Instant>, &String, &FileRecord)> = files
            .iter()
            .map(|(name, record)| (scrub.last.get(name).copied(), name, record))
            .filter(|(last, ..)| {
                last.is_none_or(|t| now.saturating_duration_since(t) >= scrub.every)
            })
            .collect();
        // Never asked about first, then the longest ago.
        due.sort_by_key(|(last, ..)| *last);
        let mut asks = Vec::new();
        for (_, name, record) in due {
            let mine = match &self.only_to {
                None => true,
                Some(me) => replica_order(name, &self.live)
                    .into_iter()
                    .find(|n| !record.nodes.contains(n))
                    .is_some_and(|first| first == me),
            };
            if mine && asks.len() >= scrub.per_round {
                continue;
            }
            // Not this node's to ask about: looked at again next period.
            scrub.last.insert(name.clone(), now);
            if !mine {
                continue;
            }
            let nodes: Vec<String> = record
                .nodes
                .iter()
                .filter(|n| self.live.contains(n))
                .cloned()
                .collect();
            if !nodes.is_empty() {
                asks.push(Scrub {
                    name: name.clone(),
                    nodes,
                });
            }
        }
        asks
    }

    /// `node`, listed for `name`, answered `found`: without the recorded bytes it is
    /// replaced at the next [`poll_repairs`](Self::poll_repairs), with no grace period.
    pub fn handle_scrubbed(&mut self, name: &str, node: &str, found: Found) {
        match found {
            Found::Recorded => {
                if let Some(lost) = self.lost.get_mut(name) {
                    lost.remove(node);
                }
            }
            Found::Missing | Found::OtherBytes => {
                self.lost
                    .entry(name.to_owned())
                    .or_default()
                    .insert(node.to_owned());
            }
        }
    }
}
