//! The live nodes of one service as a watcher knows them: a plain state machine fed
//! with etcd's snapshot and events (no I/O), so its rules are tested without etcd.
//!
//! Order: `handle_snapshot` with a range read and its revision, then `handle_put` /
//! `handle_delete` for each event of the watch started at the revision after it. A new
//! snapshot (after a watch error or a compaction) replaces everything.

use std::collections::BTreeMap;

use crate::NodeRecord;

/// One node serving one service, as the registry holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node's id (the key's last part).
    pub node: String,
    /// What the node wrote.
    pub record: NodeRecord,
    /// The etcd lease the key is attached to: it changes when the node registers again
    /// after losing its lease.
    pub lease: i64,
    /// The etcd revision of the key's last write (a load report, draining).
    pub mod_revision: i64,
}

/// One key-value of etcd, as the table reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry<'a> {
    pub key: &'a str,
    pub value: &'a [u8],
    pub lease: i64,
    pub mod_revision: i64,
}

/// The nodes under one service prefix.
#[derive(Debug)]
pub(crate) struct MemberTable {
    prefix: String,
    nodes: BTreeMap<String, NodeInfo>,
    /// The revision the table is complete up to.
    revision: i64,
}

impl MemberTable {
    pub fn new(prefix: String) -> MemberTable {
        MemberTable {
            prefix,
            nodes: BTreeMap::new(),
            revision: 0,
        }
    }

    /// Replaces everything with a range read made at `revision`.
    pub fn handle_snapshot<'a>(
        &mut self,
        revision: i64,
        entries: impl IntoIterator<Item = Entry<'a>>,
    ) {
        self.nodes.clear();
        self.revision = revision;
        for entry in entries {
            self.insert(entry);
        }
    }

    /// A put event. Returns whether the table changed.
    pub fn handle_put(&mut self, entry: Entry<'_>) -> bool {
        self.revision = self.revision.max(entry.mod_revision);
        self.insert(entry)
    }

    /// A delete event (the key was deleted, or its lease expired or was revoked).
    /// Returns whether the table changed.
    pub fn handle_delete(&mut self, key: &str, mod_revision: i64) -> bool {
        self.revision = self.revision.max(mod_revision);
        let Some(node) = self.node_id(key) else {
            return false;
        };
        // A delete older than what the table holds is of an earlier incarnation.
        match self.nodes.get(node) {
            Some(info) if info.mod_revision < mod_revision => {
                let node = node.to_owned();
                self.nodes.remove(&node).is_some()
            }
            _ => false,
        }
    }

    /// The revision the table is complete up to: watch from the one after it.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Every node, by id.
    pub fn nodes(&self) -> Vec<NodeInfo> {
        self.nodes.values().cloned().collect()
    }

    fn node_id<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(&self.prefix)
            .filter(|rest| !rest.is_empty() && !rest.contains('/'))
    }

    fn insert(&mut self, entry: Entry<'_>) -> bool {
        let Some(node) = self.node_id(entry.key) else {
            return false;
        };
        if let Some(held) = self.nodes.get(node) {
            if held.mod_revision >= entry.mod_revision {
                return false; // already newer
            }
        }
        let record = match NodeRecord::from_json(entry.key, entry.value) {
            Ok(record) => record,
            Err(err) => {
                // One bad value must not hide the other nodes; the node is left out.
                tracing::warn!(%err, "cluster: ignoring a registry entry");
                return self.nodes.remove(node).is_some();
            }
        };
        self.nodes.insert(
            node.to_owned(),
            NodeInfo {
                node: node.to_owned(),
                record,
                lease: entry.lease,
                mod_revision: entry.mod_revision,
            },
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::test_record;

    const PREFIX: &str = "/rdmactor/c/services/echo/";

    fn value(node: &str, draining: bool, connections: u64) -> Vec<u8> {
        test_record(node, draining, connections).to_json()
    }

    fn entry<'a>(key: &'a str, value: &'a [u8], lease: i64, rev: i64) -> Entry<'a> {
        Entry {
            key,
            value,
            lease,
            mod_revision: rev,
        }
    }

    #[test]
    fn snapshot_then_events() {
        let mut t = MemberTable::new(PREFIX.into());
        let (a, b) = (value("a", false, 1), value("b", false, 2));
        let (ka, kb) = (format!("{PREFIX}a"), format!("{PREFIX}b"));
        t.handle_snapshot(10, [entry(&ka, &a, 7, 5), entry(&kb, &b, 8, 9)]);
        assert_eq!(t.revision(), 10);
        assert_eq!(t.nodes().len(), 2);
        let drain = value("a", true, 1);
        assert!(t.handle_put(entry(&ka, &drain, 7, 11)));
        assert!(t.nodes()[0].record.draining);
        assert!(t.handle_delete(&kb, 12));
        assert_eq!(t.nodes().len(), 1);
        assert_eq!(t.revision(), 12);
        // A new snapshot replaces everything.
        t.handle_snapshot(20, []);
        assert!(t.nodes().is_empty());
    }

    #[test]
    fn stale_events_do_not_resurrect_or_roll_back() {
        let mut t = MemberTable::new(PREFIX.into());
        let k = format!("{PREFIX}a");
        let (old, new) = (value("a", false, 1), value("a", true, 2));
        assert!(t.handle_put(entry(&k, &new, 9, 20)));
        assert!(
            !t.handle_put(entry(&k, &old, 7, 15)),
            "an older write is ignored"
        );
        assert!(t.nodes()[0].record.draining);
        assert!(!t.handle_delete(&k, 18), "a delete of an older incarnation");
        assert_eq!(t.nodes().len(), 1);
        assert!(t.handle_delete(&k, 21));
    }

    #[test]
    fn foreign_and_bad_keys_are_left_out() {
        let mut t = MemberTable::new(PREFIX.into());
        let good = value("a", false, 0);
        let deeper = format!("{PREFIX}a/extra");
        let other = "/rdmactor/c/services/files/a".to_string();
        let bad_key = format!("{PREFIX}b");
        assert!(!t.handle_put(entry(&deeper, &good, 1, 2)));
        assert!(!t.handle_put(entry(&other, &good, 1, 3)));
        assert!(!t.handle_put(entry(&bad_key, b"not json", 1, 4)));
        assert!(t.nodes().is_empty());
    }
}
