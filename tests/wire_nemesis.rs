//! A nemesis across the wire (issue 47, item 5), as Jepsen tests a database: the
//! cluster of `wire_cluster` (an etcd member and a `server --cluster` on each of a, b
//! and c, clients on d, `scripts/wire --hosts 4`), keyed as docs/operations.md sets it
//! up, takes uploads and fetches from d while a seeded schedule injects, one server at
//! a time, faults drawn from:
//! - **kill**: the host's VM SIGKILLed, down a while, booted; its etcd member (whose
//!   data lived on the host's tmpfs) removed and added again, its server started on its
//!   store, which survived (the stores are on the repository's disk, shared with the
//!   host: see [`store`]);
//! - **cut**: the host cut off, etcd and clients alike, by carrier off (`link down`) or
//!   `netem loss 100%`, then healed;
//! - **wipe**: the server SIGKILLed, its store emptied, the server started again;
//! - **squat**: mallory, a client with a key of its own, uploads junk under names the
//!   load has not uploaded yet, to the first two nodes of each name's rendezvous order
//!   (different junk on each), and under names already acknowledged, to the next node
//!   in order that the record does not name.
//!
//! After each fault is healed the schedule waits until every record that existed then
//! names R = 2 live nodes holding its bytes (the pause for repair), then draws the
//! next. With R = 2 of three servers, one faulted server at a time leaves a live copy
//! of every file; two overlapping disk losses would lose files by design, not by bug.
//!
//! At the end, with every host back and the load stopped: every record names R live
//! nodes that each hold the recorded bytes (hashed on this machine, where the stores
//! are), timed from the last fault's heal; every acknowledged file is fetched whole
//! from d (SHA-256 equal to its source's, recorded digest too); after the clean-up
//! grace no store holds a file that no record lists for its node. The run prints the
//! seed and the schedule first, and a summary line last.
//!
//! Run: `RDMACTOR_NEMESIS_SEED=N RDMACTOR_NEMESIS_SECS=240 scripts/wire --hosts 4
//! --driver scripts/lib/run-test-binaries <file naming this test binary> --nocapture`
//! (docs/testing.md, "The nemesis"). Without the seed one is drawn and printed; the
//! schedule is a function of the seed alone, so a failing one replays.
//! `RDMACTOR_NEMESIS_PRELOAD=N` uploads N files before the first fault, so that every
//! wiped store and every host down holds repair at scale (N = 180 leaves about 120
//! copies to make after a wipe) rather than the few the paced load has reached. Without a wire of
//! four hosts the test skips. Not part of `scripts/test`: it takes 15 minutes or more.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom as _, SliceRandom as _};
use rand::{Rng as _, SeedableRng as _};
use rdmactor_cluster::files::plan::replica_order;
use rdmactor_cluster::files::FileRecord;
use rdmactor_tests::cluster_wire::{
    all_urls, bin, catalog, fetch_sums, four_hosts, ft_cluster, listed, parse_uploads, secs, sh,
    upload_script, wait_listing, Cluster, Sent, ServerSetup, PORT, SERVERS,
};
use rdmactor_tests::target_bin;
use rdmactor_tests::wire::{Host, Wire};
use sha2::{Digest as _, Sha256};

/// Replicas per file (`ft --replicas`, the default).
const R: usize = 2;
/// `--repair-after-secs`: how long a node may be gone before its files are copied.
const REPAIR_GRACE: u64 = 10;
/// `--scrub-every-secs`: how often each file's listed replicas are asked what they
/// hold (a wiped store is found this way).
const SCRUB_EVERY: u64 = 20;
/// `--clean-up-after-secs`: how long a file no record lists stays (the collector looks
/// once a minute).
const CLEAN_UP_GRACE: u64 = 30;
/// How long repair may take to restore R after a heal before the run fails. Under TCG a
/// copy takes about 5 s (a connection, a stat, the bytes), one at a time per server:
/// a wiped store of 120 files took 15 minutes and more while the load ran.
const REPAIR_LIMIT: Duration = Duration::from_secs(1500);
/// Files per upload batch (one `ft send`), acknowledged files fetched after each, and
/// the pause before the next batch: the load is paced so that a store wiped late in the
/// run holds a number of files repair restores in minutes, not an hour.
const BATCH: usize = 3;
const FETCHES: usize = 2;
const LOAD_PAUSE: Duration = Duration::from_secs(5);

