//! The nodes of one service that did not answer a connect lately: a plain state machine
//! (the caller passes `now`), so its rules are tested without a network.
//!
//! Why: a node whose host died stays listed until its lease lapses, and a connect to it
//! waits the whole dial bound before the next node is tried. Without a memory every
//! new connect would pay that bound again, each time the dead node came first; with it,
//! only the first does. The rules:
//!
//! - A node that did not answer (no answer within the dial bound, unreachable, nothing
//!   listening) is suspect for `hold`.
//! - Suspect nodes go after every other node, in the order they had: still tried, last,
//!   so a cluster whose only live node was wrongly suspected still gets its connection.
//! - A node that answers (a connection, or a refusal: its server said no) is suspect no
//!   longer.
//! - Suspicion is of one incarnation of a node: a node that registers again (a new
//!   lease) starts clean, and a node the registry no longer lists is forgotten.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::NodeInfo;

/// Until when one incarnation of a node is suspect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Suspicion {
    lease: i64,
    until: Instant,
}

/// The suspect nodes of one service, by node id.
#[derive(Debug, Clone)]
pub(crate) struct Suspects {
    hold: Duration,
    nodes: HashMap<String, Suspicion>,
}

impl Suspects {
    /// Nodes stay suspect for `hold` after they last failed to answer.
    pub fn new(hold: Duration) -> Suspects {
        Suspects {
            hold,
            nodes: HashMap::new(),
        }
    }

    /// `node` did not answer at `now`.
    pub fn suspect(&mut self, node: &NodeInfo, now: Instant) {
        let until = now + self.hold;
        self.nodes.insert(
            node.node.clone(),
            Suspicion {
                lease: node.lease,
                until,
            },
        );
    }

    /// `node` answered.
    pub fn answered(&mut self, node: &str) {
        self.nodes.remove(node);
    }

    /// Whether `node` (this incarnation of it) is suspect at `now`.
    pub fn is_suspect(&self, node: &NodeInfo, now: Instant) -> bool {
        self.nodes
            .get(&node.node)
            .is_some_and(|s| s.lease == node.lease && now < s.until)
    }

    /// Forgets nodes `listed` (the registry's current list) no longer holds, or holds
    /// with another lease, and suspicions past their time.
    pub fn forget_unlisted(&mut self, listed: &[NodeInfo], now: Instant) {
        self.nodes.retain(|id, s| {
            now < s.until && listed.iter().any(|n| n.node == *id && n.lease == s.lease)
        });
    }

    /// `order` with its suspect nodes moved to the end, each part in the order it had.
    pub fn to_back(&self, order: Vec<NodeInfo>, now: Instant) -> Vec<NodeInfo> {
        let (mut first, last): (Vec<NodeInfo>, Vec<NodeInfo>) =
            order.into_iter().partition(|n| !self.is_suspect(n, now));
        first.extend(last);
        first
    }

    /// The ids of the nodes suspect at `now`, sorted.
    pub fn suspected(&self, now: Instant) -> Vec<String> {
        let mut ids: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, s)| now < s.until)
            .map(|(id, _)| id.clone())
            .collect();
        ids.sort();
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::test_record;

    fn node(id: &str, lease: i64) -> NodeInfo {
        NodeInfo {
            node: id.into(),
            record: test_record(id, false, 0),
            lease,
            mod_revision: 1,
        }
    }

    fn ids(order: &[NodeInfo]) -> Vec<&str> {
        order.iter().map(|n| n.node.as_str()).collect()
    }

    const HOLD: Duration = Duration::from_secs(30);

    #[test]
    fn a_suspect_goes_last_until_its_suspicion_expires() {
        let t0 = Instant::now();
        let (a, b, c) = (node("a", 1), node("b", 2), node("c", 3));
        let mut s = Suspects::new(HOLD);
        s.suspect(&a, t0);
        let order = vec![a.clone(), b.clone(), c.clone()];
        assert_eq!(ids(&s.to_back(order.clone(), t0)), ["b", "c", "a"]);
        let almost = t0 + HOLD - Duration::from_millis(1);
        assert!(s.is_suspect(&a, almost));
        assert_eq!(ids(&s.to_back(order.clone(), almost)), ["b", "c", "a"]);
        assert!(!s.is_suspect(&a, t0 + HOLD), "expired at its hold");
        assert_eq!(ids(&s.to_back(order, t0 + HOLD)), ["a", "b", "c"]);
        assert!(s.suspected(t0 + HOLD).is_empty());
    }

    #[test]
    fn suspects_keep_their_own_order_behind_the_others() {
        let t0 = Instant::now();
        let nodes: Vec<NodeInfo> = ["a", "b", "c", "d"]
            .iter()
            .enumerate()
            .map(|(i, id)| node(id, i as i64))
            .collect();
        let mut s = Suspects::new(HOLD);
        s.suspect(&nodes[2], t0);
        s.suspect(&nodes[0], t0 + Duration::from_secs(1));
        assert_eq!(
            ids(&s.to_back(nodes.clone(), t0 + Duration::from_secs(2))),
            ["b", "d", "a", "c"]
        );
        assert_eq!(s.suspected(t0 + Duration::from_secs(2)), ["a", "c"]);
        // Every node suspect: all still tried, in their order.
        for n in &nodes {
            s.suspect(n, t0);
        }
        assert_eq!(ids(&s.to_back(nodes, t0)), ["a", "b", "c", "d"]);
    }

    #[test]
    fn an_answer_clears_suspicion_and_a_new_failure_restarts_it() {
        let t0 = Instant::now();
        let a = node("a", 1);
        let mut s = Suspects::new(HOLD);
        s.suspect(&a, t0);
        s.answered("a");
        assert!(!s.is_suspect(&a, t0));
        let later = t0 + Duration::from_secs(20);
        s.suspect(&a, later);
        assert!(s.is_suspect(&a, t0 + HOLD), "held from the last failure");
        assert!(!s.is_suspect(&a, later + HOLD));
    }

    #[test]
    fn a_node_that_registers_again_or_leaves_the_registry_is_forgotten() {
        let t0 = Instant::now();
        let (a, b) = (node("a", 1), node("b", 2));
        let mut s = Suspects::new(HOLD);
        s.suspect(&a, t0);
        s.suspect(&b, t0);
        // a restarted: listed again under a new lease. Not suspect, and forgotten.
        let a_again = node("a", 7);
        assert!(!s.is_suspect(&a_again, t0));
        s.forget_unlisted(&[a_again.clone(), b.clone()], t0);
        assert_eq!(s.suspected(t0), ["b"]);
        // b's lease lapsed: the registry dropped it.
        s.forget_unlisted(std::slice::from_ref(&a_again), t0);
        assert!(s.suspected(t0).is_empty());
        // Listed again with its old lease (a watch that had missed the delete): clean.
        assert!(!s.is_suspect(&b, t0));
    }

    #[test]
    fn expired_suspicions_are_dropped_from_memory() {
        let t0 = Instant::now();
        let a = node("a", 1);
        let mut s = Suspects::new(HOLD);
        s.suspect(&a, t0);
        s.forget_unlisted(std::slice::from_ref(&a), t0 + HOLD);
        assert!(s.nodes.is_empty());
    }
}
