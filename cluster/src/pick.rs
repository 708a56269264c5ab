//! Node choice: plain functions over a list of nodes, no I/O.
//!
//! Both give an order to try nodes in, best first, draining nodes left out, so that a
//! caller whose first connect fails goes on to the next.
//! - [`by_load`]: least loaded first (connections, then pool use). Load reports are
//!   rate-limited, so a burst of connects from one process would all see the same
//!   "least loaded" node; the caller adds what it opened since each node's last report
//!   (`extra`), and ties are broken by a rendezvous hash of `salt`, so equal nodes share
//!   a burst instead of the first one taking it.
//! - [`by_rendezvous`]: rendezvous (highest random weight) hashing of a key: every client
//!   with the same list puts the key on the same node, and a node joining or leaving
//!   moves only about 1/n of the keys (those it wins or held), for placement that must
//!   be stable (a file's replicas, a shard).

use std::cmp::Ordering;

use crate::NodeInfo;

/// The rendezvous weight of `key` on `node`: BLAKE3 of both, so it is the same on every
/// host and Rust release (std's hashers promise neither).
pub fn rendezvous_weight(node: &str, key: &[u8]) -> u64 {
    let mut hasher = blake3::Hasher::new();
    // The length first: ("ab", "c") and ("a", "bc") must not hash alike.
    hasher.update(&(node.len() as u64).to_le_bytes());
    hasher.update(node.as_bytes());
    hasher.update(key);
    let hash = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash.as_bytes()[..8]);
    u64::from_le_bytes(first)
}

/// `items` in rendezvous order for `key`: highest weight first, ties (which need a
/// 64-bit collision) by id. The first R are the key's R replicas.
pub fn rendezvous_order<'a, T>(key: &[u8], items: &'a [T], id: impl Fn(&T) -> &str) -> Vec<&'a T> {
    let mut ranked: Vec<(u64, &T)> = items
        .iter()
        .map(|item| (rendezvous_weight(id(item), key), item))
        .collect();
    ranked.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| id(a.1).cmp(id(b.1))));
    ranked.into_iter().map(|(_, item)| item).collect()
}

/// The nodes that are not draining, in rendezvous order for `key`.
pub fn by_rendezvous<'a>(key: &[u8], nodes: &'a [NodeInfo]) -> Vec<&'a NodeInfo> {
    rendezvous_order(key, nodes, |n| n.node.as_str())
        .into_iter()
        .filter(|n| !n.record.draining)
        .collect()
}

/// The nodes that are not draining, least loaded first: by reported connections plus
/// `extra(node)` (what the caller opened since that report), then by pool use, then by
/// the rendezvous weight of `salt` (vary it per call to spread ties).
pub fn by_load<'a>(
    nodes: &'a [NodeInfo],
    extra: impl Fn(&NodeInfo) -> u64,
    salt: &[u8],
) -> Vec<&'a NodeInfo> {
    let mut ranked: Vec<(u64, f64, u64, &NodeInfo)> = nodes
        .iter()
        .filter(|n| !n.record.draining)
        .map(|n| {
            (
                n.record.load.connections.saturating_add(extra(n)),
                n.record.load.pool_use(),
                rendezvous_weight(&n.node, salt),
                n,
            )
        })
        .collect();
    ranked.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then_with(|| a.1.total_cmp(&b.1))
            .then_with(|| b.2.cmp(&a.2))
            .then_with(|| a.3.node.cmp(&b.3.node))
    });
    ranked.into_iter().map(|(_, _, _, n)| n).collect()
}