/// Where the server of `h` stores files: under this test's target directory, inside
/// the repository, which every host mounts at the same path (9p, writable) and which
/// lives on this machine's disk. So a killed host's store survives its reboot, as a
/// disk would; the owners' user extended attributes work there (the hosts' tmpfs lacks
/// them before Linux 6.6); and the end checks hash the replicas here, byte for byte.
fn store(h: Host) -> String {
    format!("{}/{}", run_dir(), h.name())
}

/// This run's directory: keys and stores.
fn run_dir() -> String {
    format!(
        "{}/nemesis-{}",
        env!("CARGO_TARGET_TMPDIR"),
        std::process::id()
    )
}

/// The identity a server's repairs prove.
fn node_identity(h: Host) -> String {
    format!("node-{}", h.name())
}

fn key_file(identity: &str) -> String {
    format!("{}/keys/{identity}.key", run_dir())
}

/// Keys for alice (the load), mallory (the squatter) and each server's repairs, and the
/// authorized-keys file every server reads.
fn make_keys() -> String {
    let dir = format!("{}/keys", run_dir());
    std::fs::create_dir_all(&dir).expect("the keys directory");
    let mut authorized = String::new();
    let who = ["alice".to_owned(), "mallory".to_owned()]
        .into_iter()
        .chain(SERVERS.map(node_identity));
    for identity in who {
        let out = std::process::Command::new(target_bin("keygen"))
            .args(["--identity", &identity, "--out", &key_file(&identity)])
            .output()
            .expect("run keygen (build the examples' binaries first)");
        assert!(out.status.success(), "keygen: {out:?}");
        authorized += String::from_utf8(out.stdout).unwrap().trim();
        authorized.push('\n');
    }
    let file = format!("{dir}/authorized_keys");
    std::fs::write(&file, authorized).unwrap();
    file
}

/// The servers: keyed, each repairing with its own key, scrubbing and cleaning up.
fn setup(authorized: &str) -> ServerSetup {
    let mut flags: Vec<String> = [
        "--authorized-keys",
        authorized,
        "--repair-after-secs",
        &REPAIR_GRACE.to_string(),
        "--repair-every-secs",
        "2",
        "--scrub-every-secs",
        &SCRUB_EVERY.to_string(),
        "--clean-up-after-secs",
        &CLEAN_UP_GRACE.to_string(),
    ]
    .map(str::to_owned)
    .to_vec();
    for h in SERVERS {
        flags.extend(["--files-replicator".to_owned(), node_identity(h)]);
    }
    ServerSetup {
        store,
        flags,
        per_host: |h| vec!["--repair-key".to_owned(), key_file(&node_identity(h))],
    }
}

/// One fault of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The host's VM SIGKILLed; booted after the hold.
    Kill(Host),
    /// The host's carrier off for the hold.
    LinkDown(Host),
    /// `netem loss 100%` on the host's NIC for the hold.
    Loss(Host),
    /// The server SIGKILLed, its store emptied; started again after the hold.
    Wipe(Host),
    /// mallory squats `ahead` names not yet uploaded and `acked` acknowledged ones.
    Squat { ahead: usize, acked: usize },
}

impl Fault {
    /// The kind, as the summary counts it.
    fn kind(self) -> &'static str {
        match self {
            Fault::Kill(_) => "kill",
            Fault::LinkDown(_) | Fault::Loss(_) => "cut",
            Fault::Wipe(_) => "wipe",
            Fault::Squat { .. } => "squat",
        }
    }
}

/// A step: a pause (the load runs alone), then the fault, held this long.
#[derive(Debug, Clone, Copy)]
struct Step {
    pause: Duration,
    fault: Fault,
    hold: Duration,
}

