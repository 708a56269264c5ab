use std::collections::{HashMap, HashSet};

use super::*;

fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("node-{i}")).collect()
}

fn verified(digest: &str) -> Verified {
    Verified {
        alg: "sha256".into(),
        digest: digest.into(),
        size: 10,
    }
}

fn record(nodes: &[&str]) -> FileRecord {
    FileRecord {
        alg: "sha256".into(),
        digest: "d".into(),
        size: 10,
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
        owner: None,
    }
}

#[test]
fn an_upload_goes_to_the_first_r_in_rendezvous_order() {
    let nodes = ids(5);
    let order: Vec<String> = replica_order("f.bin", &nodes)
        .into_iter()
        .cloned()
        .collect();
    let mut plan = UploadPlan::new("f.bin", &nodes, 2);
    let first = plan.poll_target().unwrap();
    assert_eq!(first, order[0]);
    assert!(plan.outcome().is_none());
    plan.handle_good(first.clone(), verified("d"));
    let second = plan.poll_target().unwrap();
    assert_eq!(second, order[1]);
    plan.handle_good(second.clone(), verified("d"));
    assert_eq!(plan.poll_target(), None);
    let placed = plan.outcome().unwrap().unwrap();
    assert_eq!(placed.nodes, [first, second]);
    assert_eq!(placed.digest, "d");
}

#[test]
fn a_failed_node_is_replaced_by_the_next_in_order() {
    let nodes = ids(4);
    let order: Vec<String> = replica_order("g", &nodes).into_iter().cloned().collect();
    let mut plan = UploadPlan::new("g", &nodes, 2);
    let a = plan.poll_target().unwrap();
    plan.handle_good(a, verified("d"));
    let b = plan.poll_target().unwrap();
    plan.handle_failed(b, "connection lost".into());
    let c = plan.poll_target().unwrap();
    assert_eq!(c, order[2]);
    plan.handle_good(c.clone(), verified("d"));
    assert_eq!(
        plan.outcome().unwrap().unwrap().nodes,
        [order[0].clone(), c]
    );
}

#[test]
fn too_few_nodes_is_an_error_naming_each_failure() {
    let nodes = ids(2);
    let mut plan = UploadPlan::new("h", &nodes, 2);
    let a = plan.poll_target().unwrap();
    plan.handle_good(a.clone(), verified("d"));
    let b = plan.poll_target().unwrap();
    plan.handle_failed(b.clone(), "rejected: out of space".into());
    assert_eq!(plan.poll_target(), None);
    let err = plan.outcome().unwrap().unwrap_err();
    let text = err.to_string();
    assert!(text.contains("1 of 2 replicas"), "{text}");
    assert!(
        text.contains(&format!("node {b}: rejected: out of space")),
        "{text}"
    );
    assert!(text.contains(&a), "{text}");
    // One node for R = 2 and nothing failed: says no other node is listed.
    let mut plan = UploadPlan::new("h", &ids(1), 2);
    let only = plan.poll_target().unwrap();
    plan.handle_good(only, verified("d"));
    assert!(plan
        .outcome()
        .unwrap()
        .unwrap_err()
        .to_string()
        .contains("no other node listed"));
}

#[test]
fn replicas_that_disagree_are_an_error() {
    let mut plan = UploadPlan::new("i", &ids(3), 2);
    let a = plan.poll_target().unwrap();
    plan.handle_good(a.clone(), verified("d1"));
    let b = plan.poll_target().unwrap();
    plan.handle_good(b.clone(), verified("d2"));
    assert_eq!(plan.poll_target(), None, "no third node after a mismatch");
    let err = plan.outcome().unwrap().unwrap_err();
    assert!(matches!(err, PlacementError::DigestMismatch { .. }));
    let text = err.to_string();
    assert!(
        text.contains(&format!("node {a} verified d1")) && text.contains("d2"),
        "{text}"
    );
}

#[test]
fn fetches_try_listed_replicas_first() {
    let r = record(&["a", "b", "c"]);
    assert_eq!(fetch_order(&r, &["c".into(), "x".into()]), ["c", "a", "b"]);
    assert_eq!(fetch_order(&r, &[]), ["a", "b", "c"]);
}

