//! A cluster across the wire (issue 33, "Must show"): three servers on hosts a, b and c,
//! each next to a member of a three-member etcd cluster, and every client on host d,
//! the four hosts one Soft-RoCE wire (`scripts/wire --hosts 4`). Real verbs, real etcd,
//! RoCE packets between four VMs.
//!
//! One test, in order, because each step starts from what the last one left:
//! 1. files uploaded with R = 2 from d, each fetched back with the SHA-256 d computed
//!    of its source;
//! 2. 300 echo clients on d, placed through the registry: each server's share of the
//!    connections, counted as QPs on the server's own device;
//! 3. host b SIGKILLed while those clients echo and more uploads run: the clients on b
//!    move off it (each move timed from the kill, against the dead-peer bound plus the
//!    lease TTL), etcd keeps its quorum, every upload either is acknowledged or fails
//!    with a reason, new clients started one after another from the kill each get their
//!    first answer within the lease TTL plus the dial bound (issue 47, item 4), and the
//!    servers themselves (`--repair-after-secs`) restore R = 2 for b's files, each copy
//!    made by the node it goes to;
//! 4. b boots again, its etcd member rejoins (removed and added again: its data died
//!    with its tmpfs) and its server registers and gets the next clients;
//! 5. host a cut off (netem loss 100% on its NIC): its lease lapses on the majority side,
//!    new clients go to b and c only, and every acknowledged file still comes back whole.
//!
//! Run: `scripts/wire --hosts 4 --driver <the wire_cluster test binary> --nocapture`
//! (docs/testing.md). `RDMACTOR_WIRE_FILES` (100) and `RDMACTOR_WIRE_FILE_MAX_MIB` (16)
//! size step 1, `RDMACTOR_WIRE_CLIENTS` (300) step 2; `RDMACTOR_WIRE_PARTITION_ONLY=1`
//! skips steps 2 to 4 (60 echo sessions, then step 5). Without a wire of four hosts the
//! test skips.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rdmactor::runtime::ConnectionConfig;
use rdmactor_cluster::DEFAULT_DIAL_TIMEOUT;
use rdmactor_tests::cluster_wire::{
    all_urls, bin, client_url, etcdctl, fetch_all, four_hosts, ft_cluster, parse_uploads, qps,
    records, secs, sh, upload_script, wait_listing, Cluster, ServerSetup, CLUSTER,
    ETCD_ELECTION_MS, PORT, SERVERS, TTL,
};
use rdmactor_tests::wire::{Host, Wire};

/// How long the servers wait before repairing the files of a node gone from the
/// registry, in seconds.
const REPAIR_GRACE_SECS: &str = "10";

/// The servers of these tests: stores on the hosts' tmpfs, public fetch, repair.
fn setup() -> ServerSetup {
    let flags = [
        "--files-public-fetch",
        // The servers repair: each copies onto itself the files of a node gone longer
        // than this (step 3).
        "--repair-after-secs",
        REPAIR_GRACE_SECS,
        "--repair-every-secs",
        "2",
        // Step 2's 300 clients all come from d: about 100 on each server, more than the
        // 64 one address may hold by default.
        "--max-connections-per-peer",
        "0",
    ];
    ServerSetup {
        store: |_| "/tmp/store".to_owned(),
        flags: flags.map(str::to_owned).to_vec(),
        per_host: |_| Vec::new(),
    }
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The size of file `i`: 1 MiB to `max_mib` MiB, odd byte counts, spread evenly.
fn size_of(i: usize, max_mib: usize) -> usize {
    let span = (max_mib.max(1) - 1) << 20;
    (1 << 20)
        + if span == 0 {
            i * 7
        } else {
            (i * 7_340_033 + i * i * 4099) % span
        }
}

/// `MOVED node N (ADDR): why` lines the echo client printed so far.
fn moves(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.strip_prefix("MOVED "))
        .map(str::to_owned)
        .collect()
}