/// The schedule of `seed`: rounds, each the four kinds in a drawn order (so every run
/// has each kind), on drawn hosts, with drawn pauses and holds, until the pauses and
/// holds add up to `budget`. A plain function of its arguments.
fn schedule(seed: u64, budget: Duration) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut steps = Vec::new();
    let mut planned = Duration::ZERO;
    while planned < budget {
        let mut kinds = [0, 1, 2, 3];
        kinds.shuffle(&mut rng);
        for kind in kinds {
            if planned >= budget {
                break;
            }
            let pause = Duration::from_secs(rng.random_range(5..=20));
            let host = SERVERS[rng.random_range(0..SERVERS.len())];
            let (fault, hold) = match kind {
                0 => (Fault::Kill(host), rng.random_range(10..=40)),
                1 if rng.random_bool(0.5) => (Fault::LinkDown(host), rng.random_range(5..=40)),
                1 => (Fault::Loss(host), rng.random_range(5..=40)),
                2 => (Fault::Wipe(host), rng.random_range(2..=15)),
                _ => (
                    Fault::Squat {
                        ahead: rng.random_range(1..=3),
                        acked: rng.random_range(1..=3),
                    },
                    0,
                ),
            };
            let hold = Duration::from_secs(hold);
            steps.push(Step { pause, fault, hold });
            planned += pause + hold;
        }
    }
    steps
}

/// The load's file `i`: its name and size (16 KiB to about 1 MiB, drawn from the seed).
fn load_file(seed: u64, i: usize) -> (String, usize) {
    let mut rng = StdRng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (
        format!("n{i:05}.bin"),
        rng.random_range((16 << 10)..(1 << 20)),
    )
}

/// What the load saw.
#[derive(Debug, Default)]
struct Ledger {
    /// Acknowledged (`ft` printed GOOD, with the source's digest): name → file.
    acked: BTreeMap<String, Sent>,
    /// Refused or failed with a reason.
    failed: BTreeMap<String, String>,
    /// Batches, and names `ft` never answered for (its run ended or timed out).
    batches: usize,
    unanswered: usize,
    /// Fetches during the schedule: whole, not fetched (with `ft`'s reason), and
    /// fetched with other bytes (never allowed).
    fetched: usize,
    unfetched: Vec<String>,
    wrong: Vec<String>,
}

/// Uploads in batches from d as alice, each followed by fetches of acknowledged files,
/// until `stop`.
fn load(wire: &Wire, seed: u64, next: &AtomicUsize, stop: &AtomicBool, ledger: &Mutex<Ledger>) {
    let ft = ft_cluster(Some(&key_file("alice")), &all_urls());
    let mut rng = StdRng::seed_from_u64(seed.rotate_left(17));
    while !stop.load(Ordering::Relaxed) {
        upload_next(
            wire,
            seed,
            BATCH,
            &ft,
            next,
            ledger,
            Duration::from_secs(600),
        );
        let picks: Vec<String> = {
            let mut l = ledger.lock().unwrap();
            l.batches += 1;
            let names: Vec<&String> = l.acked.keys().collect();
            names
                .choose_multiple(&mut rng, FETCHES)
                .map(|n| (*n).clone())
                .collect()
        };
        std::thread::sleep(LOAD_PAUSE);
        if picks.is_empty() {
            continue;
        }
        let names: Vec<&String> = picks.iter().collect();
        let got = fetch_sums(wire, &names, &ft);
        let mut l = ledger.lock().unwrap();
        for name in &picks {
            let want = &l.acked[name].sha256;
            match got.sums.get(name) {
                Some(sum) if sum == want => l.fetched += 1,
                Some(sum) => {
                    let wrong = format!("{name}: fetched {sum}, acknowledged {want}");
                    l.wrong.push(wrong);
                }
                None => {
                    let why = got
                        .job
                        .stdout
                        .lines()
                        .find(|line| line.starts_with(&format!("ERROR {name}")))
                        .unwrap_or("(no verdict)")
                        .to_owned();
                    l.unfetched.push(why);
                }
            }
        }
    }
}

