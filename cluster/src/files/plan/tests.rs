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
            gone: order[0].clone(),
            from: order[1].clone(),
            to: order[2].clone(),
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
    assert_eq!((due[0].gone.as_str(), due[0].to.as_str()), ("a", "c"));
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
    for (node, p) in live.iter().zip(each.iter_mut()) {
        let mine = p.poll_repairs(t0 + grace, &files);
        assert!(
            mine.iter().all(|r| &r.to == node),
            "{node} plans only copies to itself"
        );
        shared.extend(mine);
    }
    let key = |r: &Repair| r.name.clone();
    expected.sort_by_key(key);
    shared.sort_by_key(key);
    assert_eq!(shared, expected, "each copy planned once, by its target");
    assert!(
        live.iter()
            .filter(|n| shared.iter().any(|r| &r.to == *n))
            .count()
            > 1,
        "the copies spread over the nodes"
    );
}