/// Follows the echo client's output after a fault at `fault`: the moves off `node` as
/// they appear (each with its time after the fault), until `expected` moved or `limit`.
fn follow_moves(
    wire: &Wire,
    job: &str,
    node: &str,
    before: usize,
    expected: usize,
    fault: Instant,
    limit: Duration,
) -> Vec<Duration> {
    let prefix = format!("node {node} ");
    let mut times = Vec::new();
    loop {
        let all = moves(&wire.stdout_so_far(Host::D, job));
        let off: usize = all[before.min(all.len())..]
            .iter()
            .filter(|m| m.starts_with(&prefix))
            .count();
        while times.len() < off {
            times.push(fault.elapsed());
        }
        if times.len() >= expected || fault.elapsed() > limit || wire.ended(Host::D, job) {
            return times;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_cluster_of_three_serves_d_through_a_killed_host_and_a_partition() {
    let Some(wire) = four_hosts() else { return };
    let files_n = env_usize("RDMACTOR_WIRE_FILES", 100);
    let max_mib = env_usize("RDMACTOR_WIRE_FILE_MAX_MIB", 16);
    let clients = env_usize("RDMACTOR_WIRE_CLIENTS", 300);
    let bound = ConnectionConfig::default()
        .dead_peer_bound()
        .expect("keepalive");
    let t0 = Instant::now();
    // Outcomes that do not stop the next step are collected and asserted at the end, so
    // that one run reports every figure.
    let mut missed: Vec<String> = Vec::new();

    // --- The cluster: etcd on a, b, c; a server next to each. --------------------------
    let mut cluster = Cluster::start(&wire, "faults", setup());
    let base = cluster.base.clone();
    let all3 = |n: &BTreeSet<String>| n.len() == 3;

    // --- 1. Files with R = 2 from d, fetched back whole. -------------------------------
    let files: Vec<(String, usize)> = (0..files_n)
        .map(|i| (format!("f{i:03}.bin"), size_of(i, max_mib)))
        .collect();
    let bytes: usize = files.iter().map(|(_, s)| s).sum();
    let t = Instant::now();
    let job = sh(
        &wire,
        Host::D,
        &upload_script(&files, &ft_cluster(None, &all_urls())),
        Duration::from_secs(3600),
    );
    let put_secs = t.elapsed();
    let (mut acked, failed) = parse_uploads(&job.stdout);
    assert!(
        failed.is_empty() && acked.len() == files_n,
        "uploads: {} acknowledged of {files_n}, failed {failed:?}\n{}",
        acked.len(),
        job.stderr
    );
    for (name, f) in &acked {
        assert_eq!(f.nodes.len(), 2, "{name}: {f:?}");
    }
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for f in acked.values() {
        for n in &f.nodes {
            *per_node.entry(n.as_str()).or_default() += 1;
        }
    }
    println!(
        "[1] {files_n} files, 1 to {max_mib} MiB, {:.0} MiB in all, put with R = 2 in {} \
         (generated and summed on d, {:.1} MiB/s of replicas); replicas per node {per_node:?}",
        bytes as f64 / 1048576.0,
        secs(put_secs),
        2.0 * bytes as f64 / 1048576.0 / put_secs.as_secs_f64()
    );
    // Each is fetched back after b's kill (step 3), the SHA-256 of the copy compared
    // with the source's.

    let client = bin("client");
    let urls = all_urls();
    // `RDMACTOR_WIRE_PARTITION_ONLY=1` goes from step 1 straight to step 5, with the 60
    // echo sessions step 4 leaves for it: the partition in about a quarter of the time.
    let partition_only = std::env::var("RDMACTOR_WIRE_PARTITION_ONLY").as_deref() == Ok("1");
    let (echo, a_pre60) = if partition_only {
        println!(
            "[2-4] skipped (RDMACTOR_WIRE_PARTITION_ONLY=1): 60 echo sessions, then the partition"
        );
        let a_pre60 = qps(&wire, Host::A);
        let echo = wire.spawn(
            Host::D,
            &[
                &client,
                "--cluster",
                CLUSTER,
                "--etcd",
                &urls,
                "echo",
                "--connections",
                "60",
                "--forever",
            ],
        );
        wire.wait_for_output(Host::D, &echo, "connected 60", Duration::from_secs(300));
        (echo, a_pre60)
    } else {
        // --- 2. Clients on d through discovery, spread over a, b, c. -----------------------
        let n = clients.to_string();
        let echo = wire.spawn(
            Host::D,
            &[
                &client,
                "--cluster",
                CLUSTER,
                "--etcd",
                &urls,
                "echo",
                "--connections",
                &n,
                "--forever",
            ],
        );
        let t = Instant::now();
        wire.wait_for_output(
            Host::D,
            &echo,
            &format!("connected {clients}"),
            Duration::from_secs(600),
        );
        let connect_secs = t.elapsed();
        let spread: BTreeMap<Host, u64> = SERVERS
            .iter()
            .map(|h| (*h, qps(&wire, *h) - base[h]))
            .collect();
        let total: u64 = spread.values().sum();
        let fair = clients as f64 / 3.0;
        let shares: Vec<String> = spread
            .iter()
            .map(|(h, c)| {
                format!(
                    "{}: {c} ({:+.1}%)",
                    h.name(),
                    (*c as f64 / fair - 1.0) * 100.0
                )
            })
            .collect();
        println!(
            "[2] {clients} echo sessions from d connected in {} through the registry: {}",
            secs(connect_secs),
            shares.join(", ")
        );
        assert_eq!(total, clients as u64, "QPs on the servers: {spread:?}");
        for (h, c) in &spread {
            let off = (*c as f64 / fair - 1.0).abs();
            if off > 0.2 {
                missed.push(format!(
                    "{h:?} holds {c} of {clients}: off by more than 20%"
                ));
            }
        }

        // --- 3. Host b SIGKILLed mid-workload. ----------------------------------------------
        let on_b = spread[&Host::B] as usize;
        let moved_before = moves(&wire.stdout_so_far(Host::D, &echo)).len();
        let more: Vec<(String, usize)> = (0..12)
            .map(|i| (format!("k{i:03}.bin"), size_of(i + 31, max_mib.min(4))))
            .collect();
        let uploads = wire.spawn(
            Host::D,
            &[
                "bash",
                "-c",
                &upload_script(&more, &ft_cluster(None, &all_urls())),
            ],
        );
        // Some acknowledged before the kill, more in flight.
        let deadline = Instant::now() + Duration::from_secs(900);
        while wire
            .stdout_so_far(Host::D, &uploads)
            .matches("GOOD")
            .count()
            < 3
        {
            assert!(
                Instant::now() < deadline && !wire.ended(Host::D, &uploads),
                "the second uploads never got going: {:#?}",
                wire.wait(Host::D, &uploads, Duration::from_secs(1))
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let (acked_before_kill, _) = parse_uploads(&wire.stdout_so_far(Host::D, &uploads));
        // Counted now: the servers start repairing once b has been gone for the grace
        // period, while the fetches below still run.
        let on_b_files = records(&wire, &all_urls())
            .values()
            .filter(|nodes| nodes.iter().any(|n| n == "b"))
            .count();
        wire.kill(Host::B);
        let killed = Instant::now();
        // New clients, one after another from the kill on, each with 12 sessions (the
        // issue's reproduction): until b's lease lapses the least loaded pick lands on b,
        // listed but dead, once the others pass its last report, and must cost at most
        // the dial bound before the next node (issue 47, item 4). With 4 sessions each,
        // a run saw none of them dial b (c alone was below b's report).
        let newcomers = wire.spawn(Host::D, &["bash", "-c", &newcomers_script(&client, &urls)]);
        cluster.servers.remove(&Host::B);
        cluster.etcd.remove(&Host::B);
        println!(
            "[3] host b SIGKILLed with {on_b} echo sessions on it and uploads under way \
             ({} acknowledged before the kill)",
            acked_before_kill.len()
        );
        let ac = [Host::A, Host::C].map(client_url).join(",");
        let lapsed = wait_listing(&wire, &ac, "echo", bound + TTL * 4, |n| !n.contains("b"));
        let gone_after = killed.elapsed();
        let times = follow_moves(
            &wire,
            &echo,
            "b",
            moved_before,
            on_b,
            killed,
            (bound + TTL) * 2,
        );
        let all_moves = moves(&wire.stdout_so_far(Host::D, &echo));
        let fresh = &all_moves[moved_before.min(all_moves.len())..];
        println!(
            "[3] b left the registry {} after the kill (lease TTL {}; the read took {})",
            secs(gone_after),
            secs(TTL),
            secs(lapsed)
        );
        if let (Some(first), Some(last)) = (times.first(), times.last()) {
            let mut sorted = times.clone();
            sorted.sort();
            println!(
                "[3] {} of {on_b} sessions moved off b: first {}, median {}, last {} after the kill \
                 (bound: dead-peer {} + lease TTL {} = {})",
                times.len(),
                secs(*first),
                secs(sorted[sorted.len() / 2]),
                secs(*last),
                secs(bound),
                secs(TTL),
                secs(bound + TTL)
            );
        }
        for m in fresh.iter().take(3) {
            println!("      e.g. MOVED {m}");
        }
        let others = fresh.iter().filter(|m| !m.starts_with("node b ")).count();
        println!("[3] moves off a or c meanwhile: {others}");
        assert!(
            !wire.ended(Host::D, &echo),
            "the echo client ended: {:#?}",
            wire.wait(Host::D, &echo, Duration::from_secs(1))
        );
        if times.len() != on_b {
            missed.push(format!("{} of {on_b} sessions moved off b", times.len()));
        }
        if let Some(last) = times.last().filter(|t| **t > bound + TTL) {
            missed.push(format!(
                "the last session moved off b {} after the kill, beyond {}",
                secs(*last),
                secs(bound + TTL)
            ));
        }
        let arrived = wire.wait(Host::D, &newcomers, Duration::from_secs(300));
        let firsts = newcomer_times(&arrived.stdout);
        let limit = TTL + DEFAULT_DIAL_TIMEOUT;
        let list = |of: fn(&Newcomer) -> Duration| {
            firsts
                .iter()
                .map(|n| secs(of(n)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "[3] {} new clients started one after another from the kill: first answer after {} \
             (limit: lease TTL {} + dial bound {} = {}); all {NEWCOMER_SESSIONS} sessions \
             answered and closed after {}; {} dialled b",
            firsts.len(),
            list(|n| n.first),
            secs(TTL),
            secs(DEFAULT_DIAL_TIMEOUT),
            secs(limit),
            list(|n| n.whole),
            firsts.iter().filter(|n| n.dialled_b).count()
        );
        if firsts.len() != NEWCOMERS {
            missed.push(format!(
                "{} of {NEWCOMERS} new clients got an answer after the kill: {arrived:#?}",
                firsts.len()
            ));
        }
        for n in firsts.iter().filter(|n| n.first > limit) {
            missed.push(format!(
                "a new client's first answer took {} after the kill's dead node, beyond {}",
                secs(n.first),
                secs(limit)
            ));
        }
        // etcd keeps its quorum: a and c answer, and a write goes through.
        let status = etcdctl(&wire, &ac, "endpoint status -w table");
        assert_eq!(status.status, 0, "{status:#?}");
        let put = etcdctl(&wire, &ac, "put /wire-check/quorum after-b-died");
        assert_eq!(put.status, 0, "a write without b: {put:#?}");
        println!(
            "[3] etcd: a and c keep the quorum (a write went through):\n{}",
            status.stdout.trim_end()
        );

        let done = wire.wait(Host::D, &uploads, Duration::from_secs(1800));
        let (more_acked, more_failed) = parse_uploads(&done.stdout);
        for (name, why) in &more_failed {
            println!("[3] upload {name} failed: {why}");
        }
        assert_eq!(
            more_acked.len() + more_failed.len(),
            more.len(),
            "an upload neither acknowledged nor failed with a reason: {done:#?}"
        );
        let after_kill: Vec<&String> = more_acked
            .keys()
            .filter(|n| !acked_before_kill.contains_key(*n))
            .collect();
        println!(
            "[3] second uploads: {} acknowledged ({} of them after the kill), {} failed with a reason",
            more_acked.len(),
            after_kill.len(),
            more_failed.len()
        );
        acked.extend(more_acked);
        // The 300 sessions have shown what they were for; under TCG their echoes take most
        // of every host's one vCPU, which the copies below need.
        assert!(
            !wire.ended(Host::D, &echo),
            "the echo client ended: {:#?}",
            wire.wait(Host::D, &echo, Duration::from_secs(1))
        );
        wire.kill_job_quietly(Host::D, &echo);
        let t = Instant::now();
        let from = fetch_all(&wire, &acked, &ft_cluster(None, &all_urls()));
        println!(
            "[3] all {} acknowledged files ({files_n} of step 1) fetched whole on d with b dead,          SHA-256 equal to the source's, in {} (served by {from:?})",
            acked.len(),
            secs(t.elapsed())
        );
        assert!(!from.contains_key("b"), "served by the dead b: {from:?}");

        // Repair, by the servers: after the grace period each of b's files is copied by
        // the node it goes to (a or c), which records it.
        let deadline = Instant::now() + Duration::from_secs(1800);
        loop {
            let recs = records(&wire, &ac);
            let left = recs
                .values()
                .filter(|nodes| nodes.iter().any(|n| n == "b") || nodes.len() < 2)
                .count();
            if left == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{left} records still name b or have fewer than 2 nodes"
            );
            std::thread::sleep(Duration::from_secs(2));
        }
        let repaired_by = |h: Host| {
            let out = wire.stdout_so_far(h, &cluster.servers[&h]);
            out.lines()
                .filter(|l| l.contains("cluster: REPAIRED "))
                .inspect(|l| assert!(l.ends_with(&format!(" to={}", h.name())), "{l}"))
                .count()
        };
        println!(
            "[3] repair by the servers (grace {REPAIR_GRACE_SECS} s): {on_b_files} records named b when it was killed; all at R = 2 on a and c when checked, {} after the kill, after the fetches above (copies made by a: {}, by c: {})",
            secs(killed.elapsed()),
            repaired_by(Host::A),
            repaired_by(Host::C)
        );

        // --- 4. b boots again and rejoins. ---------------------------------------------------
        // Load on a and c first: 60 echo sessions (they stay for step 5).
        let n = "60";
        let a_pre60 = qps(&wire, Host::A);
        let echo = wire.spawn(
            Host::D,
            &[
                &client,
                "--cluster",
                CLUSTER,
                "--etcd",
                &urls,
                "echo",
                "--connections",
                n,
                "--forever",
            ],
        );
        wire.wait_for_output(Host::D, &echo, "connected 60", Duration::from_secs(300));
        wire.boot(Host::B);
        let booted = Instant::now();
        cluster.rejoin_etcd(Host::B);
        cluster.start_server(Host::B);
        wait_listing(&wire, &all_urls(), "echo", Duration::from_secs(60), all3);
        println!(
            "[4] b booted, its etcd member replaced and healthy, its server registered {} after the boot",
            secs(booted.elapsed())
        );
        let b_before = qps(&wire, Host::B);
        let newcomers = thirty_new_connections(&wire, &client, &urls);
        let b_got = qps(&wire, Host::B) - b_before;
        let placed = wire
            .wait(Host::D, &newcomers, Duration::from_secs(120))
            .ok("30 new connections");
        println!("[4] of 30 new connections from d, b (the least loaded) took {b_got}");
        // A connect the cluster client moved to another node says why (the last run saw
        // b take 6 of 30 with nothing to tell why).
        let moved: Vec<&str> = placed
            .stderr
            .lines()
            .filter(|l| l.contains("connect failed"))
            .collect();
        println!(
            "[4] connects that failed and went to another node: {}",
            moved.len()
        );
        for line in moved.iter().take(5) {
            println!("[4]   {line}");
        }
        if b_got < 15 {
            missed.push(format!("b took {b_got} of 30 new connections"));
        }
        (echo, a_pre60)
    };

    // --- 5. a cut off by netem loss 100%. ------------------------------------------------
    let bc = [Host::B, Host::C].map(client_url).join(",");
    let on_a = moves(&wire.stdout_so_far(Host::D, &echo)).len();
    let a_sessions = qps(&wire, Host::A).saturating_sub(a_pre60) as usize;
    println!("[5] a holds {a_sessions} of the 60 echo sessions");
    wire.netem(Host::A, "loss 100%");
    let cut = Instant::now();
    wait_listing(&wire, &bc, "echo", TTL * 6 + Duration::from_secs(30), |n| {
        !n.contains("a")
    });
    println!(
        "[5] a cut off (netem loss 100%): unlisted {} after the cut (lease TTL {}, etcd election timeout {} ms)",
        secs(cut.elapsed()),
        secs(TTL),
        ETCD_ELECTION_MS
    );
    let times = follow_moves(&wire, &echo, "a", on_a, a_sessions, cut, (bound + TTL) * 2);
    println!(
        "[5] {} of about {a_sessions} sessions on a moved off it, the last {} after the cut",
        times.len(),
        times.last().map_or("-".into(), |d| secs(*d))
    );
    if times.len() < a_sessions {
        missed.push(format!(
            "{} of {a_sessions} sessions moved off a",
            times.len()
        ));
    }
    if let Some(last) = times.last().filter(|t| **t > bound + TTL) {
        missed.push(format!(
            "the last session moved off a {} after the cut, beyond {}",
            secs(*last),
            secs(bound + TTL)
        ));
    }
    let a_before = qps(&wire, Host::A);
    let bc_before = qps(&wire, Host::B) + qps(&wire, Host::C);
    let picks = thirty_new_connections(&wire, &client, &urls);
    let bc_got = (qps(&wire, Host::B) + qps(&wire, Host::C)).saturating_sub(bc_before);
    let picked = wire.wait(Host::D, &picks, Duration::from_secs(120));
    let a_after = qps(&wire, Host::A);
    println!(
        "[5] 30 new connections with a cut off: status {}, b and c gained {bc_got} QPs, a {} -> {a_after}",
        picked.status, a_before
    );
    assert_eq!(picked.status, 0, "{picked:#?}");
    assert!(a_after <= a_before, "a gained connections while cut off");
    assert!(
        bc_got >= 30,
        "b and c gained {bc_got} QPs for 30 new connections"
    );
    let t = Instant::now();
    let from = fetch_all(&wire, &acked, &ft_cluster(None, &all_urls()));
    println!(
        "[5] all {} acknowledged files fetched whole with a cut off by `ft --cluster` given \
         every etcd member, a's first, in {} (served by {from:?})",
        acked.len(),
        secs(t.elapsed())
    );
    assert!(!from.contains_key("a"));
    wire.netem_off(Host::A);
    assert!(
        !wire.ended(Host::D, &echo),
        "the echo client ended: {:#?}",
        wire.wait(Host::D, &echo, Duration::from_secs(1))
    );
    wire.kill_job_quietly(Host::D, &echo);
    println!("done in {}", secs(t0.elapsed()));
    assert!(missed.is_empty(), "not as the issue asks: {missed:#?}");
}

/// The `RESULT` line's `key=value` fields of a `client` run.
fn result_fields(out: &str) -> BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| l.strip_prefix("RESULT "))
        .flat_map(str::split_whitespace)
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The bench row of issue 33: connection setup and the echo round trip through the
/// cluster client, next to a direct connect, all from d. Setup: `client connect` opens
/// 60 connections one after another, `--addr` of a (direct) or `--cluster` (each one
/// placed through the registry: least loaded, a watch of the service's prefix read
/// once per process). Round trip: `client latency`, 64 B, 2,000 echoes on one
/// connection, opened directly or through the cluster client.
#[test]
fn cluster_client_setup_and_round_trip_next_to_a_direct_connect() {
    let Some(wire) = four_hosts() else { return };
    let _cluster = Cluster::start(&wire, "bench", setup());
    let client = bin("client");
    let urls = all_urls();
    let direct = format!("{}:{PORT}", Host::A.ip());
    let via = |cluster: bool, run: &[&str]| {
        let mut cmd: Vec<&str> = vec![&client];
        if cluster {
            cmd.extend(["--cluster", CLUSTER, "--etcd", &urls]);
        } else {
            cmd.extend(["--addr", &direct]);
        }
        cmd.extend_from_slice(run);
        let t = Instant::now();
        let job = wire
            .run(Host::D, &cmd, Duration::from_secs(600))
            .ok("client");
        (result_fields(&job.stdout), t.elapsed())
    };
    let connect = ["connect", "--connections", "60"];
    let latency = ["latency", "--size", "64", "--iters", "2000"];
    println!("| from d | direct (`--addr` of a) | through the cluster client |");
    println!("|---|---|---|");
    for round in 0..2 {
        let (d, d_wall) = via(false, &connect);
        let (c, c_wall) = via(true, &connect);
        let d_rate: f64 = d["conn_per_s"].parse().unwrap();
        let c_rate: f64 = c["conn_per_s"].parse().unwrap();
        assert_eq!(d["connections"], "60");
        assert_eq!(c["connections"], "60");
        println!(
            "| connection setup, 60 one after another (round {}) | {:.1} ms each ({} with the process) | {:.1} ms each ({} with the process) |",
            round + 1,
            1000.0 / d_rate,
            secs(d_wall),
            1000.0 / c_rate,
            secs(c_wall)
        );
        let (d, _) = via(false, &latency);
        let (c, _) = via(true, &latency);
        let us = |r: &BTreeMap<String, String>, k: &str| -> f64 {
            r.get(k)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {k} in {r:?}"))
        };
        println!(
            "| echo round trip, 64 B, 2000 on one connection (round {}) | p50 {:.0} us, p99 {:.0} us | p50 {:.0} us, p99 {:.0} us |",
            round + 1,
            us(&d, "p50_us"),
            us(&d, "p99_us"),
            us(&c, "p50_us"),
            us(&c, "p99_us")
        );
    }
}

/// New clients started one after another after b's kill.
const NEWCOMERS: usize = 6;
/// The sessions each new client opens (the reproduction), one after another.
const NEWCOMER_SESSIONS: usize = 12;

/// A shell loop on d: [`NEWCOMERS`] `client echo` runs of [`NEWCOMER_SESSIONS`]
/// sessions and one request each, one after another, each printing `NEWCOMER FIRST WHOLE
/// B` (its first answer and its whole run in ms, and whether a dial failed: with a and c
/// alive, only b's can).
fn newcomers_script(client: &str, urls: &str) -> String {
    format!(
        "for i in $(seq {NEWCOMERS}); do s=$(date +%s%N); \
         out=$(RUST_LOG=warn,rdmactor_cluster=info {client} --cluster {CLUSTER} --etcd {urls} \
               echo --connections {NEWCOMER_SESSIONS} --requests 1 2>&1); rc=$?; e=$(date +%s%N); \
         b=0; case \"$out\" in *'connect failed'*) b=1;; esac; \
         f=$(printf '%s\\n' \"$out\" | sed -n 's/^FIRST-ANSWER .*answered_ms=\\([0-9]*\\).*/\\1/p'); \
         [ $rc -eq 0 ] && echo \"NEWCOMER ${{f:-none}} $(( (e - s) / 1000000 )) $b\" || echo \"NEWCOMER-FAILED $rc $out\"; \
         done"
    )
}

/// One new client's run: its first answer (`FIRST-ANSWER`, from the program's start),
/// the whole run (all its sessions connected, each answered, closed), and whether it
/// dialled b.
struct Newcomer {
    first: Duration,
    whole: Duration,
    dialled_b: bool,
}

/// The newcomers' runs, from the script's `NEWCOMER first_ms whole_ms b` lines.
fn newcomer_times(out: &str) -> Vec<Newcomer> {
    out.lines()
        .filter_map(|l| {
            let mut f = l.strip_prefix("NEWCOMER ")?.split_whitespace();
            let ms = |f: &mut std::str::SplitWhitespace| f.next()?.parse().ok();
            Some(Newcomer {
                first: Duration::from_millis(ms(&mut f)?),
                whole: Duration::from_millis(ms(&mut f)?),
                dialled_b: f.next()? == "1",
            })
        })
        .collect()
}

/// Starts 30 new connections from d through the cluster client, held for 10 s, and
/// returns once they are all up (the job's name, to wait for its end).
fn thirty_new_connections(wire: &Wire, client: &str, urls: &str) -> String {
    let job = wire.spawn(
        Host::D,
        &[
            "env",
            // The cluster client's INFO lines name each failed connect and its node.
            "RUST_LOG=warn,rdmactor_cluster=info",
            client,
            "--cluster",
            CLUSTER,
            "--etcd",
            urls,
            "connect",
            "--connections",
            "30",
            "--hold",
            "10",
        ],
    );
    wire.wait_for_output(
        Host::D,
        &job,
        "RESULT kind=connect",
        Duration::from_secs(120),
    );
    job
}