/// Uploads the load's next `n` files from d in one job (given `limit`), as alice, and
/// records what `ft` answered for each in the ledger.
fn upload_next(
    wire: &Wire,
    seed: u64,
    n: usize,
    ft: &str,
    next: &AtomicUsize,
    ledger: &Mutex<Ledger>,
    limit: Duration,
) {
    let first = next.fetch_add(n, Ordering::SeqCst);
    let files: Vec<(String, usize)> = (first..first + n).map(|i| load_file(seed, i)).collect();
    let job = sh(wire, Host::D, &upload_script(&files, ft), limit);
    let (acked, failed) = parse_uploads(&job.stdout);
    let mut l = ledger.lock().unwrap();
    l.unanswered += n.saturating_sub(acked.len() + failed.len());
    l.acked.extend(acked);
    l.failed.extend(failed);
}

/// Uploads `count` of the load's files before the schedule, in batches of 30 (one `ft
/// send` each, no fetches between), and prints how many copies each server then holds:
/// what a wipe of it or its death leaves repair to make.
fn preload_files(wire: &Wire, seed: u64, count: usize, next: &AtomicUsize, ledger: &Mutex<Ledger>) {
    let started = Instant::now();
    let ft = ft_cluster(Some(&key_file("alice")), &all_urls());
    let mut left = count;
    while left > 0 {
        let n = left.min(30);
        upload_next(wire, seed, n, &ft, next, ledger, Duration::from_secs(1200));
        left -= n;
    }
    let records = catalog(wire, &all_urls());
    let per_node: BTreeMap<&str, usize> = SERVERS
        .iter()
        .map(|h| {
            let held = records
                .values()
                .filter(|r| r.nodes.iter().any(|n| n == h.name()))
                .count();
            (h.name(), held)
        })
        .collect();
    let l = ledger.lock().unwrap();
    println!(
        "preload: {count} files in {}: {} acknowledged, {} refused or failed; records per \
         node {per_node:?}",
        secs(started.elapsed()),
        l.acked.len(),
        l.failed.len()
    );
    // No fault is injected yet: every file must be acknowledged.
    assert!(
        l.acked.len() == count,
        "the preload acknowledged {} of {count} files on a healthy cluster: {:?}",
        l.acked.len(),
        l.failed
    );
}

/// SHA-256s of store files, kept while their size and modification time stay.
#[derive(Default)]
struct Hashes(BTreeMap<String, (u64, SystemTime, String)>);

impl Hashes {
    /// The SHA-256 of `path`, or `None` where there is no such file.
    fn of(&mut self, path: &str) -> Option<String> {
        let meta = std::fs::metadata(path).ok()?;
        let stamp = (meta.len(), meta.modified().ok()?);
        if let Some((len, at, sum)) = self.0.get(path) {
            if (*len, *at) == stamp {
                return Some(sum.clone());
            }
        }
        let mut file = std::fs::File::open(path).ok()?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = file.read(&mut buf).ok()?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        let sum: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        self.0
            .insert(path.to_owned(), (stamp.0, stamp.1, sum.clone()));
        Some(sum)
    }
}

/// What is wrong with the records (those in `only`, if given): each must name at least
/// R nodes, each listed and holding the recorded bytes in its store.
fn replica_faults(
    records: &BTreeMap<String, FileRecord>,
    live: &BTreeSet<String>,
    only: Option<&BTreeSet<String>>,
    hashes: &mut Hashes,
) -> Vec<String> {
    let mut faults = Vec::new();
    for (name, record) in records {
        if only.is_some_and(|o| !o.contains(name)) {
            continue;
        }
        // More than R is no fault: a server that recorded its copy and died before its
        // GOOD leaves its client to place the file on the next nodes too, and is taken
        // off the record only once gone past the grace period.
        if record.nodes.len() < R {
            faults.push(format!("{name}: nodes {:?}", record.nodes));
        }
        for node in &record.nodes {
            let Some(h) = SERVERS.into_iter().find(|h| h.name() == node) else {
                faults.push(format!("{name}: unknown node {node}"));
                continue;
            };
            if !live.contains(node) {
                faults.push(format!("{name}: {node} is not listed"));
            }
            match hashes.of(&format!("{}/{name}", store(h))) {
                Some(sum) if sum == record.digest => {}
                Some(_) => faults.push(format!("{name}: {node} holds other bytes")),
                None => faults.push(format!("{name}: {node} holds no copy")),
            }
        }
    }
    faults
}