#[test]
fn a_node_gone_past_the_grace_period_is_replaced_by_the_next_in_order() {
    let t0 = Instant::now();
    let grace = Duration::from_secs(10);
    let mut planner = RepairPlanner::new(grace);
    let all = ids(4);
    let order: Vec<String> = replica_order("f", &all).into_iter().cloned().collect();
    let files = vec![("f".to_string(), record(&[&order[0], &order[1]]))];
    planner.handle_live(all.clone());
    assert!(planner.poll_repairs(t0, &files).is_empty(), "all there");
    // order[0] leaves.
    let live: Vec<String> = all.iter().filter(|n| **n != order[0]).cloned().collect();
    planner.handle_live(live.clone());
    assert!(planner.poll_repairs(t0, &files).is_empty(), "just left");
    assert!(
        planner.poll_repairs(t0 + grace / 2, &files).is_empty(),
        "within the grace period"
    );
    assert_eq!(planner.gone_for(t0 + grace / 2, &order[0]), Some(grace / 2));
    let due = planner.poll_repairs(t0 + grace, &files);
    assert_eq!(
        due,
        [Repair {
            name: "f".into(),
            gone: Some(order[0].clone()),
            from: order[1].clone(),
            to: order[2].clone(),
            ahead: Vec::new(),
        }]
    );
}

#[test]
fn a_node_back_within_the_grace_period_is_forgiven() {
    let t0 = Instant::now();
    let grace = Duration::from_secs(10);
    let mut planner = RepairPlanner::new(grace);
    let files = vec![("f".to_string(), record(&["a", "b"]))];
    planner.handle_live(vec!["b".into(), "c".into()]);
    assert!(planner.poll_repairs(t0, &files).is_empty());
    planner.handle_live(vec!["a".into(), "b".into(), "c".into()]);
    assert_eq!(planner.gone_for(t0, "a"), None);
    planner.handle_live(vec!["b".into(), "c".into()]);
    // Gone again from t0 + 8 s: its clock starts over.
    assert!(planner
        .poll_repairs(t0 + Duration::from_secs(8), &files)
        .is_empty());
    assert!(planner
        .poll_repairs(t0 + Duration::from_secs(12), &files)
        .is_empty());
    let due = planner.poll_repairs(t0 + Duration::from_secs(18), &files);
    assert_eq!(due.len(), 1);
    assert_eq!(
        (due[0].gone.as_deref(), due[0].to.as_str()),
        (Some("a"), "c")
    );
}

/// A record naming fewer than R nodes, all listed (an upload that verified one replica
/// of two: its server recorded the copy, the client heard an error, and nothing else
/// would ever add the second), gets a copy to the next node in order once it has been
/// short for the grace period. Before, such records stayed at R = 1 (a squatter's
/// upload to one server makes one in the wire nemesis).
#[test]
fn a_record_short_of_r_gets_a_copy_after_the_grace_period() {
    let t0 = Instant::now();
    let grace = Duration::from_secs(10);
    let all = ids(3);
    let order: Vec<String> = replica_order("f", &all).into_iter().cloned().collect();
    let files = vec![("f".to_string(), record(&[&order[0]]))];
    let mut planner = RepairPlanner::new(grace);
    planner.handle_live(all.clone());
    assert!(
        planner.poll_repairs(t0, &files).is_empty(),
        "an upload under way may still place its next replica"
    );
    assert!(planner.poll_repairs(t0 + grace / 2, &files).is_empty());
    let due = planner.poll_repairs(t0 + grace, &files);
    assert_eq!(
        due,
        [Repair {
            name: "f".into(),
            gone: None,
            from: order[0].clone(),
            to: order[1].clone(),
            ahead: Vec::new(),
        }]
    );
    // Once it names R nodes its clock is reset: short again, it waits the grace anew.
    let full = vec![("f".to_string(), record(&[&order[0], &order[1]]))];
    assert!(planner.poll_repairs(t0 + grace, &full).is_empty());
    assert!(planner.poll_repairs(t0 + grace * 2, &files).is_empty());
    // With R = 1 it is not short.
    let mut one = RepairPlanner::new(grace).with_replicas(1);
    one.handle_live(all);
    assert!(one.poll_repairs(t0, &files).is_empty());
    assert!(one.poll_repairs(t0 + grace * 2, &files).is_empty());
}

