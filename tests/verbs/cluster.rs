//! `server --cluster` on real verbs (issue 33, items 1 and 2): the server binary
//! registers its services in a real etcd once it listens, a `ClusterClient` finds it
//! there and connects through rdma_cm, SIGTERM withdraws it (draining first, then gone)
//! before the server drains, and a SIGKILLed server disappears when its lease expires.
//!
//! Files across nodes (item 3): four servers, files put with R = 2 through the cluster's
//! `files` nodes and fetched back byte for byte after one server is SIGKILLed; after the
//! grace period the servers themselves (`--repair-after-secs`) copy each of its files to
//! another node, each copy made once, by the node it goes to. With keys (issues 46 and
//! 47): no server serves files publicly; each repairs with a key of its own that the
//! others name as a replicator, so a repaired copy is the uploader's, fetched by her
//! from every node that holds it and refused to anyone else.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdmactor::runtime::CallError;
use rdmactor::runtime::{Client, Credential, NodeConfig};
use rdmactor_cluster::files::{ClusterFiles, FileTransfer, FilesError, RdmaFiles, TransferError};
use rdmactor_cluster::{ClusterClient, EtcdConfig, Membership, NodeInfo, Placement};
use rdmactor_services::file_transfer::ownership;
use rdmactor_services::members::{self, Member, MembersError};
use rdmactor_testkit::etcd::Etcd;
use rdmactor_testkit::pattern;
use rdmactor_tests::programs::ok;
use rdmactor_tests::{
    actix_run, assert_released, echo_ok, rdma_context, resource_counts, target_bin, test_addr,
};

/// Starts `server --cluster vm` with a 2 s lease; returns it and the address it listens on.
fn start_server(etcd: &Etcd, node: &str) -> (Child, SocketAddr) {
    start_server_with(etcd, node, &[])
}

/// [`start_server`] with more flags.
fn start_server_with(etcd: &Etcd, node: &str, extra: &[&str]) -> (Child, SocketAddr) {
    let (child, addr, _) = start_server_logged(etcd, node, extra);
    (child, addr)
}

/// What a server printed after its first line, as it prints it.
type Log = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// [`start_server_with`], keeping what the server prints.
fn start_server_logged(etcd: &Etcd, node: &str, extra: &[&str]) -> (Child, SocketAddr, Log) {
    let listen = format!("{}:0", test_addr().ip());
    let mut server = Command::new(target_bin("server"))
        .args([
            "--listen",
            &listen,
            "--cluster",
            "vm",
            "--etcd",
            &etcd.url(),
        ])
        .args(["--node-id", node, "--lease-ttl-secs", "2"])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the server binary (scripts/test builds it)");
    let mut out = BufReader::new(server.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("the server's first line");
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("not an address line: {line}"))
        .parse()
        .expect("address");
    // Kept, and the pipe drained.
    let log = Log::default();
    let lines = log.clone();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            lines.lock().unwrap_or_else(|e| e.into_inner()).push(line);
        }
    });
    STARTED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(server.id());
    (server, addr, log)
}

/// The servers this process started. A test that fails leaves them running, and they
/// hold its output open: the runner would wait on them until the VM's timeout.
static STARTED: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

/// SIGKILLs every server in [`STARTED`] when a test panics (held for the test's length).
struct KillServersOnPanic;

impl Drop for KillServersOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for pid in STARTED.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
    }
}

fn signal(server: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &server.id().to_string()])
        .status()
        .expect("kill");
    assert!(ok.success(), "kill {sig}");
}

fn names(nodes: &[NodeInfo]) -> Vec<(String, bool)> {
    nodes
        .iter()
        .map(|n| (n.node.clone(), n.record.draining))
        .collect()
}