/// Files in the stores that no record lists for their node, each as `node/name (what it
/// holds: no record, other bytes, or the recorded bytes)`, and hidden (temporary)
/// files as `node/name`.
fn unrecorded(
    records: &BTreeMap<String, FileRecord>,
    hashes: &mut Hashes,
) -> (Vec<String>, Vec<String>) {
    let mut unrecorded = Vec::new();
    let mut hidden = Vec::new();
    for h in SERVERS {
        let Ok(dir) = std::fs::read_dir(store(h)) else {
            continue;
        };
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                hidden.push(format!("{}/{name}", h.name()));
            } else if let Some(record) = records.get(&name) {
                if !record.nodes.iter().any(|n| n == h.name()) {
                    let path = format!("{}/{name}", store(h));
                    let what = if hashes.of(&path).as_ref() == Some(&record.digest) {
                        "the recorded bytes"
                    } else {
                        "other bytes"
                    };
                    unrecorded.push(format!("{}/{name} ({what})", h.name()));
                }
            } else {
                unrecorded.push(format!("{}/{name} (no record)", h.name()));
            }
        }
    }
    (unrecorded, hidden)
}

/// Waits until the replicas are right (see [`replica_faults`]); how long from `from`.
fn wait_replicas(
    wire: &Wire,
    only: Option<&BTreeSet<String>>,
    from: Instant,
    hashes: &mut Hashes,
) -> Duration {
    let deadline = Instant::now() + REPAIR_LIMIT;
    loop {
        let records = catalog(wire, &all_urls());
        let live = listed(wire, &all_urls(), "files").unwrap_or_default();
        let faults = replica_faults(&records, &live, only, hashes);
        if faults.is_empty() {
            return from.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "R = {R} not restored {} after the heal: {} records wrong: {faults:#?}",
            secs(from.elapsed()),
            faults.len()
        );
        std::thread::sleep(Duration::from_secs(3));
    }
}

/// Sets its flag when dropped: the load stops however the schedule ends. A panic
/// inside `thread::scope` waits for the load's thread before it unwinds, and without
/// this the load ran on (a failed run hung until killed).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// One fault as it went.
struct Injected {
    step: Step,
    /// From the schedule's start.
    at: Duration,
    /// From injection to heal.
    held: Duration,
    /// From heal until the records of then were at R = 2 again.
    r_back: Duration,
    /// What the squatter's uploads got.
    squats: Vec<String>,
}