#[test]
fn no_source_or_no_spare_node_means_no_repair() {
    let t0 = Instant::now();
    let mut planner = RepairPlanner::new(Duration::ZERO);
    // Both replicas gone: nothing to copy from.
    planner.handle_live(vec!["c".into()]);
    assert!(planner
        .poll_repairs(t0, &[("f".into(), record(&["a", "b"]))])
        .is_empty());
    // One gone, but every live node already holds it.
    planner.handle_live(vec!["b".into()]);
    assert!(planner
        .poll_repairs(t0, &[("f".into(), record(&["a", "b"]))])
        .is_empty());
}

#[test]
fn planners_for_each_node_share_the_copies_out_with_none_twice() {
    let t0 = Instant::now();
    let grace = Duration::from_secs(5);
    let all = ids(5);
    let gone = all[0].clone();
    let live: Vec<String> = all[1..].to_vec();
    // 40 files, each on two nodes, every one of them on the node that goes.
    let files: Vec<(String, FileRecord)> = (0..40)
        .map(|i| {
            let name = format!("f{i}");
            let other = &live[i % live.len()];
            (name, record(&[&gone, other]))
        })
        .collect();
    let mut whole = RepairPlanner::new(grace);
    let mut each: Vec<RepairPlanner> = live
        .iter()
        .map(|n| RepairPlanner::for_node(grace, n))
        .collect();
    for p in std::iter::once(&mut whole).chain(each.iter_mut()) {
        p.handle_live(live.clone());
        assert!(
            p.poll_repairs(t0, &files).is_empty(),
            "within the grace period"
        );
    }
    let mut expected = whole.poll_repairs(t0 + grace, &files);
    assert_eq!(expected.len(), 40, "every file is due");
    let mut shared: Vec<Repair> = Vec::new();
    let mut after_asking: Vec<Repair> = Vec::new();
    for (node, p) in live.iter().zip(each.iter_mut()) {
        let mine = p.poll_repairs(t0 + grace, &files);
        assert!(
            mine.iter().all(|r| &r.to == node),
            "{node} plans only copies to itself"
        );
        // The others plan theirs only after asking the nodes before them.
        let (first, later): (Vec<Repair>, Vec<Repair>) =
            mine.into_iter().partition(|r| r.ahead.is_empty());
        shared.extend(first);
        after_asking.extend(later);
    }
    let key = |r: &Repair| r.name.clone();
    expected.sort_by_key(key);
    shared.sort_by_key(key);
    assert_eq!(shared, expected, "each copy planned once, by its target");
    for r in &after_asking {
        let first = expected.iter().find(|e| e.name == r.name).unwrap();
        assert_eq!(r.ahead[0], first.to, "{r:?} asks the target first");
        assert!(!r.ahead.contains(&r.to) && r.ahead.len() <= MAX_AHEAD);
    }
    assert!(
        live.iter()
            .filter(|n| shared.iter().any(|r| &r.to == *n))
            .count()
            > 1,
        "the copies spread over the nodes"
    );
}

/// One file on [order[0], order[1]] of `all`, and order[0] gone from the planner's view.
fn one_gone(planner: &mut RepairPlanner, all: &[String]) -> Vec<(String, FileRecord)> {
    let order: Vec<String> = replica_order("f", all).into_iter().cloned().collect();
    let files = vec![("f".to_string(), record(&[&order[0], &order[1]]))];
    planner.handle_live(all.iter().filter(|n| **n != order[0]).cloned().collect());
    files
}