/// Orders two nodes by reported load alone (connections, then pool use): for display.
pub fn load_order(a: &NodeInfo, b: &NodeInfo) -> Ordering {
    a.record
        .load
        .connections
        .cmp(&b.record.load.connections)
        .then_with(|| {
            a.record
                .load
                .pool_use()
                .total_cmp(&b.record.load.pool_use())
        })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::record::test_record;

    fn node(id: &str, connections: u64, draining: bool) -> NodeInfo {
        NodeInfo {
            node: id.into(),
            record: test_record(id, draining, connections),
            lease: 1,
            mod_revision: 1,
        }
    }

    fn nodes(n: usize) -> Vec<NodeInfo> {
        (0..n)
            .map(|i| node(&format!("node-{i}"), 0, false))
            .collect()
    }

    fn owners(nodes: &[NodeInfo], keys: u32) -> Vec<String> {
        (0..keys)
            .map(|k| {
                by_rendezvous(format!("file-{k}").as_bytes(), nodes)[0]
                    .node
                    .clone()
            })
            .collect()
    }

    #[test]
    fn weights_are_stable_and_separate_node_from_key() {
        // Fixed values: a change here moves every placed key (it would need a migration).
        assert_eq!(rendezvous_weight("a", b"k"), rendezvous_weight("a", b"k"));
        assert_ne!(rendezvous_weight("ab", b"c"), rendezvous_weight("a", b"bc"));
        assert_ne!(rendezvous_weight("a", b"k1"), rendezvous_weight("a", b"k2"));
    }

    #[test]
    fn rendezvous_spreads_keys_evenly() {
        let nodes = nodes(5);
        let mut count: HashMap<String, u32> = HashMap::new();
        for owner in owners(&nodes, 20_000) {
            *count.entry(owner).or_default() += 1;
        }
        assert_eq!(count.len(), 5);
        for (node, n) in &count {
            // 4000 expected; ±10% is over 6 standard deviations.
            assert!(
                (3600..=4400).contains(n),
                "{node} got {n} of 20000: {count:?}"
            );
        }
    }

    #[test]
    fn adding_a_node_moves_about_one_nth_of_the_keys_and_only_to_it() {
        let before = nodes(5);
        let after = nodes(6);
        let (a, b) = (owners(&before, 20_000), owners(&after, 20_000));
        let moved: Vec<_> = a.iter().zip(&b).filter(|(x, y)| x != y).collect();
        // 1/6 of 20000 = 3333.
        assert!(
            (2900..=3800).contains(&moved.len()),
            "{} keys moved",
            moved.len()
        );
        assert!(moved.iter().all(|(_, to)| *to == "node-5"));
    }

    #[test]
    fn removing_a_node_moves_only_its_keys() {
        let all = nodes(5);
        let without: Vec<_> = all.iter().filter(|n| n.node != "node-2").cloned().collect();
        let (a, b) = (owners(&all, 5000), owners(&without, 5000));
        for (x, y) in a.iter().zip(&b) {
            if x != "node-2" {
                assert_eq!(x, y);
            }
        }
    }

    #[test]
    fn rendezvous_order_gives_distinct_replicas_and_skips_draining() {
        let mut nodes = nodes(4);
        let order = by_rendezvous(b"f", &nodes);
        assert_eq!(order.len(), 4);
        let first = order[0].node.clone();
        let second = order[1].node.clone();
        nodes
            .iter_mut()
            .find(|n| n.node == first)
            .unwrap()
            .record
            .draining = true;
        let order = by_rendezvous(b"f", &nodes);
        assert_eq!(order.len(), 3);
        // The next in line takes over; the others keep their places.
        assert_eq!(order[0].node, second);
    }

    #[test]
    fn least_loaded_first_draining_never() {
        let nodes = vec![
            node("a", 10, false),
            node("b", 3, false),
            node("c", 0, true),
            node("d", 5, false),
        ];
        let order: Vec<_> = by_load(&nodes, |_| 0, b"x")
            .iter()
            .map(|n| n.node.as_str())
            .collect();
        assert_eq!(order, ["b", "d", "a"]);
        // What the caller opened since the last report counts.
        let order: Vec<_> = by_load(&nodes, |n| if n.node == "b" { 4 } else { 0 }, b"x")
            .iter()
            .map(|n| n.node.as_str())
            .collect();
        assert_eq!(order, ["d", "b", "a"]);
        assert!(by_load(&[node("c", 0, true)], |_| 0, b"x").is_empty());
    }

    #[test]
    fn least_loaded_breaks_ties_by_salt_and_pool_use() {
        let nodes = nodes(3);
        let mut firsts: HashMap<String, u32> = HashMap::new();
        for i in 0..3000u32 {
            let first = by_load(&nodes, |_| 0, &i.to_le_bytes())[0].node.clone();
            *firsts.entry(first).or_default() += 1;
        }
        assert_eq!(firsts.len(), 3, "ties spread: {firsts:?}");
        assert!(firsts.values().all(|&n| n > 800), "{firsts:?}");
        let mut nodes = nodes;
        nodes[1].record.load.pool_bytes = 1;
        nodes[1].record.load.pool_max_bytes = 2;
        for i in 0..100u32 {
            assert_ne!(by_load(&nodes, |_| 0, &i.to_le_bytes())[0].node, "node-1");
        }
    }

    #[test]
    fn a_burst_spreads_when_the_caller_counts_its_own_connections() {
        // 300 connects from one process between two load reports: what ClusterClient
        // does. Every node gets its share, within one.
        let nodes = nodes(3);
        let mut opened: HashMap<String, u64> = HashMap::new();
        for i in 0..300u32 {
            let pick = by_load(
                &nodes,
                |n| opened.get(&n.node).copied().unwrap_or(0),
                &i.to_le_bytes(),
            )[0]
            .node
            .clone();
            *opened.entry(pick).or_default() += 1;
        }
        assert!(opened.values().all(|&n| n == 100), "{opened:?}");
    }
}
