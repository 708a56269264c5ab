//! Issue 46 on real verbs: the `server` binary with `--authorized-keys` (keys made by
//! `keygen`), played against as hostile clients would: `Client`s of this process over
//! verbs (a wrong key, an unknown identity, a replayed, truncated or oversized proof, no
//! proof, a flood from one address), stock `rping`, and the `client` binary. Each
//! refusal reaches the client with its reason, the server's QPs go back to what it held
//! once listening (`rdma resource show qp pid`), an honest client is served after it,
//! and once the server exits the device's counts are back to the test's start.
//! The native twins over loopback: framework/tests/auth.rs.

use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdmactor::proto::hello::RejectCode;
use rdmactor::runtime::{
    Client, ClientConnection, ConnectError, Credential, Identity, NodeConfig, RawProof, NONCE_LEN,
};
use rdmactor_tests::{
    actix_run, assert_released, echo_ok, eventually, qps_of, rdma_context, resource_counts,
    second_peer_ip, target_bin, test_addr,
};

/// A child process, SIGKILLed if the test ends (or fails) with it still running.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// `server --authorized-keys` holding alice's Ed25519 key and jobs's pre-shared key,
/// with `discard` also open to anonymous clients (`--anonymous`), and a second port
/// whose default service is rping.
struct Keyed {
    server: Running,
    /// The rdmactor clients' port.
    addr: SocketAddr,
    /// The rping port.
    rping: SocketAddr,
    /// The server's QPs once it listens.
    qps: usize,
    /// What it prints after its addresses.
    log: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
    /// The key files (shared by servers that read one authorized keys file).
    dir: Arc<tempfile::TempDir>,
}