#[test]
fn servers_register_serve_through_the_cluster_client_and_leave_the_registry() {
    let Some(_ctx) = rdma_context() else { return };
    let Some(etcd) = Etcd::start() else { return };
    let _reaper = KillServersOnPanic;
    let base = resource_counts();
    let (mut a, a_addr) = start_server(&etcd, "a");
    let (mut b, b_addr) = start_server(&etcd, "b");
    actix_run(async {
        let config = EtcdConfig::new([etcd.url()]);
        let echo = Membership::watch(config.clone(), "vm", "echo").expect("watch");
        let both = echo
            .wait_for(Duration::from_secs(10), |n| n.len() == 2)
            .await
            .unwrap_or_else(|| panic!("both servers listed: {:?}", names(&echo.nodes())));
        for (node, addr) in [("a", a_addr), ("b", b_addr)] {
            let info = both.iter().find(|n| n.node == node).expect("listed");
            assert_eq!(
                info.record.addr, addr,
                "node {node} advertises where it listens"
            );
            assert!(!info.record.draining);
        }

        // Connections through the registry, spread over both, each one served.
        let client = Client::start(NodeConfig::default()).expect("client");
        let cluster = ClusterClient::new(&client, config, "vm");
        let mut reached = Vec::new();
        for i in 0..6u8 {
            let conn = cluster
                .connect("echo", Placement::LeastLoaded)
                .await
                .expect("a connection through the cluster client");
            echo_ok(&conn.connection, vec![i; 64]).await;
            reached.push(conn.node.node.clone());
            conn.connection.close().await;
        }
        assert!(
            reached.contains(&"a".to_owned()) && reached.contains(&"b".to_owned()),
            "least loaded spreads over both: {reached:?}"
        );

        // SIGTERM: a is marked draining, then withdrawn, then it exits 0.
        signal(&a, "-TERM");
        let gone = echo
            .wait_for(Duration::from_secs(10), |n| n.len() == 1)
            .await
            .unwrap_or_else(|| panic!("a withdrawn: {:?}", names(&echo.nodes())));
        assert_eq!(gone[0].node, "b");
        let status = a.wait().expect("a exits");
        assert!(status.success(), "a exited with {status:?}");
        let conn = cluster
            .connect("echo", Placement::LeastLoaded)
            .await
            .expect("b still serves");
        assert_eq!(conn.node.node, "b");
        echo_ok(&conn.connection, b"after a left".to_vec()).await;
        conn.connection.close().await;

        // SIGKILL: nothing withdraws b; its lease (2 s) expires and it leaves the list.
        signal(&b, "-KILL");
        let killed = Instant::now();
        let _ = b.wait();
        echo.wait_for(Duration::from_secs(10), <[_]>::is_empty)
            .await
            .unwrap_or_else(|| panic!("b expired: {:?}", names(&echo.nodes())));
        let expired = killed.elapsed();
        println!("a SIGKILLed server left the registry {expired:?} after the kill (lease 2 s)");
        assert!(
            expired >= Duration::from_millis(500),
            "gone before its lease could lapse: {expired:?}"
        );
        match cluster.connect("echo", Placement::LeastLoaded).await {
            Err(e) => println!("with no server listed: {e}"),
            Ok(c) => panic!("connected to {} with no server listed", c.node.node),
        }
        client.shutdown().await;
    });
    assert_released(&base);
}

/// Asks `conn` (a `members` connection) for `echo`'s members until `want` of them are
/// listed (the server's watch sees a new node within milliseconds; 10 s at most).
async fn listed(conn: &rdmactor::runtime::ClientConnection, want: usize) -> Vec<Member> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = members::members(conn, "echo").await;
        match got {
            Ok(list) if list.len() == want => return list,
            _ if Instant::now() < deadline => {
                actix::clock::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("{want} members of echo listed: {other:?}"),
        }
    }
}