/// mallory's uploads: junk under names the load has not reached (to the first two
/// nodes of each name's order, other junk on each) and under acknowledged names (to the
/// first node in order the record does not name). Each line: name, node, `ft`'s verdict.
fn squat(
    wire: &Wire,
    ahead: usize,
    acked: usize,
    next: &AtomicUsize,
    ledger: &Mutex<Ledger>,
) -> Vec<String> {
    let nodes: Vec<String> = SERVERS.map(|h| h.name().to_owned()).to_vec();
    let from = next.load(Ordering::SeqCst);
    let mut targets: Vec<(String, String)> = Vec::new();
    for i in from..from + ahead {
        let name = format!("n{i:05}.bin");
        for node in replica_order(&name, &nodes).into_iter().take(R) {
            targets.push((name.clone(), node.clone()));
        }
    }
    let newest: Vec<String> = {
        let l = ledger.lock().unwrap();
        l.acked.keys().rev().take(acked).cloned().collect()
    };
    let records = catalog(wire, &all_urls());
    for name in newest {
        let Some(record) = records.get(&name) else {
            continue;
        };
        if let Some(node) = replica_order(&name, &nodes)
            .into_iter()
            .find(|n| !record.nodes.contains(n))
        {
            targets.push((name, node.clone()));
        }
    }
    let ft = bin("ft");
    let key = key_file("mallory");
    let mut s = String::from("mkdir -p /tmp/squat && cd /tmp/squat || exit 1\n");
    for (name, node) in &targets {
        let ip = SERVERS.into_iter().find(|h| h.name() == node).unwrap().ip();
        s += &format!(
            "head -c 4099 /dev/urandom >{name}\n\
             echo \"SQUAT {name} {node} $({ft} --key {key} --addr {ip}:{PORT} send {name} 2>/dev/null | grep -v '^RESULT' | head -1)\"\n\
             rm -f {name}\n"
        );
    }
    let job = sh(wire, Host::D, &s, Duration::from_secs(600));
    job.stdout
        .lines()
        .filter_map(|l| l.strip_prefix("SQUAT "))
        .map(str::to_owned)
        .collect()
}

/// Injects `step`'s fault and heals it (a squat needs no heal); how long it was held.
fn inject(
    wire: &Wire,
    cluster: &mut Cluster,
    step: &Step,
    next: &AtomicUsize,
    ledger: &Mutex<Ledger>,
) -> (Duration, Vec<String>) {
    let t = Instant::now();
    let mut squats = Vec::new();
    match step.fault {
        Fault::Kill(h) => {
            cluster.servers.remove(&h);
            cluster.etcd.remove(&h);
            wire.kill(h);
            std::thread::sleep(step.hold);
            wire.boot(h);
            cluster.rejoin_etcd(h);
            cluster.start_server(h);
        }
        Fault::LinkDown(h) => {
            wire.link(h, false);
            std::thread::sleep(step.hold);
            wire.link(h, true);
        }
        Fault::Loss(h) => {
            wire.netem(h, "loss 100%");
            std::thread::sleep(step.hold);
            wire.netem_off(h);
        }
        Fault::Wipe(h) => {
            cluster.kill_server(h);
            let dir = store(h);
            wire.sh(h, &format!("rm -rf {dir} && mkdir -p {dir}"));
            std::thread::sleep(step.hold);
            cluster.start_server(h);
        }
        Fault::Squat { ahead, acked } => squats = squat(wire, ahead, acked, next, ledger),
    }
    (t.elapsed(), squats)
}

fn describe(step: &Step) -> String {
    let what = match step.fault {
        Fault::Kill(h) => format!("kill {} (host SIGKILLed, booted)", h.name()),
        Fault::LinkDown(h) => format!("cut {} (link down/up)", h.name()),
        Fault::Loss(h) => format!("cut {} (netem loss 100%)", h.name()),
        Fault::Wipe(h) => format!("wipe {} (server restarted, store emptied)", h.name()),
        Fault::Squat { ahead, acked } => {
            format!("squat {ahead} names ahead of the load and {acked} acknowledged ones")
        }
    };
    format!(
        "after {} s: {what}, held {} s",
        step.pause.as_secs(),
        step.hold.as_secs()
    )
}