/// Runs `keygen` for `identity`, writing `dir/file`; the authorized keys line it prints.
fn keygen(dir: &Path, identity: &str, file: &str, psk: bool) -> String {
    let mut cmd = Command::new(target_bin("keygen"));
    cmd.args(["--identity", identity, "--out"])
        .arg(dir.join(file));
    if psk {
        cmd.arg("--psk");
    }
    let out = cmd
        .output()
        .expect("run keygen (build the examples' binaries)");
    assert!(out.status.success(), "keygen: {}", text(&out));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A tool's status, stdout and stderr, for messages.
fn text(out: &Output) -> String {
    format!(
        "{:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

impl Keyed {
    fn start() -> Keyed {
        Keyed::start_with(None, &[])
    }

    /// A server with `extra` arguments, reading the authorized keys file of `keys_of`
    /// (two servers sharing one key file) or of a key directory of its own.
    fn start_with(keys_of: Option<&Keyed>, extra: &[OsString]) -> Keyed {
        let dir = match keys_of {
            Some(other) => other.dir.clone(),
            None => {
                let dir = tempfile::tempdir().expect("a key directory");
                let alice = keygen(dir.path(), "alice", "alice.key", false);
                let jobs = keygen(dir.path(), "jobs", "jobs.key", true);
                let keys = dir.path().join("authorized_keys");
                std::fs::write(&keys, format!("{alice}\n{jobs}\n")).unwrap();
                Arc::new(dir)
            }
        };
        let keys = dir.path().join("authorized_keys");
        let ip = test_addr().ip();
        let child = Command::new(target_bin("server"))
            .args(["--listen", &format!("{ip}:0")])
            .args(["--listen", &format!("{ip}:0=rping")])
            .args(["--anonymous", "discard", "--authorized-keys"])
            .arg(&keys)
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the server binary (build the examples' binaries)");
        let mut server = Running(child);
        let mut out = BufReader::new(server.0.stdout.take().unwrap());
        let mut addrs = Vec::new();
        while addrs.len() < 2 {
            let mut line = String::new();
            let n = out.read_line(&mut line).expect("the server's output");
            assert!(n > 0, "the server exited before listening");
            if let Some(addr) = line.trim().strip_prefix("listening on ") {
                addrs.push(addr.parse::<SocketAddr>().expect("an address"));
            }
        }
        let log = Arc::<Mutex<Vec<String>>>::default();
        let lines = log.clone();
        let reader = std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
        let qps = qps_of(server.0.id());
        Keyed {
            server,
            addr: addrs[0],
            rping: addrs[1],
            qps,
            log,
            reader: Some(reader),
            dir,
        }
    }

    fn key_file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A client of this process proving `credential`, or anonymous.
    fn client(&self, credential: Option<Credential>) -> Client {
        let client = Client::start(NodeConfig::default()).expect("client");
        match credential {
            Some(c) => client.with_identity(c),
            None => client,
        }
    }

    fn alice(&self) -> Credential {
        Credential::load(self.key_file("alice.key")).expect("alice's key file")
    }

    /// Waits until the server holds the QPs it held once listening.
    async fn qps_back(&self) {
        let (pid, base) = (self.server.0.id(), self.qps);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let now = qps_of(pid);
            if now == base {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the server holds {now} QPs, {base} once listening"
            );
            actix_rt::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// After refusals: `clients` hold no connection (and are shut down), the server's
    /// QPs are back, and alice (from another address) is served an echo; then the
    /// server's QPs are back again.
    async fn left_nothing_and_serves(&self, clients: Vec<Client>) {
        for client in clients {
            eventually(
                "the client's connections to close",
                Duration::from_secs(20),
                || {
                    let client = &client;
                    async move { client.stats().await.connections == 0 }
                },
            )
            .await;
            client.shutdown().await;
        }
        self.qps_back().await;
        let alice = self.client(Some(self.alice()));
        // From the second address: the refusals' own may be throttled by now.
        let conn = alice
            .connect_from(second_peer_ip(), self.addr, "echo")
            .await
            .expect("alice served");
        assert_eq!(conn.identity(), &Identity::Key("alice".into()));
        echo_ok(&conn, b"still serving".to_vec()).await;
        conn.close().await;
        alice.shutdown().await;
        self.qps_back().await;
    }

    /// SIGTERM; asserts a clean exit and returns its last line ("shut down cleanly: N
    /// accepted, M rejected, K closed").
    fn stop(mut self) -> String {
        let pid = self.server.0.id().to_string();
        let ok = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(ok.success(), "kill -TERM {pid}");
        let status = self.server.0.wait().unwrap();
        assert!(status.success(), "the server exited with {status:?}");
        self.reader.take().unwrap().join().unwrap();
        let log = self.log.lock().unwrap();
        let last = log.last().cloned().unwrap_or_default();
        assert!(last.starts_with("shut down cleanly"), "{log:?}");
        last
    }
}

/// The server's reason for refusing a connect.
fn refused(result: Result<ClientConnection, ConnectError>) -> String {
    match result {
        Err(ConnectError::Auth(why)) => why,
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(conn) => panic!("served as {:?}", conn.identity()),
    }
}

/// Runs `body` against a fresh keyed server, then stops it and checks the device's
/// counts came back to the test's start.
fn with_keyed<F: std::future::Future<Output = ()>>(body: impl FnOnce(Arc<Keyed>) -> F) {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    let keyed = Arc::new(Keyed::start());
    actix_run(body(keyed.clone()));
    let keyed = Arc::into_inner(keyed).expect("the test let go of its server");
    println!("{}", keyed.stop());
    assert_released(&base);
}

#[test]
fn a_wrong_key_for_a_known_identity_is_refused_as_a_bad_proof() {
    with_keyed(|s| async move {
        // The right names, other keys: an Ed25519 impostor and a PSK one.
        let ed = s.client(Some(Credential::generate_ed25519("alice").unwrap()));
        assert_eq!(refused(ed.connect(s.addr, "echo").await), "bad proof");
        let psk = s.client(Some(Credential::generate_psk("jobs").unwrap()));
        assert_eq!(refused(psk.connect(s.addr, "echo").await), "bad proof");
        s.left_nothing_and_serves(vec![ed, psk]).await;
        // And the real PSK is served: the refusal was the key's.
        let jobs = Credential::load(s.key_file("jobs.key")).unwrap();
        let jobs = s.client(Some(jobs));
        let conn = jobs.connect(s.addr, "echo").await.expect("jobs served");
        assert_eq!(conn.identity(), &Identity::Key("jobs".into()));
        echo_ok(&conn, b"jobs".to_vec()).await;
        conn.close().await;
        s.left_nothing_and_serves(vec![jobs]).await;
    });
}

#[test]
fn an_unknown_identity_is_refused_by_name() {
    with_keyed(|s| async move {
        let mallory = s.client(Some(Credential::generate_ed25519("mallory").unwrap()));
        assert_eq!(
            refused(mallory.connect(s.addr, "echo").await),
            "unknown identity"
        );
        s.left_nothing_and_serves(vec![mallory]).await;
    });
}

/// A hostile client that sends `make(nonce, service)` as its proof.
fn raw(s: &Keyed, make: RawProof) -> Client {
    s.client(None).with_raw_proof(make)
}

#[test]
fn a_proof_captured_on_one_connection_is_refused_on_another() {
    with_keyed(|s| async move {
        // The eavesdropper's capture: the bytes alice's client sent on its connection.
        let captured = Arc::<Mutex<Option<Vec<u8>>>>::default();
        let (alice, tap) = (s.alice(), captured.clone());
        let recording = raw(
            &s,
            Arc::new(move |nonce: &[u8; NONCE_LEN], service: &str| {
                let bytes = postcard::to_allocvec(&alice.prove(nonce, service)).unwrap();
                *tap.lock().unwrap() = Some(bytes.clone());
                bytes
            }),
        );
        let conn = recording
            .connect(s.addr, "echo")
            .await
            .expect("alice served");
        assert_eq!(conn.identity(), &Identity::Key("alice".into()));
        let replay = captured.lock().unwrap().clone().expect("captured");
        let attacker = raw(
            &s,
            Arc::new(move |_: &[u8; NONCE_LEN], _: &str| replay.clone()),
        );
        // While alice's connection is open, and after it closed.
        assert_eq!(refused(attacker.connect(s.addr, "echo").await), "bad proof");
        echo_ok(&conn, b"alice goes on".to_vec()).await;
        conn.close().await;
        assert_eq!(refused(attacker.connect(s.addr, "echo").await), "bad proof");
        s.left_nothing_and_serves(vec![recording, attacker]).await;
    });
}

#[test]
fn truncated_and_oversized_proofs_are_refused_as_malformed() {
    with_keyed(|s| async move {
        let alice = s.alice();
        let cut = raw(
            &s,
            Arc::new(move |nonce: &[u8; NONCE_LEN], service: &str| {
                let bytes = postcard::to_allocvec(&alice.prove(nonce, service)).unwrap();
                bytes[..bytes.len() - 20].to_vec()
            }),
        );
        let why = refused(cut.connect(s.addr, "echo").await);
        assert!(why.starts_with("malformed proof: "), "{why}");
        let mut clients = vec![cut];
        // Just past the bound (an eager message), and far past it (a large one).
        for len in [257, 100_000] {
            let big = raw(
                &s,
                Arc::new(move |_: &[u8; NONCE_LEN], _: &str| vec![7; len]),
            );
            assert_eq!(
                refused(big.connect(s.addr, "echo").await),
                format!("malformed proof: {len} bytes, at most 256")
            );
            clients.push(big);
        }
        s.left_nothing_and_serves(clients).await;
    });
}

#[test]
fn an_anonymous_client_is_refused_on_a_protected_service_and_served_on_an_open_one() {
    with_keyed(|s| async move {
        let anon = s.client(None);
        assert_eq!(
            refused(anon.connect(s.addr, "echo").await),
            "service needs authentication"
        );
        // `--anonymous discard`: no proof asked.
        let open = anon
            .connect(s.addr, "discard")
            .await
            .expect("discard is open");
        assert_eq!(open.identity(), &Identity::Anonymous);
        open.close().await;
        s.left_nothing_and_serves(vec![anon]).await;
    });
}

/// What a flood saw: refusals at the proof, throttled rejects, connects the transport
/// failed before the server decided anything, and how long it ran.
struct Flooded {
    bad_proof: usize,
    throttled: usize,
    /// librdmacm's own CONNECT_ERROR (status -1: the QP's move to RTR/RTS or the RTU
    /// failed on this side), seen about once in a thousand connects of a flood in the
    /// VM; not a refusal, so counted apart, printed, and bounded by the tests.
    transport: usize,
    /// Refusals that reached the client as "peer disconnected" instead of "bad proof":
    /// the server's Close frame did not arrive before its disconnect. Open (issue 46):
    /// about once in 2,000 attempts of a flood in the VM, after the client-side fix for
    /// a frame overtaken by the disconnect; counted, printed, and bounded by the tests.
    lost_reason: usize,
    took: Duration,
}

impl Flooded {
    /// Every attempt, whatever became of it.
    fn total(&self) -> usize {
        self.bad_proof + self.throttled + self.transport + self.lost_reason
    }

    /// At most 1% of the attempts ended other than refused with their reason or throttled.
    fn assert_few_unexplained(&self) {
        let unexplained = self.transport + self.lost_reason;
        assert!(
            unexplained * 100 <= self.total(),
            "{} of {} attempts failed in the transport and {} lost their reason",
            self.transport,
            self.total(),
            self.lost_reason
        );
    }

    /// The most proof checks the address's bucket allows over the flood (64, refilled
    /// at 1/s, one more for the second begun), plus one per stream in flight when the
    /// bucket runs dry.
    fn allowed(&self, streams: usize) -> usize {
        rdmactor::runtime::FAILURE_BURST as usize + self.took.as_secs() as usize + 1 + streams
    }
}

/// `streams` × `each` connects proving an impostor's alice key, from the test address,
/// on a thread and actix System of their own (so that the polite client's connect in
/// this process waits for nothing of theirs). `throttled` counts the throttled rejects
/// as they come; `done` is set when the last attempt ended.
fn flood(
    at: SocketAddr,
    (streams, each): (usize, usize),
    throttled: Arc<AtomicUsize>,
    done: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Flooded> {
    std::thread::spawn(move || {
        actix_run(async move {
            let impostor = Credential::generate_ed25519("alice").unwrap();
            let client = Client::start(NodeConfig::default())
                .expect("client")
                .with_identity(impostor);
            let from = test_addr().ip();
            let begun = Instant::now();
            let (c, throttled) = (&client, &throttled);
            let stream = move || async move {
                let (mut bad_proof, mut transport, mut lost_reason) = (0, 0, 0);
                for _ in 0..each {
                    match c.connect_from(from, at, "echo").await {
                        Err(ConnectError::Auth(why)) if why == "peer disconnected" => {
                            println!("a flood attempt's refusal lost its reason: {why}");
                            lost_reason += 1;
                        }
                        Err(ConnectError::Auth(why)) => {
                            assert_eq!(why, "bad proof");
                            bad_proof += 1;
                        }
                        Err(e @ ConnectError::Failed { .. }) => {
                            println!("a flood attempt failed in the transport: {e}");
                            transport += 1;
                        }
                        Err(ConnectError::Rejected(r)) => {
                            assert_eq!(r.code, RejectCode::Throttled, "{r}");
                            throttled.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(other) => panic!("a flood attempt: {other}"),
                        Ok(_) => panic!("an impostor served"),
                    }
                }
                (bad_proof, transport, lost_reason)
            };
            let counts = futures::future::join_all((0..streams).map(|_| stream())).await;
            let took = begun.elapsed();
            done.store(true, Ordering::Relaxed);
            eventually(
                "the flood's connections to close",
                Duration::from_secs(20),
                || async move { c.stats().await.connections == 0 },
            )
            .await;
            client.shutdown().await;
            Flooded {
                bad_proof: counts.iter().map(|c| c.0).sum(),
                throttled: throttled.load(Ordering::Relaxed),
                transport: counts.iter().map(|c| c.1).sum(),
                lost_reason: counts.iter().map(|c| c.2).sum(),
                took,
            }
        })
    })
}

/// Waits for a flood's thread without holding up this System.
async fn flood_ended(flooding: std::thread::JoinHandle<Flooded>) -> Flooded {
    while !flooding.is_finished() {
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    flooding.join().expect("the flood")
}

#[test]
fn a_flood_of_bad_attempts_from_one_address_does_not_delay_another() {
    // 2,000 attempts, four at a time.
    const STREAMS: usize = 4;
    with_keyed(|s| async move {
        // Started before the flood: the time measured is the server's, not the
        // client's device being opened.
        let polite = s.client(Some(s.alice()));
        let throttled = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let flooding = flood(s.addr, (STREAMS, 500), throttled.clone(), done.clone());
        // Once the attacker's address is throttled (the flood in full swing), alice
        // connects from the second address and is answered within a second.
        eventually("the flood to be throttled", Duration::from_secs(60), || {
            let (throttled, flooding) = (&throttled, &flooding);
            async move {
                assert!(!flooding.is_finished(), "the flood ended unthrottled");
                throttled.load(Ordering::Relaxed) > 0
            }
        })
        .await;
        let begun = Instant::now();
        let conn = polite
            .connect_from(second_peer_ip(), s.addr, "echo")
            .await
            .expect("the polite client is served");
        echo_ok(&conn, b"polite".to_vec()).await;
        let took = begun.elapsed();
        let under_way = !done.load(Ordering::Relaxed);
        let seen = throttled.load(Ordering::Relaxed);
        conn.close().await;
        let f = flood_ended(flooding).await;
        println!(
            "polite connect + echo: {took:?} ({seen} throttled before); flood: {} bad proof, \
             {} throttled, {} failed in the transport, {} lost their reason, in {:?} (the \
             bucket allows {})",
            f.bad_proof,
            f.throttled,
            f.transport,
            f.lost_reason,
            f.took,
            f.allowed(STREAMS)
        );
        assert!(
            under_way,
            "the flood ended before the polite client was served"
        );
        assert!(took < Duration::from_secs(1), "served in {took:?}");
        assert_eq!(f.total(), 2000);
        f.assert_few_unexplained();
        s.left_nothing_and_serves(vec![polite]).await;
    });
}

#[test]
fn failures_in_parallel_from_one_address_are_held_to_its_bucket() {
    // Sixteen attempts at a time, 1,200 in all (several seconds): each second earns the
    // address one proof check, however many attempts it has in flight.
    const STREAMS: usize = 16;
    with_keyed(|s| async move {
        let flooding = flood(s.addr, (STREAMS, 75), Arc::default(), Arc::default());
        let f = flood_ended(flooding).await;
        println!(
            "{} bad proof, {} throttled, {} failed in the transport, {} lost their reason, \
             in {:?}",
            f.bad_proof, f.throttled, f.transport, f.lost_reason, f.took
        );
        assert_eq!(f.total(), STREAMS * 75);
        f.assert_few_unexplained();
        assert!(
            f.bad_proof + f.lost_reason <= f.allowed(STREAMS),
            "{} attempts from one address reached a proof check in {:?} ({} of them lost \
             their reason): its bucket (64, 1/s) allows {}",
            f.bad_proof + f.lost_reason,
            f.took,
            f.lost_reason,
            f.allowed(STREAMS)
        );
        s.left_nothing_and_serves(vec![]).await;
    });
}

#[test]
fn stock_rping_passes_against_the_anonymous_rping_service_of_a_keyed_server() {
    with_keyed(|s| async move {
        let (ip, port) = (s.rping.ip().to_string(), s.rping.port().to_string());
        let out = Command::new("rping")
            .args(["-c", "-a", &ip, "-p", &port, "-C", "3", "-V"])
            .output()
            .expect("run rping");
        assert!(out.status.success(), "rping: {}", text(&out));
        s.left_nothing_and_serves(vec![]).await;
    });
}

/// Runs the `client` binary's short latency run against `at` with `key` (if any).
fn client_binary(at: SocketAddr, key: Option<&Path>) -> Output {
    let begun = Instant::now();
    let mut cmd = Command::new(target_bin("client"));
    cmd.args(["--addr", &at.to_string()]);
    if let Some(key) = key {
        cmd.arg("--key").arg(key);
    }
    // No backtrace captured for its error: symbolizing one takes seconds in the VM.
    let out = cmd
        .args(["latency", "--iters", "20", "--warmup", "2"])
        .env("RUST_LIB_BACKTRACE", "0")
        .output()
        .expect("run the client binary");
    println!(
        "client --key {key:?}: {} in {:?}",
        out.status,
        begun.elapsed()
    );
    out
}

#[test]
fn the_client_binary_is_served_with_its_key_and_refused_with_an_impostors() {
    with_keyed(|s| async move {
        let out = client_binary(s.addr, Some(&s.key_file("alice.key")));
        assert!(
            out.status.success(),
            "client with alice's key: {}",
            text(&out)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("RESULT "), "{stdout}");
        // An impostor's key for alice, made as alice's was but never authorized.
        keygen(s.dir.path(), "alice", "impostor.key", false);
        for (key, why) in [
            (
                Some(s.key_file("impostor.key")),
                "authentication refused: bad proof",
            ),
            (None, "authentication refused: service needs authentication"),
        ] {
            let out = client_binary(s.addr, key.as_deref());
            assert!(
                !out.status.success(),
                "client {key:?} served: {}",
                text(&out)
            );
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains(why), "client {key:?}: {}", text(&out));
        }
        s.left_nothing_and_serves(vec![]).await;
    });
}

/// Command-line arguments of mixed kinds (words and paths).
fn os(parts: &[&dyn AsRef<OsStr>]) -> Vec<OsString> {
    parts.iter().map(|p| p.as_ref().to_owned()).collect()
}

/// Runs `ft` against `at` with `key` (if any), `args` after the options: whether it
/// exited 0, and what it printed.
fn ft(at: SocketAddr, key: Option<&Path>, args: &[OsString]) -> (bool, String) {
    let mut cmd = Command::new(target_bin("ft"));
    cmd.args(["--addr", &at.to_string()]);
    if let Some(key) = key {
        cmd.arg("--key").arg(key);
    }
    let out = cmd
        .args(args)
        .env("RUST_LIB_BACKTRACE", "0")
        .output()
        .expect("run ft");
    (out.status.success(), text(&out))
}

#[test]
fn an_identitys_files_are_its_own_on_two_servers_sharing_one_key_file() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    // Under the target directory, not /tmp: the owner is a user extended attribute, which
    // the VM's tmpfs lacks before Linux 6.6 (bookworm's kernel is 6.1), and the
    // repository's 9p mount passes to the host's filesystem.
    let work = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = |name: &str| work.path().join(name);
    for d in ["node1", "node2", "out", "forged"] {
        std::fs::create_dir_all(path(d)).unwrap();
    }
    // Neither server has --files-public-fetch.
    let one = Keyed::start_with(None, &os(&[&"--files-dir", &path("node1")]));
    let two = Keyed::start_with(Some(&one), &os(&[&"--files-dir", &path("node2")]));
    let report: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(path("report"), &report).unwrap();
    // Another file under the same name (ft stores a file under its own name).
    std::fs::write(path("forged").join("report"), b"not alice's report").unwrap();
    let (alice, jobs) = (one.key_file("alice.key"), one.key_file("jobs.key"));
    // Alice puts "report" on both servers (as a cluster client places its replicas).
    for at in [one.addr, two.addr] {
        let (ok, out) = ft(at, Some(&alice), &os(&[&"send", &path("report")]));
        assert!(
            ok && out.contains("GOOD report"),
            "alice's upload to {at}: {out}"
        );
    }
    let fetch = os(&[&"fetch", &"--out", &path("out"), &"report"]);
    let forge = os(&[&"send", &"--overwrite", &path("forged").join("report")]);
    for at in [one.addr, two.addr] {
        // Alice fetches it from either, on a connection of its own.
        let _ = std::fs::remove_file(path("out").join("report"));
        let (ok, out) = ft(at, Some(&alice), &fetch);
        assert!(
            ok && out.contains("GOOD report"),
            "alice's fetch from {at}: {out}"
        );
        let fetched = std::fs::read(path("out").join("report")).unwrap();
        assert!(fetched == report, "the bytes alice fetched from {at}");
        // jobs (a PSK identity) is told only what a missing file would tell it, and may
        // not replace alice's file even asking to overwrite.
        let _ = std::fs::remove_file(path("out").join("report"));
        let (ok, out) = ft(at, Some(&jobs), &fetch);
        assert!(
            !ok && out.contains("REJECTED report: no such file"),
            "jobs's fetch from {at}: {out}"
        );
        let (ok, out) = ft(at, Some(&jobs), &forge);
        assert!(
            !ok && out.contains("REJECTED report: file exists"),
            "jobs's overwrite on {at}: {out}"
        );
        // An anonymous client is not let in at all.
        let (ok, out) = ft(at, None, &fetch);
        assert!(
            !ok && out.contains("service needs authentication"),
            "anonymous fetch from {at}: {out}"
        );
    }
    for (node, at) in [("node1", one.addr), ("node2", two.addr)] {
        let stored = std::fs::read(path(node).join("report")).unwrap();
        assert!(stored == report, "the report stored on {at} is alice's");
    }
    println!("{}", two.stop());
    println!("{}", one.stop());
    assert_released(&base);
}