/// Issue 47's preferred control plane and issue 50's cluster bootstrap: a client that
/// knows one server's address, and no etcd, asks it (`members`) for the servers of a
/// service and connects to one; the Rust API, `client --seeds`, the C library and the
/// Python package each do it against the `server` binary, least loaded node first. Questions a
/// hostile client may ask (a long name, an unknown service) get typed refusals. Once
/// b is SIGKILLed, a client given b first as its seed still reaches a, at once: b's
/// port refuses, and its entry, still listed until its lease lapses, refuses too.
#[test]
fn clients_bootstrap_from_a_servers_address_without_etcd_and_skip_a_killed_server() {
    let Some(_ctx) = rdma_context() else { return };
    let Some(etcd) = Etcd::start() else { return };
    let _reaper = KillServersOnPanic;
    let base = resource_counts();
    let (mut a, a_addr) = start_server(&etcd, "a");
    let (mut b, b_addr) = start_server(&etcd, "b");
    let seeds = format!("{b_addr},{a_addr}");
    actix_run(async {
        let client = Client::start(NodeConfig::default()).expect("client");
        let ask = client
            .connect(a_addr, "members")
            .await
            .expect("a server started with --cluster serves members");
        let both = listed(&ask, 2).await;
        for (node, addr) in [("a", a_addr), ("b", b_addr)] {
            let m = both.iter().find(|m| m.node == node).expect("listed");
            assert_eq!(m.addr, addr, "node {node} is listed where it listens");
        }
        let long = "x".repeat(members::MAX_SERVICE_NAME + 1);
        match members::members(&ask, &long).await {
            Err(CallError::Handler(MembersError::NameTooLong(n))) => assert_eq!(n, long.len()),
            other => panic!("a long name: {other:?}"),
        }
        match members::members(&ask, "no-such").await {
            Err(CallError::Handler(MembersError::UnknownService(s))) => assert_eq!(s, "no-such"),
            other => panic!("an unknown service: {other:?}"),
        }
        ask.close().await;

        // Through a's address alone, least loaded first: with 4 connections held on
        // b (and reported), every connect goes to a, whose load is at most the
        // question's connection and its own.
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(client.connect(b_addr, "echo").await.expect("b serves"));
        }
        let ask = client.connect(a_addr, "members").await.expect("members");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !listed(&ask, 2)
            .await
            .iter()
            .any(|m| m.node == "b" && m.connections >= 4)
        {
            assert!(
                Instant::now() < deadline,
                "b's load of 4 reported within 10 s"
            );
            actix::clock::sleep(Duration::from_millis(200)).await;
        }
        ask.close().await;
        for i in 0..4u8 {
            let got = members::connect_via(&client, &[a_addr], "echo", members::DEFAULT_DIAL)
                .await
                .expect("a connection through a's members");
            assert!(got.failed.is_empty(), "nothing failed: {:?}", got.failed);
            assert_eq!(got.member.node, "a", "the least loaded node first");
            echo_ok(&got.connection, vec![i; 64]).await;
            got.connection.close().await;
        }
        for conn in held {
            conn.close().await;
        }

        signal(&b, "-KILL");
        let _ = b.wait();
        let killed = Instant::now();
        let got = members::connect_via(&client, &[b_addr, a_addr], "echo", members::DEFAULT_DIAL)
            .await
            .expect("a still serves");
        println!(
            "right after b's SIGKILL: connected to {} in {:?}; failed before: {:?}",
            got.member.node,
            killed.elapsed(),
            got.failed
        );
        assert_eq!(got.member.node, "a");
        assert_eq!(
            got.failed.first().map(|f| (f.addr, f.node.clone())),
            Some((b_addr, None)),
            "the dead seed was asked first"
        );
        echo_ok(&got.connection, b"after b died".to_vec()).await;
        got.connection.close().await;
        client.shutdown().await;
    });

    // The Rust tool, the C library and the Python package, given the same seeds
    // (b's first).
    let out = tool(
        "client",
        &[
            "--seeds",
            &seeds,
            "echo",
            "--connections",
            "2",
            "--requests",
            "20",
        ],
    );
    assert!(
        out.contains("RESULT kind=echo connections=2 requests=40"),
        "client --seeds: {out}"
    );
    // A session of the tool's own, dialled through the seeds the same way.
    let out = tool(
        "client",
        &["--seeds", &seeds, "latency", "--session", "--iters", "200"],
    );
    assert!(
        out.contains("RESULT kind=latency size=64 iters=200"),
        "client --seeds latency --session: {out}"
    );
    let c = super::c_client::echo_client();
    let out = super::c_client::run(
        c.path(),
        "echo_client",
        &["--seeds", &seeds, "hello from C"],
    );
    assert_eq!(ok("echo_client --seeds", out), "echo: hello from C\n");
    let python = super::python_client::venv_python();
    let out = super::python_client::example(&python, "echo.py", &["--seeds", &seeds, "hello"]);
    assert_eq!(ok("echo.py --seeds", out), "echo: hello\n");

    signal(&a, "-TERM");
    let status = a.wait().expect("a exits");
    assert!(status.success(), "a exited with {status:?}");
    assert_released(&base);
}