#[test]
fn a_failed_copy_waits_twice_as_long_each_time_up_to_the_cap() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut planner = RepairPlanner::new(Duration::ZERO).with_backoff(s(10), s(40));
    let files = one_gone(&mut planner, &ids(5));
    let mut now = t0;
    for want in [10, 20, 40, 40, 40] {
        let due = planner.poll_repairs(now, &files);
        assert_eq!(due.len(), 1, "due again at {:?}", now - t0);
        assert_eq!(
            planner.handle_failed(now, &due[0], FailureKind::Source),
            s(want)
        );
        assert!(
            planner
                .poll_repairs(now + s(want) - s(1), &files)
                .is_empty(),
            "not proposed again within {want} s"
        );
        now += s(want);
    }
    // Made: the next failure waits the base again.
    let due = planner.poll_repairs(now, &files);
    planner.handle_done(&due[0]);
    assert_eq!(
        planner.handle_failed(now, &due[0], FailureKind::Source),
        s(10)
    );
}

#[test]
fn each_kind_of_failure_backs_off_on_its_own_and_any_pending_wait_holds_the_file() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut b = Backoff::new(s(1), s(100));
    assert!(b.ready(t0, "f"));
    assert_eq!(b.handle_failure(t0, "f", FailureKind::Source), s(1));
    assert_eq!(b.handle_failure(t0, "f", FailureKind::Source), s(2));
    assert_eq!(b.handle_failure(t0, "f", FailureKind::Source), s(4));
    // Another kind starts at the base; the file waits for the longest.
    assert_eq!(b.handle_failure(t0, "f", FailureKind::Locked), s(1));
    assert!(!b.ready(t0 + s(3), "f"));
    assert!(b.ready(t0 + s(4), "f"));
    assert!(b.ready(t0, "g"), "other files do not wait");
    // However many failures: the cap, no overflow.
    for _ in 0..200 {
        b.handle_failure(t0, "h", FailureKind::Target);
    }
    assert_eq!(b.handle_failure(t0, "h", FailureKind::Target), s(100));
    b.retain(|f| f != "h");
    assert!(b.ready(t0, "h"), "forgotten with its file");
    b.handle_success("f");
    assert!(b.ready(t0, "f"));
}

#[test]
fn a_target_holding_other_bytes_is_passed_over_for_the_next_node() {
    let t0 = Instant::now();
    let all = ids(6);
    let order: Vec<String> = replica_order("f", &all).into_iter().cloned().collect();
    let mut planner = RepairPlanner::new(Duration::ZERO);
    let files = one_gone(&mut planner, &all);
    let due = planner.poll_repairs(t0, &files);
    assert_eq!(due[0].to, order[2]);
    planner.handle_other_bytes("f", &order[2]);
    let due = planner.poll_repairs(t0, &files);
    assert_eq!(due[0].to, order[3], "no wait: the next node, at once");
    planner.handle_other_bytes("f", &order[3]);
    assert_eq!(planner.poll_repairs(t0, &files)[0].to, order[4]);
    // What was learned goes once the file is repaired.
    planner.handle_done(&due[0]);
    assert_eq!(planner.poll_repairs(t0, &files)[0].to, order[2]);
}