#[test]
fn acknowledged_files_survive_a_seeded_schedule_of_faults() {
    let Some(wire) = four_hosts() else { return };
    let seed: u64 = match std::env::var("RDMACTOR_NEMESIS_SEED") {
        Ok(s) => s.parse().expect("RDMACTOR_NEMESIS_SEED: a u64"),
        Err(_) => {
            let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH);
            now.expect("a clock after 1970").subsec_nanos() as u64 % 1_000_000
        }
    };
    let budget = Duration::from_secs(
        std::env::var("RDMACTOR_NEMESIS_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(240),
    );
    let steps = schedule(seed, budget);
    let preload: usize = std::env::var("RDMACTOR_NEMESIS_PRELOAD")
        .ok()
        .map(|s| {
            s.parse()
                .expect("RDMACTOR_NEMESIS_PRELOAD: a count of files")
        })
        .unwrap_or(0);
    println!(
        "NEMESIS seed={seed} (replay: RDMACTOR_NEMESIS_SEED={seed} RDMACTOR_NEMESIS_SECS={} \
         RDMACTOR_NEMESIS_PRELOAD={preload})",
        budget.as_secs()
    );
    for (i, step) in steps.iter().enumerate() {
        println!("schedule {:>2}: {}", i + 1, describe(step));
    }
    let preload: usize = std::env::var("RDMACTOR_NEMESIS_PRELOAD")
        .ok()
        .map(|s| {
            s.parse()
                .expect("RDMACTOR_NEMESIS_PRELOAD: a count of files")
        })
        .unwrap_or(0);
    let t0 = Instant::now();
    let authorized = make_keys();
    let mut cluster = Cluster::start(&wire, "nemesis", setup(&authorized));
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let ledger = Mutex::new(Ledger::default());
    if preload > 0 {
        preload_files(&wire, seed, preload, &next, &ledger);
    }
    let mut hashes = Hashes::default();
    let mut done: Vec<Injected> = Vec::new();
    let mut last_heal = Instant::now();

    std::thread::scope(|scope| {
        let loader = scope.spawn(|| load(&wire, seed, &next, &stop, &ledger));
        let _stop = StopOnDrop(&stop);
        let start = Instant::now();
        for step in &steps {
            std::thread::sleep(step.pause);
            let at = start.elapsed();
            println!("[{:>6}] inject: {}", secs(at), describe(step));
            let (held, squats) = inject(&wire, &mut cluster, step, &next, &ledger);
            last_heal = Instant::now();
            for line in &squats {
                println!("[{:>6}]   squat {line}", secs(start.elapsed()));
            }
            let all3 = |n: &BTreeSet<String>| n.len() == 3;
            wait_listing(&wire, &all_urls(), "files", Duration::from_secs(180), all3);
            let then: BTreeSet<String> = catalog(&wire, &all_urls()).into_keys().collect();
            let r_back = wait_replicas(&wire, Some(&then), last_heal, &mut hashes);
            println!(
                "[{:>6}] healed after {}; the {} records of then at R = {R} {} after the heal",
                secs(start.elapsed()),
                secs(held),
                then.len(),
                secs(r_back)
            );
            assert!(!loader.is_finished(), "the load stopped");
            done.push(Injected {
                step: *step,
                at,
                held,
                r_back,
                squats,
            });
        }
        stop.store(true, Ordering::Relaxed);
        if let Err(panic) = loader.join() {
            std::panic::resume_unwind(panic);
        }
    });
    let schedule_took = t0.elapsed();

    // --- The end: every host back, the load stopped. ---------------------------------
    let r_back = wait_replicas(&wire, None, last_heal, &mut hashes);
    let ledger = ledger.into_inner().unwrap();
    let records = catalog(&wire, &all_urls());
    println!(
        "every record ({}) names R = {R} listed nodes holding its bytes, {} after the last heal",
        records.len(),
        secs(r_back)
    );
    let ft = ft_cluster(Some(&key_file("alice")), &all_urls());
    let names: Vec<&String> = ledger.acked.keys().collect();
    let got = fetch_sums(&wire, &names, &ft);
    let lost: Vec<String> = ledger
        .acked
        .iter()
        .filter(|(name, file)| {
            got.sums.get(*name) != Some(&file.sha256)
                || records.get(*name).map(|r| &r.digest) != Some(&file.sha256)
        })
        .map(|(name, _)| name.clone())
        .collect();
    println!(
        "{} acknowledged files fetched from d: {} whole, {} lost {lost:?} (served by {:?})",
        ledger.acked.len(),
        ledger.acked.len() - lost.len(),
        lost.len(),
        got.from
    );
    let clean = Instant::now();
    let limit = Duration::from_secs(CLEAN_UP_GRACE + 60 + 180);
    let (left, hidden) = loop {
        let records = catalog(&wire, &all_urls());
        let (left, hidden) = unrecorded(&records, &mut hashes);
        if left.is_empty() || clean.elapsed() > limit {
            break (left, hidden);
        }
        std::thread::sleep(Duration::from_secs(5));
    };
    println!(
        "unrecorded files left in the stores {} after the end checks began (clean-up grace \
         {CLEAN_UP_GRACE} s, looked at once a minute): {left:?}; hidden files: {hidden:?}",
        secs(clean.elapsed())
    );
    let removed: usize = SERVERS
        .iter()
        .filter_map(|h| cluster.servers.get(h).map(|job| (h, job)))
        .map(|(h, job)| {
            wire.stdout_so_far(*h, job)
                .lines()
                .filter(|l| l.contains("cluster: REMOVED "))
                .count()
        })
        .sum();

    // How long the servers' rounds took (scrub, repair, clean-up), by kind: the longest
    // and the sum, over every server.
    let mut rounds: BTreeMap<String, (usize, f64, f64)> = BTreeMap::new();
    for h in SERVERS {
        let Some(job) = cluster.servers.get(&h) else {
            continue;
        };
        for line in wire.stdout_so_far(h, job).lines() {
            let Some(rest) = line.split("cluster: ROUND ").nth(1) else {
                continue;
            };
            let kind = rest.split_whitespace().next().unwrap_or("?").to_owned();
            let secs: f64 = rest
                .split("secs=")
                .nth(1)
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0.0);
            let e = rounds.entry(kind).or_default();
            e.0 += 1;
            e.1 = e.1.max(secs);
            e.2 += secs;
        }
    }
    for (kind, (n, longest, sum)) in &rounds {
        println!("rounds of {kind}: {n}, the longest {longest:.1} s, {sum:.0} s in all");
    }

    // --- The summary. -----------------------------------------------------------------
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for f in &done {
        *kinds.entry(f.step.fault.kind()).or_default() += 1;
    }
    println!("faults injected:");
    for f in &done {
        println!(
            "  at {:>7}: {} (held {}, R = {R} back {} after the heal){}",
            secs(f.at),
            describe(&f.step),
            secs(f.held),
            secs(f.r_back),
            if f.squats.is_empty() {
                String::new()
            } else {
                format!(": {}", f.squats.join("; "))
            }
        );
    }
    println!(
        "load: {} batches of {BATCH}, {} acknowledged, {} refused or failed with a reason, \
         {} unanswered; fetches during the schedule: {} whole, {} not fetched, {} wrong",
        ledger.batches,
        ledger.acked.len(),
        ledger.failed.len(),
        ledger.unanswered,
        ledger.fetched,
        ledger.unfetched.len(),
        ledger.wrong.len()
    );
    for why in ledger.unfetched.iter().take(10) {
        println!("  not fetched: {why}");
    }
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    for why in ledger.failed.values() {
        let short: String = why.chars().take(70).collect();
        *reasons.entry(short).or_default() += 1;
    }
    for (why, n) in &reasons {
        println!("  upload refused or failed ({n}): {why}");
    }
    println!(
        "NEMESIS-SUMMARY seed={seed} faults={} {kinds:?} acknowledged={} lost={} \
         r_back_after_last_fault={} unrecorded_left={} removed_by_clean_up={removed} \
         schedule={} run={}",
        done.len(),
        ledger.acked.len(),
        lost.len(),
        secs(r_back),
        left.len(),
        secs(schedule_took),
        secs(t0.elapsed())
    );
    assert!(
        ledger.wrong.is_empty(),
        "fetched other bytes: {:?}",
        ledger.wrong
    );
    assert!(lost.is_empty(), "acknowledged files lost: {lost:?}");
    assert!(left.is_empty(), "unrecorded replicas left: {left:?}");
    drop(cluster);
    let _ = std::fs::remove_dir_all(Path::new(&run_dir()));
}