#[test]
fn files_put_with_two_replicas_survive_a_killed_server_and_repair_restores_two() {
    let Some(_ctx) = rdma_context() else { return };
    let Some(etcd) = Etcd::start() else { return };
    let _reaper = KillServersOnPanic;
    let base = resource_counts();
    // Under the target directory, not /tmp: owners are user extended attributes, which
    // the VM's tmpfs lacks before Linux 6.6.
    let work = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a work directory");
    let nodes = ["a", "b", "c", "d"];
    // One key file for every server: the uploader, another client, and a key per
    // server that every server names as a replicator.
    let keys = work.path().join("keys");
    std::fs::create_dir(&keys).unwrap();
    let mut authorized = String::new();
    for who in ["alice".to_owned(), "bob".to_owned()]
        .into_iter()
        .chain(nodes.map(node_identity))
    {
        authorized += &keygen(&keys, &who, &format!("{who}.key"));
        authorized.push('\n');
    }
    let keys_file = keys.join("authorized_keys");
    std::fs::write(&keys_file, authorized).unwrap();
    let keys_arg = keys_file.display().to_string();
    let mut servers = std::collections::BTreeMap::new();
    let grace = Duration::from_secs(5);
    let grace_arg = grace.as_secs().to_string();
    for node in nodes {
        let store = work.path().join(format!("store-{node}"));
        std::fs::create_dir(&store).unwrap();
        let store_arg = store.display().to_string();
        let repair_key = keys.join(format!("{}.key", node_identity(node)));
        let repair_key = repair_key.display().to_string();
        let mut args = vec![
            "--files-dir".to_owned(),
            store_arg,
            "--authorized-keys".to_owned(),
            keys_arg.clone(),
            "--repair-key".to_owned(),
            repair_key,
            "--repair-after-secs".to_owned(),
            grace_arg.clone(),
            "--repair-every-secs".to_owned(),
            "1".to_owned(),
        ];
        for other in nodes {
            args.push("--files-replicator".to_owned());
            args.push(node_identity(other));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (child, addr, log) = start_server_logged(&etcd, node, &args);
        servers.insert(node, (child, addr, store, log));
    }
    let src = work.path().join("src");
    std::fs::create_dir(&src).unwrap();
    // Six files of 64 KiB to 2.5 MiB (multi-chunk, with a partial last chunk).
    let files: Vec<(String, Vec<u8>)> = (0..6u64)
        .map(|i| {
            let name = format!("file-{i}.bin");
            let bytes = pattern((64 << 10) + (i as usize) * 500_000 + 7, i);
            std::fs::write(src.join(&name), &bytes).unwrap();
            (name, bytes)
        })
        .collect();
    actix_run(async {
        let as_who = |who: &str| {
            let key = Credential::load(keys.join(format!("{who}.key"))).expect("a key");
            Client::start(NodeConfig::default())
                .expect("client")
                .with_identity(key)
        };
        let client = as_who("alice");
        let bob = as_who("bob");
        let config = EtcdConfig::new([etcd.url()]);
        let cluster = ClusterFiles::new(RdmaFiles::new(&client), config, "vm").expect("files");
        cluster
            .membership()
            .wait_for(Duration::from_secs(10), |n| n.len() == 4)
            .await
            .unwrap_or_else(|| {
                panic!(
                    "four files nodes: {:?}",
                    names(&cluster.membership().nodes())
                )
            });

        // Put: two verified replicas each, on disk byte for byte where the record says.
        let started = Instant::now();
        let mut records: std::collections::HashMap<String, rdmactor_cluster::files::FileRecord> =
            std::collections::HashMap::new();
        for (name, bytes) in &files {
            let record = cluster.put(&src.join(name), name).await.expect("put");
            assert_eq!(record.nodes.len(), 2, "{name}: {record:?}");
            assert_eq!(record.size, bytes.len() as u64);
            for node in &record.nodes {
                let held = std::fs::read(servers[node.as_str()].2.join(name)).expect("replica");
                assert!(held == *bytes, "{name} on {node} differs");
            }
            records.insert(name.clone(), record);
        }
        let total: usize = files.iter().map(|(_, b)| b.len()).sum();
        println!(
            "put {} files ({} bytes) with R = 2 in {:?}",
            files.len(),
            total,
            started.elapsed()
        );
        // A second put of a name is refused: created once.
        let again = cluster.put(&src.join("file-0.bin"), "file-0.bin").await;
        assert!(again.is_err(), "a name is created once");

        // A scrub's questions: each node asked about every file (and a name nobody
        // holds, between them) on one connection, the answers in order: the recorded
        // digest where the record names the node, `NotFound` elsewhere.
        let mut asked: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
        asked.insert(2, "nobody-holds-this.bin".to_owned());
        for (node, (_, addr, _, _)) in &servers {
            let answers = RdmaFiles::new(&client).stat_many(*addr, &asked).await;
            assert_eq!(answers.len(), asked.len());
            for (name, answer) in asked.iter().zip(answers) {
                match (records.get(name), answer) {
                    (Some(r), Ok(held)) if r.nodes.iter().any(|n| n == node) => {
                        assert_eq!(held.digest, r.digest, "{name} on {node}");
                    }
                    (Some(r), Err(TransferError::NotFound))
                        if !r.nodes.iter().any(|n| n == node) => {}
                    (None, Err(TransferError::NotFound)) => {}
                    (record, answer) => {
                        panic!("stat of {name} on {node}: {answer:?}, record {record:?}")
                    }
                }
            }
        }

        // SIGKILL the node holding the most replicas.
        let victim = ["a", "b", "c", "d"]
            .into_iter()
            .max_by_key(|n| {
                records
                    .values()
                    .filter(|r| r.nodes.iter().any(|x| x == n))
                    .count()
            })
            .unwrap();
        let on_victim: Vec<String> = records
            .iter()
            .filter(|(_, r)| r.nodes.iter().any(|x| x == victim))
            .map(|(n, _)| n.clone())
            .collect();
        assert!(!on_victim.is_empty());
        let (child, _, _, _) = servers.get_mut(victim).unwrap();
        signal(child, "-KILL");
        let killed = Instant::now();
        let _ = child.wait();

        // Every file comes back whole, the victim's from their other replica.
        let out = work.path().join("out-1");
        std::fs::create_dir(&out).unwrap();
        for (name, bytes) in &files {
            let got = cluster
                .get(name, &out)
                .await
                .unwrap_or_else(|e| panic!("get {name}: {e}"));
            assert_ne!(got.node, victim, "{name} fetched from the killed node");
            assert!(
                std::fs::read(&got.path).unwrap() == *bytes,
                "{name} differs"
            );
        }
        println!(
            "all {} files fetched whole after SIGKILL of {victim} ({} of them had a replica there), {:?} after the kill",
            files.len(),
            on_victim.len(),
            killed.elapsed()
        );

        // Repair, by the servers: nothing the moment the node is seen gone, then after
        // the grace period each of its files is copied to another node and recorded.
        cluster
            .membership()
            .wait_for(Duration::from_secs(10), |n| n.len() == 3)
            .await
            .unwrap_or_else(|| {
                panic!(
                    "{victim} expired: {:?}",
                    names(&cluster.membership().nodes())
                )
            });
        let gone_after = killed.elapsed();
        let holds_victim =
            |r: &rdmactor_cluster::files::FileRecord| r.nodes.iter().any(|n| n == victim);
        for name in &on_victim {
            let now = cluster.catalog().get(name).await.unwrap().unwrap().record;
            assert!(
                holds_victim(&now),
                "{name} repaired within the grace period: {now:?}"
            );
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let mut left = Vec::new();
            for name in &on_victim {
                let now = cluster.catalog().get(name).await.unwrap().unwrap().record;
                if holds_victim(&now) {
                    left.push(name.clone());
                }
            }
            if left.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "not repaired: {left:?}");
            actix_rt::time::sleep(Duration::from_millis(500)).await;
        }
        println!(
            "{victim} left the registry {gone_after:?} after the kill; {} files repaired to R = 2 by the servers {:?} after the kill (grace {grace:?})",
            on_victim.len(),
            killed.elapsed()
        );
        // Each copy made once, by the node it went to (a server prints its round's
        // copies once the round is over: shortly after the catalog shows them).
        let made_so_far = || {
            let mut made: Vec<(String, String)> = Vec::new();
            for (node, (_, _, _, log)) in &servers {
                for line in log.lock().unwrap().iter() {
                    let Some(rest) = line.strip_prefix("cluster: REPAIRED ") else {
                        continue;
                    };
                    let name = rest.split_whitespace().next().unwrap().to_owned();
                    assert!(
                        rest.ends_with(&format!(" to={node}")),
                        "{node} printed {line}"
                    );
                    made.push((name, node.to_string()));
                }
            }
            made
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while made_so_far().len() < on_victim.len() && Instant::now() < deadline {
            actix_rt::time::sleep(Duration::from_millis(200)).await;
        }
        let mut made = made_so_far();
        made.sort();
        let mut names_made: Vec<&String> = made.iter().map(|(n, _)| n).collect();
        names_made.dedup();
        let mut expected: Vec<&String> = on_victim.iter().collect();
        expected.sort();
        assert_eq!(
            names_made, expected,
            "every file of {victim} repaired: {made:?}"
        );
        assert_eq!(made.len(), on_victim.len(), "each copy made once: {made:?}");
        println!("copies made by their target: {made:?}");
        for name in &on_victim {
            let now = cluster.catalog().get(name).await.unwrap().unwrap().record;
            assert_eq!(now.nodes.len(), 2, "{name}: {now:?}");
            assert!(!now.nodes.iter().any(|n| n == victim), "{name}: {now:?}");
            let bytes = &files.iter().find(|(n, _)| n == name).unwrap().1;
            for node in &now.nodes {
                let held = std::fs::read(servers[node.as_str()].2.join(name)).expect("replica");
                assert!(held == *bytes, "{name} on {node} differs after repair");
            }
            // The copy is alice's: she fetches it from the node it was copied to and
            // from the other, on connections of her own; bob is told what a missing
            // file would tell him.
            for node in &now.nodes {
                let (_, addr, store, _) = &servers[node.as_str()];
                let owner = ownership::owner_at(&store.join(name)).expect("owner");
                assert_eq!(owner.as_deref(), Some("alice"), "{name} on {node}");
                let mine = work.path().join(format!("mine-{node}"));
                std::fs::create_dir_all(&mine).unwrap();
                let got = RdmaFiles::new(&client)
                    .fetch(*addr, name, &mine, u64::MAX, None)
                    .await
                    .unwrap_or_else(|e| panic!("alice's fetch of {name} from {node}: {e}"));
                assert_eq!(got.size, bytes.len() as u64);
                assert!(std::fs::read(mine.join(name)).unwrap() == *bytes);
                let theirs = work.path().join(format!("bob-{node}"));
                std::fs::create_dir_all(&theirs).unwrap();
                let refused = RdmaFiles::new(&bob)
                    .fetch(*addr, name, &theirs, u64::MAX, None)
                    .await;
                assert_eq!(
                    refused,
                    Err(TransferError::NotFound),
                    "bob's fetch of {name} from {node}"
                );
            }
        }
        // And every file still comes back whole.
        let out = work.path().join("out-2");
        std::fs::create_dir(&out).unwrap();
        for (name, bytes) in &files {
            let got = cluster
                .get(name, &out)
                .await
                .unwrap_or_else(|e| panic!("get {name}: {e}"));
            assert!(
                std::fs::read(&got.path).unwrap() == *bytes,
                "{name} differs"
            );
        }
        // Overwrites: bob's is refused by every server (before the rename), alice's
        // moves the record to her new bytes on R nodes.
        let name = &files[1].0;
        let before = cluster.catalog().get(name).await.unwrap().unwrap().record;
        let new_bytes = pattern(200_000, 99);
        let new_src = work.path().join("new").join(name);
        std::fs::create_dir_all(new_src.parent().unwrap()).unwrap();
        std::fs::write(&new_src, &new_bytes).unwrap();
        let bobs = ClusterFiles::new(RdmaFiles::new(&bob), EtcdConfig::new([etcd.url()]), "vm")
            .expect("bob's files");
        let refused = bobs.overwrite(&new_src, name).await.unwrap_err();
        drop(bobs);
        assert_eq!(
            cluster.catalog().get(name).await.unwrap().unwrap().record,
            before
        );
        for node in &before.nodes {
            let held = std::fs::read(servers[node.as_str()].2.join(name)).unwrap();
            assert!(
                held == files[1].1,
                "bob's overwrite changed {name} on {node}"
            );
        }
        let now = cluster
            .overwrite(&new_src, name)
            .await
            .expect("alice's overwrite");
        assert_eq!(now.nodes.len(), 2, "{now:?}");
        assert_ne!(now.digest, before.digest);
        assert_eq!(now.owner.as_deref(), Some("alice"));
        for node in &now.nodes {
            let held = std::fs::read(servers[node.as_str()].2.join(name)).unwrap();
            assert!(held == new_bytes, "{name} on {node} after the overwrite");
        }
        let out = work.path().join("out-3");
        std::fs::create_dir(&out).unwrap();
        let got = cluster.get(name, &out).await.expect("the new bytes");
        assert!(std::fs::read(&got.path).unwrap() == new_bytes);
        println!(
            "bob's overwrite of {name} refused ({refused}); alice's moved it to {:?}",
            now.nodes
        );

        // Deletes: bob's is refused by every server and changes nothing; alice's
        // removes every copy and the record (each server forgets it before its copy).
        let name = &files[0].0;
        let before = cluster.catalog().get(name).await.unwrap().unwrap().record;
        let bobs = ClusterFiles::new(RdmaFiles::new(&bob), EtcdConfig::new([etcd.url()]), "vm")
            .expect("bob's files");
        let refused = bobs.delete(name).await.unwrap_err();
        assert!(
            matches!(refused, FilesError::DeleteFailed { .. }),
            "bob's delete of {name}: {refused}"
        );
        drop(bobs);
        assert_eq!(
            cluster.catalog().get(name).await.unwrap().unwrap().record,
            before
        );
        let deleted = cluster.delete(name).await.expect("alice's delete");
        assert_eq!(deleted.removed, before.nodes, "{deleted:?}");
        assert!(cluster.catalog().get(name).await.unwrap().is_none());
        for node in &before.nodes {
            assert!(
                !servers[node.as_str()].2.join(name).exists(),
                "{name} left on {node}"
            );
        }
        println!(
            "bob's delete of {name} refused ({refused}); alice's removed it from {:?}",
            deleted.removed
        );
        drop(cluster);
        client.shutdown().await;
        bob.shutdown().await;
    });
    // The three left shut down (the victim's kill fails: it is gone).
    for (_, (mut child, _, _, _)) in servers {
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let _ = child.wait();
    }
    assert_released(&base);
}

/// The identity server `node` repairs with.
fn node_identity(node: &str) -> String {
    format!("node-{node}")
}

/// Writes a new Ed25519 key for `identity` to `dir/file` with `keygen`; returns its
/// authorized-keys line.
fn keygen(dir: &std::path::Path, identity: &str, file: &str) -> String {
    let out = Command::new(target_bin("keygen"))
        .args(["--identity", identity, "--out"])
        .arg(dir.join(file))
        .output()
        .expect("run keygen (scripts/test builds it)");
    assert!(out.status.success(), "keygen: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Runs a tool binary to its end; its stdout, after asserting it exited 0.
fn tool(name: &str, args: &[&str]) -> String {
    let out = Command::new(target_bin(name))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {name}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name} {args:?}: {:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn client_and_ft_find_the_servers_through_the_registry_and_echo_moves_off_a_killed_one() {
    let Some(_ctx) = rdma_context() else { return };
    let Some(etcd) = Etcd::start() else { return };
    let _reaper = KillServersOnPanic;
    let work = tempfile::tempdir().expect("a work directory");
    let mut servers = Vec::new();
    for node in ["a", "b"] {
        let store = work.path().join(format!("store-{node}"));
        std::fs::create_dir(&store).unwrap();
        let store_arg = store.display().to_string();
        let (child, _) = start_server_with(
            &etcd,
            node,
            &["--files-dir", &store_arg, "--files-public-fetch"],
        );
        servers.push((node, child, store));
    }
    let url = etcd.url();
    let cluster = ["--cluster", "vm", "--etcd", url.as_str()];
    actix_run(async {
        let echo = Membership::watch(EtcdConfig::new([etcd.url()]), "vm", "files").unwrap();
        echo.wait_for(Duration::from_secs(10), |n| n.len() == 2)
            .await
            .expect("both listed");
    });

    // ft: a file to two nodes, recorded, fetched back whole.
    let bytes = pattern(3 << 20, 9);
    let src = work.path().join("tool.bin");
    std::fs::write(&src, &bytes).unwrap();
    let sent = tool(
        "ft",
        &[&cluster[..], &["send", src.to_str().unwrap()]].concat(),
    );
    assert!(sent.starts_with("GOOD tool.bin sha256:"), "{sent}");
    assert!(
        sent.contains("nodes=a,b") || sent.contains("nodes=b,a"),
        "{sent}"
    );
    let out = work.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let out_arg = out.display().to_string();
    let got = tool(
        "ft",
        &[&cluster[..], &["fetch", "--out", &out_arg, "tool.bin"]].concat(),
    );
    assert!(got.contains("GOOD tool.bin sha256:"), "{got}");
    assert!(std::fs::read(out.join("tool.bin")).unwrap() == bytes);

    // client echo: two sessions, one per server; one server is SIGKILLed under them,
    // and every echo is still answered, the lost ones on the other node. Enough requests
    // that the kill lands while they run: 4,000 per session were seen to finish before
    // it, on a quiet host (the echo round trip is tens of microseconds).
    let mut client = Command::new(target_bin("client"))
        .args(cluster)
        .args(["echo", "--connections", "2", "--requests", "20000"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("client");
    let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
    // `session C on node N (ADDR)` for each, then `connected 2`. Least loaded spreads
    // the two over a and b unless a report lags: the victim is a node that holds one.
    let placed: Vec<String> = lines
        .by_ref()
        .map(|l| l.expect("stdout"))
        .take_while(|l| l != "connected 2")
        .collect();
    let on = |node: &str| {
        placed
            .iter()
            .any(|l| l.contains(&format!(" on node {node} (")))
    };
    let victim_name = if on("a") { "a" } else { "b" };
    assert!(on(victim_name), "no session placed: {placed:?}");
    println!("sessions placed: {placed:?}; killing {victim_name}");
    let at = servers
        .iter()
        .position(|(n, _, _)| *n == victim_name)
        .unwrap();
    let killed = servers.remove(at);
    let mut victim = killed.1;
    signal(&victim, "-KILL");
    let _ = victim.wait();
    let rest: Vec<String> = lines.map(|l| l.expect("stdout")).collect();
    let status = client.wait().expect("client exits");
    assert!(status.success(), "client: {status:?}: {rest:?}");
    let moved: Vec<&String> = rest.iter().filter(|l| l.starts_with("MOVED")).collect();
    println!("client echo through the cluster, a SIGKILLed under it: {rest:?}");
    assert!(
        moved
            .iter()
            .any(|l| l.starts_with(&format!("MOVED node {victim_name} ("))),
        "no move off {victim_name}: {rest:?}"
    );
    assert!(
        rest.iter()
            .any(|l| *l == format!("RESULT kind=echo connections=2 requests={}", 2 * 20_000)),
        "{rest:?}"
    );
    for (_, mut child, _) in servers {
        signal(&child, "-TERM");
        let _ = child.wait();
    }
}
