//! A three-server cluster on the four-host wire (`scripts/wire --hosts 4`), shared by
//! the tests that drive one (`wire_cluster`, `wire_nemesis`): an etcd member and a
//! `server --cluster` on each of a, b and c, every client on d; the registry and the
//! file catalog read with `etcdctl` on d; uploads and fetches by `ft` on d, each file's
//! SHA-256 taken on d.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rdmactor_cluster::files::{files_prefix, FileRecord};

use crate::target_bin;
use crate::wire::{Host, Job, Wire};

/// The cluster's name in etcd.
pub const CLUSTER: &str = "wire";
/// Where each server listens.
pub const PORT: u16 = 7471;
/// The servers' lease TTL (`--lease-ttl-secs`, the default).
pub const TTL: Duration = Duration::from_secs(5);
/// The hosts that run a server and an etcd member.
pub const SERVERS: [Host; 3] = [Host::A, Host::B, Host::C];
/// etcd's raft timing: under TCG, with four single-vCPU guests on two cores, etcd's
/// defaults (100 ms / 1 s) saw leaders lose their term under load; this is the ratio
/// etcd recommends (election = 10 × heartbeat), slower.
/// etcd's heartbeat interval, in ms.
pub const ETCD_HEARTBEAT_MS: u64 = 300;
/// etcd's election timeout, in ms.
pub const ETCD_ELECTION_MS: u64 = 3000;

/// A tool binary beside the test binary, as a string for a command line.
pub fn bin(name: &str) -> String {
    target_bin(name).to_string_lossy().into_owned()
}

/// The wire of `scripts/wire --hosts 4`, or `None` (the test skips, saying why) without
/// one.
pub fn four_hosts() -> Option<Wire> {
    let wire = Wire::from_env()?;
    let hosts = wire.hosts();
    if hosts.len() < 4 {
        eprintln!("skipped: needs scripts/wire --hosts 4 (this wire has {hosts:?})");
        return None;
    }
    Some(wire)
}

/// Member `h`'s client URL.
pub fn client_url(h: Host) -> String {
    format!("http://{}:2379", h.ip())
}

/// Member `h`'s peer URL.
pub fn peer_url(h: Host) -> String {
    format!("http://{}:2380", h.ip())
}

/// `--etcd` for the clients: every member.
pub fn all_urls() -> String {
    SERVERS.map(client_url).join(",")
}

/// `etcd` for member `h`; `state` is `new` (the first start) or `existing` (rejoining).
/// `token` names this test's etcd cluster (its data directories and cluster token), so
/// that a second test on the same wire starts a new one.
fn etcd_cmd(h: Host, members: &[Host], state: &str, token: &str) -> Vec<String> {
    let initial: Vec<String> = members
        .iter()
        .map(|m| format!("{}={}", m.name(), peer_url(*m)))
        .collect();
    [
        // Ahead of the server beside it for the host's one vCPU, as etcd's tuning guide
        // asks of a shared machine: a member starved past the lease TTL lets the live
        // servers' leases lapse (seen on 2026-11-29, bench/notes), which tests etcd's
        // scheduling, not the cluster.
        "nice".to_owned(),
        "-n".to_owned(),
        "-10".to_owned(),
        "etcd".to_owned(),
        format!("--name={}", h.name()),
        format!("--data-dir=/tmp/etcd-{}-{token}", h.name()),
        format!("--listen-peer-urls={}", peer_url(h)),
        format!("--initial-advertise-peer-urls={}", peer_url(h)),
        format!(
            "--listen-client-urls={},http://127.0.0.1:2379",
            client_url(h)
        ),
        format!("--advertise-client-urls={}", client_url(h)),
        format!("--initial-cluster={}", initial.join(",")),
        format!("--initial-cluster-token=rdmactor-wire-{token}"),
        format!("--initial-cluster-state={state}"),
        format!("--heartbeat-interval={ETCD_HEARTBEAT_MS}"),
        format!("--election-timeout={ETCD_ELECTION_MS}"),
        "--log-level=warn".to_owned(),
    ]
    .to_vec()
}