#[test]
fn a_servers_planner_asks_the_nodes_before_it_and_goes_no_further_than_max_ahead() {
    let t0 = Instant::now();
    let all = ids(MAX_AHEAD + 5);
    let order: Vec<String> = replica_order("f", &all).into_iter().cloned().collect();
    let planner_of = |node: &String| {
        let mut p = RepairPlanner::for_node(Duration::ZERO, node);
        let files = one_gone(&mut p, &all);
        (p, files)
    };
    // Candidates are order[2..]: the first copies at once, the next asks it first.
    let (mut p, files) = planner_of(&order[2]);
    assert_eq!(p.poll_repairs(t0, &files)[0].ahead, Vec::<String>::new());
    let (mut p, files) = planner_of(&order[3]);
    let due = p.poll_repairs(t0, &files);
    assert_eq!(
        (due[0].to.as_str(), due[0].ahead.clone()),
        (order[3].as_str(), vec![order[2].clone()])
    );
    // Once order[2] was seen holding other bytes, order[3] copies without asking.
    p.handle_other_bytes("f", &order[2]);
    assert!(p.poll_repairs(t0, &files)[0].ahead.is_empty());
    // MAX_AHEAD nodes before it: still asks; one more: leaves it to them.
    let (mut p, files) = planner_of(&order[2 + MAX_AHEAD]);
    assert_eq!(p.poll_repairs(t0, &files)[0].ahead.len(), MAX_AHEAD);
    let (mut p, files) = planner_of(&order[3 + MAX_AHEAD]);
    assert!(p.poll_repairs(t0, &files).is_empty());
    // Nodes that leave are forgotten as holders of other bytes.
    let (mut p, files) = planner_of(&order[3]);
    p.handle_other_bytes("f", &order[2]);
    let without: Vec<String> = all
        .iter()
        .filter(|n| **n != order[0] && **n != order[2])
        .cloned()
        .collect();
    p.handle_live(without);
    let back: Vec<String> = all.iter().filter(|n| **n != order[0]).cloned().collect();
    p.handle_live(back);
    assert_eq!(p.poll_repairs(t0, &files)[0].ahead, [order[2].clone()]);
}

#[test]
fn fetches_fall_back_on_live_nodes_outside_the_record_in_rendezvous_order() {
    let all = ids(5);
    let order: Vec<String> = replica_order("f", &all).into_iter().cloned().collect();
    let r = record(&[&order[1], &order[3]]);
    assert_eq!(
        fallback_order("f", &r, &all),
        [order[0].clone(), order[2].clone(), order[4].clone()]
    );
}

#[test]
fn a_file_that_needs_no_repair_any_more_forgets_its_waits() {
    let t0 = Instant::now();
    let all = ids(4);
    let mut planner = RepairPlanner::new(Duration::ZERO);
    let files = one_gone(&mut planner, &all);
    let due = planner.poll_repairs(t0, &files);
    planner.handle_failed(t0, &due[0], FailureKind::Changed);
    planner.handle_other_bytes("f", &due[0].to);
    assert!(planner.poll_repairs(t0, &files).is_empty(), "waiting");
    // Repaired by another: not due, and what was learned goes.
    let repaired = vec![("f".to_string(), record(&[&due[0].to, &due[0].from]))];
    assert!(planner.poll_repairs(t0, &repaired).is_empty());
    // Due again later (the same node gone again): at once, to the first choice.
    let again = planner.poll_repairs(t0, &files);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].to, due[0].to);
}

/// `n` files, each on node-0 and node-1.
fn many(n: usize) -> Vec<(String, FileRecord)> {
    (0..n)
        .map(|i| (format!("f{i}"), record(&["node-0", "node-1"])))
        .collect()
}

#[test]
fn a_scrub_asks_about_each_file_once_per_period_a_few_at_a_time_oldest_first() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut planner = RepairPlanner::new(s(30)).with_scrub(s(60), 2);
    planner.handle_live(ids(3));
    let files = many(5);
    let rounds: Vec<Vec<Scrub>> = (0..4).map(|_| planner.poll_scrubs(t0, &files)).collect();
    let sizes: Vec<usize> = rounds.iter().map(Vec::len).collect();
    assert_eq!(sizes, [2, 2, 1, 0]);
    assert_eq!(rounds[0][0].nodes, ["node-0", "node-1"]);
    let mut asked: Vec<&String> = rounds.iter().flatten().map(|s| &s.name).collect();
    asked.sort();
    asked.dedup();
    assert_eq!(asked.len(), 5, "each file once");
    assert!(planner.poll_scrubs(t0 + s(59), &files).is_empty());
    let again = planner.poll_scrubs(t0 + s(60), &files);
    assert_eq!(again.len(), 2);
    // Without with_scrub: nothing is ever asked.
    let mut plain = RepairPlanner::new(s(30));
    plain.handle_live(ids(3));
    assert!(plain.poll_scrubs(t0, &files).is_empty());
}