fn args(cmd: &[String]) -> Vec<&str> {
    cmd.iter().map(String::as_str).collect()
}

/// A shell line on `host`, not required to succeed.
pub fn sh(wire: &Wire, host: Host, line: &str, limit: Duration) -> Job {
    wire.run(host, &["bash", "-c", line], limit)
}

/// `etcdctl` on d against `endpoints`.
pub fn etcdctl(wire: &Wire, endpoints: &str, rest: &str) -> Job {
    sh(
        wire,
        Host::D,
        &format!("ETCDCTL_API=3 etcdctl --dial-timeout=2s --command-timeout=5s --endpoints={endpoints} {rest}"),
        Duration::from_secs(60),
    )
}

/// The node ids listed for `service` in the registry, read through `endpoints`.
pub fn listed(wire: &Wire, endpoints: &str, service: &str) -> Option<BTreeSet<String>> {
    let prefix = format!("/rdmactor/{CLUSTER}/services/{service}/");
    let job = etcdctl(
        wire,
        endpoints,
        &format!("get --prefix --keys-only {prefix}"),
    );
    (job.status == 0).then(|| {
        job.stdout
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .map(str::to_owned)
            .collect()
    })
}

/// Waits until `service`'s listing satisfies `ok`; how long that took.
pub fn wait_listing(
    wire: &Wire,
    endpoints: &str,
    service: &str,
    limit: Duration,
    ok: impl Fn(&BTreeSet<String>) -> bool,
) -> Duration {
    let t = Instant::now();
    loop {
        let now = listed(wire, endpoints, service);
        if now.as_ref().is_some_and(&ok) {
            return t.elapsed();
        }
        assert!(
            t.elapsed() < limit,
            "{service}: listing {now:?} not as expected after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The files records: name → replica nodes.
pub fn records(wire: &Wire, endpoints: &str) -> BTreeMap<String, Vec<String>> {
    catalog(wire, endpoints)
        .into_iter()
        .map(|(name, record)| (name, record.nodes))
        .collect()
}

/// The file catalog, read with `etcdctl` on d through `endpoints`: name → record.
pub fn catalog(wire: &Wire, endpoints: &str) -> BTreeMap<String, FileRecord> {
    let prefix = files_prefix(CLUSTER);
    let job = etcdctl(wire, endpoints, &format!("get --prefix {prefix}"));
    assert_eq!(job.status, 0, "reading the file records: {job:#?}");
    let mut out = BTreeMap::new();
    let mut lines = job.stdout.lines();
    while let (Some(key), Some(value)) = (lines.next(), lines.next()) {
        let Some(name) = key.strip_prefix(&prefix) else {
            continue;
        };
        let record =
            FileRecord::from_json(key, value.as_bytes()).unwrap_or_else(|e| panic!("{key}: {e}"));
        out.insert(name.to_owned(), record);
    }
    out
}

/// `ft` with `--key` (if given) and `--cluster` through `etcd`: the command line the
/// upload and fetch scripts append `send` or `fetch` to.
pub fn ft_cluster(key: Option<&str>, etcd: &str) -> String {
    let ft = bin("ft");
    let key = key.map_or(String::new(), |k| format!(" --key {k}"));
    format!("{ft}{key} --cluster {CLUSTER} --etcd {etcd}")
}

/// Live QPs on `host`'s device.
pub fn qps(wire: &Wire, host: Host) -> u64 {
    wire.resources(host).get("qp")
}

/// The running cluster: etcd members and servers, by host.
pub struct Cluster<'w> {
    wire: &'w Wire,
    token: String,
    setup: ServerSetup,
    /// The etcd member's job on each host.
    pub etcd: BTreeMap<Host, String>,
    /// The server's job on each host.
    pub servers: BTreeMap<Host, String>,
    /// QPs on each server host before its server started.
    pub base: BTreeMap<Host, u64>,
}

/// How a test's servers run, beyond what every cluster server on the wire is given
/// (`--listen`, `--cluster`, its own host's etcd member, `--node-id`, the lease TTL).
#[derive(Debug, Clone)]
pub struct ServerSetup {
    /// The `--files-dir` of the server on a host (made if missing).
    pub store: fn(Host) -> String,
    /// Its other flags, the same on every host.
    pub flags: Vec<String>,
    /// Flags of the server on one host (its own key, say).
    pub per_host: fn(Host) -> Vec<String>,
}

impl<'w> Cluster<'w> {
    /// etcd on a, b and c, then a server next to each (run as `setup` says), all
    /// registered.
    pub fn start(wire: &'w Wire, token: &str, setup: ServerSetup) -> Cluster<'w> {
        let t0 = Instant::now();
        let mut cluster = Cluster {
            wire,
            token: format!("{token}-{}", std::process::id()),
            setup,
            etcd: BTreeMap::new(),
            servers: BTreeMap::new(),
            base: BTreeMap::new(),
        };
        for h in SERVERS {
            cluster.start_etcd(h, &SERVERS, "new");
        }
        let took = cluster.wait_etcd_healthy(&all_urls(), Duration::from_secs(180));
        println!("etcd: three members healthy {} after start", secs(took));
        cluster.base = SERVERS.iter().map(|h| (*h, qps(wire, *h))).collect();
        for h in SERVERS {
            cluster.start_server(h);
        }
        let all3 = |n: &BTreeSet<String>| n.len() == 3;
        wait_listing(wire, &all_urls(), "echo", Duration::from_secs(60), all3);
        wait_listing(wire, &all_urls(), "files", Duration::from_secs(60), all3);
        println!(
            "servers a, b, c registered ({} since start)",
            secs(t0.elapsed())
        );
        cluster
    }

    /// Starts `h`'s etcd member of `members`; `state` is `new` or `existing`.
    pub fn start_etcd(&mut self, h: Host, members: &[Host], state: &str) {
        let job = self
            .wire
            .spawn(h, &args(&etcd_cmd(h, members, state, &self.token)));
        self.etcd.insert(h, job);
    }

    /// Waits until every member in `endpoints` answers healthy.
    pub fn wait_etcd_healthy(&self, endpoints: &str, limit: Duration) -> Duration {
        let t = Instant::now();
        loop {
            let job = etcdctl(self.wire, endpoints, "endpoint health");
            if job.status == 0 {
                return t.elapsed();
            }
            if t.elapsed() > limit {
                for (h, job) in &self.etcd {
                    eprintln!("--- etcd on {h:?}:\n{}", self.wire.stderr_so_far(*h, job));
                }
                panic!("etcd not healthy after {limit:?}: {job:#?}");
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Starts the server on `h` and waits until it listens.
    pub fn start_server(&mut self, h: Host) {
        let server = bin("server");
        let store = (self.setup.store)(h);
        let listen = format!("{}:{PORT}", h.ip());
        let ttl = TTL.as_secs().to_string();
        // Each server talks to the etcd member on its own host (a stacked control plane,
        // as kubeadm's API servers do): cut off from the majority, its member cannot renew
        // the lease, and the lease lapses on the majority's side.
        let etcd = client_url(h);
        let cmd = [
            "env",
            "RUST_LOG=rdmactor=warn,rdmactor_cluster=info",
            &server,
            "--listen",
            &listen,
            "--cluster",
            CLUSTER,
            "--etcd",
            &etcd,
            "--node-id",
            h.name(),
            "--lease-ttl-secs",
            &ttl,
            "--files-dir",
            &store,
        ];
        let own = (self.setup.per_host)(h);
        let mut cmd = cmd.to_vec();
        cmd.extend(self.setup.flags.iter().chain(&own).map(String::as_str));
        self.wire.sh(h, &format!("mkdir -p {store}"));
        let job = self.wire.spawn(h, &cmd);
        self.wire
            .wait_for_output(h, &job, "listening on", Duration::from_secs(120));
        self.servers.insert(h, job);
    }

    /// SIGKILLs the server on `h`, if one runs.
    pub fn kill_server(&mut self, h: Host) {
        if let Some(job) = self.servers.remove(&h) {
            self.wire.kill_job_quietly(h, &job);
        }
    }

    /// After `h` booted again: its etcd member, whose data died with the host's tmpfs, is
    /// removed from the cluster and added again (through the other members), then
    /// started with `existing` state; waits until every member is healthy.
    pub fn rejoin_etcd(&mut self, h: Host) {
        self.etcd.remove(&h);
        let others = SERVERS
            .iter()
            .filter(|m| **m != h)
            .map(|m| client_url(*m))
            .collect::<Vec<_>>()
            .join(",");
        let list = etcdctl(self.wire, &others, "member list");
        assert_eq!(list.status, 0, "{list:#?}");
        let id = list
            .stdout
            .lines()
            .find(|l| l.contains(&format!(", {}, ", h.name())))
            .and_then(|l| l.split(',').next())
            .unwrap_or_else(|| panic!("no member {}: {}", h.name(), list.stdout))
            .to_owned();
        let removed = etcdctl(self.wire, &others, &format!("member remove {id}"));
        assert_eq!(removed.status, 0, "{removed:#?}");
        let added = etcdctl(
            self.wire,
            &others,
            &format!("member add {} --peer-urls={}", h.name(), peer_url(h)),
        );
        assert_eq!(added.status, 0, "{added:#?}");
        self.start_etcd(h, &SERVERS, "existing");
        self.wait_etcd_healthy(&all_urls(), Duration::from_secs(180));
    }

    /// What the server on `h` printed on stderr so far.
    pub fn server_log(&self, h: Host) -> String {
        self.servers
            .get(&h)
            .map(|job| self.wire.stderr_so_far(h, job))
            .unwrap_or_default()
    }
}

impl Drop for Cluster<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for h in SERVERS {
                eprintln!("--- server on {h:?}, stderr:\n{}", self.server_log(h));
                // Its rounds of repair (scrub, repair, clean-up: how long each took).
                if let Some(job) = self.servers.get(&h) {
                    let out = self.wire.stdout_so_far(h, job);
                    let rounds: Vec<&str> = out
                        .lines()
                        .filter(|l| l.contains("cluster: ROUND"))
                        .collect();
                    eprintln!("--- server on {h:?}, rounds:\n{}", rounds.join("\n"));
                }
            }
        }
        for (h, job) in self.servers.iter().chain(self.etcd.iter()) {
            self.wire.kill_job_quietly(*h, job);
        }
    }
}

/// One file of the test: its name, size and the SHA-256 d computed of its source.
#[derive(Debug, Clone)]
pub struct Sent {
    /// The SHA-256 of its source, lowercase hex.
    pub sha256: String,
    /// The nodes its upload's GOOD named.
    pub nodes: Vec<String>,
}

/// The shell script that makes `files` (name, size) of random bytes on d in batches of
/// 10, prints `SUM <sha256>  <name>` for each, sends each batch with `ft`, the
/// command line of [`ft_cluster`] (`GOOD name sha256:.. nodes=..` or `ERROR name: why`),
/// and removes the batch.
pub fn upload_script(files: &[(String, usize)], ft: &str) -> String {
    let mut s = String::from("mkdir -p /tmp/src && cd /tmp/src || exit 1\n");
    for batch in files.chunks(10) {
        let names: Vec<&str> = batch.iter().map(|(n, _)| n.as_str()).collect();
        for (name, size) in batch {
            s += &format!("head -c {size} /dev/urandom >{name}\n");
        }
        s += &format!("sha256sum {} | sed 's/^/SUM /'\n", names.join(" "));
        s += &format!("{ft} send {}\n", names.join(" "));
        s += &format!("rm -f {}\n", names.join(" "));
    }
    s
}

/// Parses [`upload_script`]'s output: acknowledged files, and the failed ones' reasons.
pub fn parse_uploads(out: &str) -> (BTreeMap<String, Sent>, BTreeMap<String, String>) {
    let mut sums = BTreeMap::new();
    let mut good = BTreeMap::new();
    let mut failed = BTreeMap::new();
    for line in out.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("SUM") => {
                let (Some(sum), Some(name)) = (words.next(), words.next()) else {
                    continue;
                };
                sums.insert(name.to_owned(), sum.to_owned());
            }
            Some("GOOD") => {
                let (Some(name), Some(digest), Some(nodes)) =
                    (words.next(), words.next(), words.next())
                else {
                    continue;
                };
                let digest = digest.strip_prefix("sha256:").unwrap_or(digest);
                let nodes: Vec<String> = nodes
                    .strip_prefix("nodes=")
                    .unwrap_or(nodes)
                    .split(',')
                    .map(str::to_owned)
                    .collect();
                good.insert(name.to_owned(), (digest.to_owned(), nodes));
            }
            Some("ERROR") => {
                let rest: Vec<&str> = words.collect();
                let joined = rest.join(" ");
                if let Some((name, why)) = joined.split_once(": ") {
                    failed.insert(name.to_owned(), why.to_owned());
                }
            }
            _ => {}
        }
    }
    let mut sent = BTreeMap::new();
    for (name, (digest, nodes)) in good {
        let sha256 = sums
            .get(&name)
            .unwrap_or_else(|| panic!("{name} acknowledged, but d never summed it"))
            .clone();
        assert_eq!(
            sha256, digest,
            "{name}: recorded digest is not the SHA-256 of its source"
        );
        sent.insert(name, Sent { sha256, nodes });
    }
    (sent, failed)
}

/// What [`fetch_sums`] got: each fetched file's SHA-256 on d, how many came from each
/// node, and the job (`ft`'s own lines).
#[derive(Debug)]
pub struct Fetched {
    /// Name → SHA-256 of the fetched copy.
    pub sums: BTreeMap<String, String>,
    /// Node → files it served.
    pub from: BTreeMap<String, usize>,
    /// The script's run.
    pub job: Job,
}

/// Fetches `names` to d with `ft fetch` (batches of 10; `ft` is the command line of
/// [`ft_cluster`]) and sums each fetched copy on d with `sha256sum`.
pub fn fetch_sums(wire: &Wire, names: &[&String], ft: &str) -> Fetched {
    let mut s = String::from("mkdir -p /tmp/out && cd /tmp/out || exit 1\n");
    for batch in names.chunks(10) {
        let list: Vec<&str> = batch.iter().map(|n| n.as_str()).collect();
        s += &format!("{ft} fetch --out /tmp/out {}\n", list.join(" "));
        s += "sha256sum * 2>/dev/null | sed 's/^/GOT /'\nrm -f /tmp/out/*\n";
    }
    let job = sh(wire, Host::D, &s, Duration::from_secs(3600));
    let mut sums = BTreeMap::new();
    let mut from = BTreeMap::new();
    for line in job.stdout.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("GOT") => {
                if let (Some(sum), Some(name)) = (words.next(), words.next()) {
                    sums.insert(name.to_owned(), sum.to_owned());
                }
            }
            Some("GOOD") => {
                if let Some(node) = words.nth(2).and_then(|w| w.strip_prefix("from=")) {
                    *from.entry(node.to_owned()).or_insert(0) += 1;
                }
            }
            _ => {}
        }
    }
    Fetched { sums, from, job }
}

/// Fetches every file in `sent` with [`fetch_sums`] and asserts each copy's SHA-256 is
/// the source's; returns, per replica node, how many came from it.
pub fn fetch_all(wire: &Wire, sent: &BTreeMap<String, Sent>, ft: &str) -> BTreeMap<String, usize> {
    let names: Vec<&String> = sent.keys().collect();
    let got = fetch_sums(wire, &names, ft);
    let mut bad = Vec::new();
    for (name, file) in sent {
        match got.sums.get(name) {
            Some(sum) if *sum == file.sha256 => {}
            other => bad.push(format!("{name}: fetched {other:?}, sent {}", file.sha256)),
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {} files not fetched whole: {bad:?}\n--- ft's output\n{}\n{}",
        bad.len(),
        sent.len(),
        got.job.stdout,
        got.job.stderr
    );
    got.from
}

/// `d` in seconds, one decimal.
pub fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}