#[test]
fn a_replica_found_without_the_recorded_bytes_is_replaced_at_once_from_another() {
    let t0 = Instant::now();
    let all = ids(4);
    let order: Vec<String> = replica_order("f", &all).into_iter().cloned().collect();
    let files = vec![("f".to_string(), record(&[&order[0], &order[1]]))];
    let mut planner = RepairPlanner::new(Duration::from_secs(30));
    planner.handle_live(all.clone());
    assert!(planner.poll_repairs(t0, &files).is_empty());
    planner.handle_scrubbed("f", &order[0], Found::Missing);
    let due = planner.poll_repairs(t0, &files);
    assert_eq!(
        (
            due[0].gone.as_deref(),
            due[0].from.as_str(),
            due[0].to.as_str()
        ),
        (
            Some(order[0].as_str()),
            order[1].as_str(),
            order[2].as_str()
        ),
        "no grace period, not copied from the lost node"
    );
    planner.handle_scrubbed("f", &order[0], Found::Recorded);
    assert!(planner.poll_repairs(t0, &files).is_empty(), "found again");
    planner.handle_scrubbed("f", &order[1], Found::OtherBytes);
    assert_eq!(planner.poll_repairs(t0, &files)[0].from, order[0]);
    planner.handle_scrubbed("f", &order[0], Found::OtherBytes);
    assert!(
        planner.poll_repairs(t0, &files).is_empty(),
        "no source left"
    );
}

#[test]
fn inside_the_servers_the_node_a_repair_would_go_to_asks_about_the_file() {
    let t0 = Instant::now();
    let all = ids(4);
    let s = Duration::from_secs;
    let files = many(12);
    let mut asked: Vec<(String, String)> = Vec::new();
    for node in &all {
        let mut p = RepairPlanner::for_node(s(30), node).with_scrub(s(60), 100);
        p.handle_live(all.clone());
        for scrub in p.poll_scrubs(t0, &files) {
            asked.push((scrub.name, node.clone()));
        }
    }
    asked.sort();
    assert_eq!(asked.len(), files.len(), "each file by one node: {asked:?}");
    for (name, node) in &asked {
        let first = replica_order(name, &all)
            .into_iter()
            .find(|n| *n != "node-0" && *n != "node-1")
            .unwrap();
        assert_eq!(node, first, "{name}");
    }
}

#[test]
fn a_name_no_record_lists_here_is_removed_only_once_seen_so_for_the_grace_period() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut c = Collector::new("me", s(100), s(10));
    assert!(c.poll_round(t0));
    assert!(!c.poll_round(t0 + s(9)));
    assert!(c.poll_round(t0 + s(10)));
    let held: Vec<String> = ["mine", "orphan", "extra", "squat"]
        .map(String::from)
        .to_vec();
    let mut files: HashMap<String, FileRecord> = [
        ("mine", record(&["me", "x"])),
        ("extra", record(&["x", "y"])),
        ("squat", record(&["x", "y"])),
    ]
    .into_iter()
    .map(|(n, r)| (n.to_string(), r))
    .collect();
    // x lives, y does not: neither record names R = 2 live nodes.
    let live: HashSet<String> = ["me".to_string(), "x".to_string()].into();
    assert_eq!(c.to_ask(&held, &files, &live), ["extra", "squat"]);
    // "extra" holds the recorded bytes, "squat" other bytes.
    let other: HashSet<String> = ["squat".to_string()].into();
    assert!(c.poll_removals(t0, &held, &files, &live, &other).is_empty());
    assert!(c
        .poll_removals(t0 + s(99), &held, &files, &live, &other)
        .is_empty());
    assert_eq!(
        c.poll_removals(t0 + s(100), &held, &files, &live, &other),
        ["orphan", "squat"]
    );
    // Recorded here meanwhile (a put that finished): kept, and its clock starts over.
    files.insert("orphan".into(), record(&["me", "x"]));
    assert_eq!(
        c.poll_removals(t0 + s(110), &held, &files, &live, &other),
        ["squat"]
    );
    files.remove("orphan");
    assert_eq!(
        c.poll_removals(t0 + s(120), &held, &files, &live, &other),
        ["squat"]
    );
    c.handle_removed("squat");
    let held: Vec<String> = held.into_iter().filter(|n| n != "squat").collect();
    assert!(c
        .poll_removals(t0 + s(219), &held, &files, &live, &other)
        .is_empty());
    assert_eq!(
        c.poll_removals(t0 + s(220), &held, &files, &live, &other),
        ["orphan"]
    );
}

#[test]
fn an_extra_copy_of_the_recorded_bytes_goes_once_its_record_names_r_live_nodes() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut c = Collector::new("me", s(100), s(10)).with_replicas(2);
    let held = vec!["extra".to_string()];
    let files: HashMap<String, FileRecord> = [("extra".to_string(), record(&["x", "y"]))].into();
    let none = HashSet::new();
    // y down: the copy here may be the one a repair records; asked, and kept.
    let one_live: HashSet<String> = ["me", "x"].map(String::from).into();
    assert_eq!(c.to_ask(&held, &files, &one_live), ["extra"]);
    assert!(c
        .poll_removals(t0, &held, &files, &one_live, &none)
        .is_empty());
    assert!(c
        .poll_removals(t0 + s(200), &held, &files, &one_live, &none)
        .is_empty());
    // Both listed nodes live: not asked; removed once so for the whole grace period.
    let all_live: HashSet<String> = ["me", "x", "y"].map(String::from).into();
    assert!(c.to_ask(&held, &files, &all_live).is_empty());
    assert!(c
        .poll_removals(t0 + s(210), &held, &files, &all_live, &none)
        .is_empty());
    // y flaps: the clock starts over.
    assert!(c
        .poll_removals(t0 + s(250), &held, &files, &one_live, &none)
        .is_empty());
    assert!(c
        .poll_removals(t0 + s(349), &held, &files, &all_live, &none)
        .is_empty());
    assert!(c
        .poll_removals(t0 + s(448), &held, &files, &all_live, &none)
        .is_empty());
    assert_eq!(
        c.poll_removals(t0 + s(449), &held, &files, &all_live, &none),
        ["extra"]
    );
    // With R = 3 the same record is short, and the copy stays.
    let mut r3 = Collector::new("me", s(100), s(10)).with_replicas(3);
    assert_eq!(r3.to_ask(&held, &files, &all_live), ["extra"]);
    assert!(r3
        .poll_removals(t0, &held, &files, &all_live, &none)
        .is_empty());
    assert!(r3
        .poll_removals(t0 + s(200), &held, &files, &all_live, &none)
        .is_empty());
}

#[test]
fn a_gone_node_on_a_record_that_every_live_node_holds_is_forgotten_by_its_first_live_node() {
    let t0 = Instant::now();
    let grace = Duration::from_secs(10);
    let files = vec![("f".to_string(), record(&["a", "b", "c"]))];
    let mut a = RepairPlanner::for_node(grace, "a");
    let mut c = RepairPlanner::for_node(grace, "c");
    for p in [&mut a, &mut c] {
        p.handle_live(vec!["a".into(), "c".into()]);
        assert!(
            p.poll_forgets(t0, &files).is_empty(),
            "within the grace period"
        );
        // No copy can be made: every live node holds the file.
        assert!(p.poll_repairs(t0 + grace, &files).is_empty());
    }
    let due = a.poll_forgets(t0 + grace, &files);
    assert_eq!(
        due,
        [Forget {
            name: "f".into(),
            gone: "b".into()
        }]
    );
    assert!(
        c.poll_forgets(t0 + grace, &files).is_empty(),
        "a writes, not c"
    );
    // A live node outside the record: a copy replaces b instead.
    a.handle_live(vec!["a".into(), "c".into(), "d".into()]);
    assert!(a.poll_forgets(t0 + grace, &files).is_empty());
    // b back: nothing to forget.
    a.handle_live(vec!["a".into(), "b".into(), "c".into()]);
    assert!(a.poll_forgets(t0 + grace * 2, &files).is_empty());
}
