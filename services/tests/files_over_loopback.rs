//! The `files` service served and used over the loopback transport through the whole
//! runtime, natively: uploads and fetches verified byte for byte, a corrupted chunk, a
//! client that vanishes mid-upload, and the authorization rules. Real-verbs runs of the
//! same service (with the `ft` tool, a killed process, a full disk) are in
//! `tests/verbs/file_transfer.rs` (the VM suite).

use std::collections::BTreeSet;
use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use rdmactor::runtime::{Client, ClientConnection, NodeConfig, Server};
use rdmactor::transport::loopback::{Fabric, Loopback};
use rdmactor_services::file_transfer::{
    fetch_file, hash_bytes, send_file, Auth, BadReason, Config, FetchOptions, FileOffer,
    FileTransfer, HashAlg, Msg, Outcome, Recorder, RejectReason, SendOptions, StoredCopy,
};
use rdmactor_testkit::pattern;

const MIB: usize = 1 << 20;

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 1], port))
}

/// A server of `files` over `fabric` at `at`, storing into `config`'s directory.
fn files_server(fabric: &Fabric, at: SocketAddr, config: Config) -> Server<Loopback> {
    Server::over(Loopback)
        .domain(fabric.device("server"))
        .listen(at, None)
        .service("files", FileTransfer::new(config).expect("files service"))
        .start()
        .expect("server")
}

fn client(fabric: &Fabric, name: &str) -> Client<Loopback> {
    Client::<Loopback>::on(fabric.device(name), NodeConfig::default()).expect("client")
}

/// Every entry of `dir`, temporary files (`.name.…`) included.
fn names(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Waits (up to 20 s) until `dir` holds exactly `want`, then asserts it does.
async fn settled(dir: &Path, want: &BTreeSet<String>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while names(dir) != *want && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(names(dir), *want, "no temporary file left");
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

async fn upload(
    conn: &ClientConnection<Loopback>,
    src: &Path,
    name: &str,
    opts: &SendOptions,
) -> Outcome {
    send_file(conn, src, name, opts, |_| {})
        .await
        .unwrap_or_else(|e| panic!("sending {name}: {e}"))
}

async fn fetch(
    conn: &ClientConnection<Loopback>,
    client: &Client<Loopback>,
    name: &str,
    dir: &Path,
    opts: &FetchOptions,
) -> Outcome {
    fetch_file(conn, client, name, dir, opts, |_| {})
        .await
        .unwrap_or_else(|e| panic!("fetching {name}: {e}"))
}

/// Uploads with the default options and checks the GOOD.
async fn uploaded(conn: &ClientConnection<Loopback>, src: &Path, name: &str) {
    let outcome = upload(conn, src, name, &SendOptions::default()).await;
    assert!(delivered(&outcome), "{name}: {outcome:?}");
}

fn delivered(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Delivered { auth: None })
}

#[test]
fn uploads_from_four_clients_are_stored_and_fetched_back_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let (src, store) = (dir.path().join("src"), dir.path().join("store"));
    fs::create_dir_all(&src).unwrap();
    fs::create_dir_all(&store).unwrap();
    // Empty, one byte, one chunk and a bit, several chunks (the default slot is 1 MiB).
    let sizes = [0, 1, MIB + 3, 3 * MIB + 17];
    for c in 0..4 {
        for (i, len) in sizes.iter().enumerate() {
            fs::write(
                src.join(format!("c{c}-{i}")),
                pattern(*len, (c * 10 + i) as u64),
            )
            .unwrap();
        }
    }
    actix::System::new().block_on(async {
        let fabric = Fabric::default();
        // Four fetches may be prepared (the file hashed) at once: one per client.
        let config = Config::new(&store).with_fetch_preparations(4);
        let server = files_server(&fabric, addr(7300), config);
        let mut tasks = Vec::new();
        for c in 0..4 {
            let (src, out) = (src.clone(), dir.path().join(format!("out{c}")));
            let client = client(&fabric, &format!("client{c}"));
            tasks.push(actix::spawn(async move {
                fs::create_dir_all(&out).unwrap();
                let conn = client.connect(addr(7300), "files").await.unwrap();
                for i in 0..sizes.len() {
                    let name = format!("c{c}-{i}");
                    let opts = SendOptions {
                        alg: [HashAlg::Sha256, HashAlg::Blake3][i % 2],
                        ..SendOptions::default()
                    };
                    let outcome = upload(&conn, &src.join(&name), &name, &opts).await;
                    assert!(delivered(&outcome), "{name}: {outcome:?}");
                }
                // Each connection fetches what it uploaded, through a small window too.
                for (i, len) in sizes.iter().enumerate() {
                    let name = format!("c{c}-{i}");
                    let opts = FetchOptions {
                        slots: 2,
                        slot_len: 64 << 10,
                        ..FetchOptions::default()
                    };
                    let outcome = fetch(&conn, &client, &name, &out, &opts).await;
                    assert!(
                        matches!(&outcome, Outcome::Stored { len: l, .. } if *l == *len as u64),
                        "{name}: {outcome:?}"
                    );
                    let back = fs::read(out.join(&name)).unwrap();
                    assert!(
                        back == pattern(*len, (c * 10 + i) as u64),
                        "{name} came back different"
                    );
                }
                client.shutdown().await;
            }));
        }
        for t in tasks {
            t.await.expect("a client's transfers");
        }
        server.shutdown().await;
    });
    for c in 0..4 {
        for (i, len) in sizes.iter().enumerate() {
            let stored = fs::read(store.join(format!("c{c}-{i}"))).unwrap();
            assert!(
                stored == pattern(*len, (c * 10 + i) as u64),
                "c{c}-{i} stored different"
            );
        }
    }
    assert_eq!(
        names(&store).len(),
        16,
        "no temporary file left: {:?}",
        names(&store)
    );
}

#[test]
fn a_corrupted_chunk_is_bad_and_the_good_file_it_would_replace_stays() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    fs::create_dir_all(&store).unwrap();
    let (good, newer) = (pattern(2 * MIB + 5, 1), pattern(3 * MIB + 100, 2));
    fs::write(dir.path().join("good"), &good).unwrap();
    fs::write(dir.path().join("newer"), &newer).unwrap();
    actix::System::new().block_on(async {
        let fabric = Fabric::default();
        let server = files_server(&fabric, addr(7301), Config::new(&store));
        let client = client(&fabric, "client");
        let conn = client.connect(addr(7301), "files").await.unwrap();
        uploaded(&conn, &dir.path().join("good"), "f").await;
        for (alg, chunk) in [(HashAlg::Sha256, 2), (HashAlg::Blake3, 0)] {
            let opts = SendOptions {
                alg,
                overwrite: true,
                corrupt_chunk: Some(chunk),
                ..SendOptions::default()
            };
            let outcome = upload(&conn, &dir.path().join("newer"), "f", &opts).await;
            assert!(
                matches!(outcome, Outcome::Bad(BadReason::Mismatch { .. })),
                "{alg:?}: {outcome:?}"
            );
            assert_eq!(names(&store), set(&["f"]), "no temporary file");
            assert!(
                fs::read(store.join("f")).unwrap() == good,
                "the good file was replaced"
            );
        }
        // The same connection then replaces it for real.
        let opts = SendOptions {
            overwrite: true,
            ..SendOptions::default()
        };
        let outcome = upload(&conn, &dir.path().join("newer"), "f", &opts).await;
        assert!(delivered(&outcome), "{outcome:?}");
        client.shutdown().await;
        server.shutdown().await;
    });
    assert!(fs::read(store.join("f")).unwrap() == newer);
}

/// A recorder that refuses names starting with `taken` and remembers the rest.
#[derive(Debug, Default)]
struct Catalog(std::sync::Mutex<Vec<StoredCopy>>);

impl Recorder for Catalog {
    fn admit(&self, copy: &StoredCopy) -> Result<(), String> {
        if copy.overwrite {
            return Err("not overwritten in place".into());
        }
        Ok(())
    }

    fn record(&self, copy: &StoredCopy) -> Result<(), String> {
        if copy.name.starts_with("taken") {
            return Err("the name is taken by other bytes".into());
        }
        self.0.lock().unwrap().push(copy.clone());
        Ok(())
    }
}

#[test]
fn a_stored_upload_is_recorded_before_its_good_and_one_the_recorder_refuses_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    fs::create_dir_all(&store).unwrap();
    let (bytes, other) = (pattern(MIB + 7, 3), pattern(5, 4));
    fs::write(dir.path().join("src"), &bytes).unwrap();
    fs::write(dir.path().join("other"), &other).unwrap();
    let catalog = std::sync::Arc::new(Catalog::default());
    actix::System::new().block_on(async {
        let fabric = Fabric::default();
        let config = Config::new(&store).with_recorder(catalog.clone());
        let server = files_server(&fabric, addr(7305), config);
        let client = client(&fabric, "client");
        let conn = client.connect(addr(7305), "files").await.unwrap();
        uploaded(&conn, &dir.path().join("src"), "f").await;
        // Recorded by the time GOOD arrived, with the digest the upload was checked
        // against.
        let recorded = catalog.0.lock().unwrap().clone();
        assert_eq!(recorded.len(), 1, "{recorded:?}");
        assert_eq!(recorded[0].name, "f");
        assert_eq!(recorded[0].len, bytes.len() as u64);
        assert_eq!(recorded[0].digest, hash_bytes(HashAlg::Sha256, &bytes));
        assert_eq!(recorded[0].owner, None);
        // Refused: BAD with the recorder's reason, and nothing left under the name.
        let outcome = upload(&conn, &dir.path().join("src"), "taken-1", &SendOptions::default()).await;
        assert!(
            matches!(&outcome, Outcome::Bad(BadReason::NotStored { reason }) if reason.contains("the name is taken by other bytes")),
            "{outcome:?}"
        );
        assert_eq!(names(&store), set(&["f"]), "the refused copy is gone");
        // A mismatch is never recorded; the connection goes on serving.
        let opts = SendOptions {
            corrupt_chunk: Some(0),
            ..SendOptions::default()
        };
        let outcome = upload(&conn, &dir.path().join("other"), "g", &opts).await;
        assert!(matches!(outcome, Outcome::Bad(BadReason::Mismatch { .. })), "{outcome:?}");
        uploaded(&conn, &dir.path().join("other"), "h").await;
        // Refused before the rename: the file it would replace keeps its bytes.
        let opts = SendOptions {
            overwrite: true,
            ..SendOptions::default()
        };
        let outcome = upload(&conn, &dir.path().join("other"), "f", &opts).await;
        assert!(
            matches!(&outcome, Outcome::Bad(BadReason::NotStored { reason }) if reason.contains("not overwritten in place")),
            "{outcome:?}"
        );
        assert!(fs::read(store.join("f")).unwrap() == bytes, "f was replaced");
        // The refused upload's temporary file goes to the service's reaper, which may
        // remove it just after the verdict left.
        settled(&store, &set(&["f", "h"])).await;
        let names_recorded: Vec<String> =
            catalog.0.lock().unwrap().iter().map(|c| c.name.clone()).collect();
        assert_eq!(names_recorded, ["f", "h"]);
        client.shutdown().await;
        server.shutdown().await;
    });
    assert!(fs::read(store.join("f")).unwrap() == bytes);
}

#[test]
fn a_client_that_vanishes_mid_upload_leaves_the_stored_file_and_the_server_serving() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    fs::create_dir_all(&store).unwrap();
    let (good, big) = (pattern(100_000, 3), pattern(48 * MIB, 4));
    fs::write(dir.path().join("good"), &good).unwrap();
    fs::write(dir.path().join("big"), &big).unwrap();
    actix::System::new().block_on(async {
        let fabric = Fabric::default();
        let mut node = NodeConfig::default();
        node.connection.keepalive = Some(Duration::from_millis(100));
        node.connection.ack_timeout = 12;
        node.connection.retry_count = 2;
        let bound = node.connection.dead_peer_bound().unwrap();
        // Small slots: many chunks, so the host surely vanishes mid-transfer; anyone may
        // overwrite, so the doomed client's upload would replace the stored file.
        let server = Server::over(Loopback)
            .domain(fabric.device("server"))
            .config(node.clone())
            .listen(addr(7302), None)
            .service(
                "files",
                FileTransfer::new(
                    Config::new(&store)
                        .with_window(2, 64 << 10)
                        .with_overwrite_others(true),
                )
                .unwrap(),
            )
            .start()
            .unwrap();
        let first = client(&fabric, "first");
        let conn = first.connect(addr(7302), "files").await.unwrap();
        uploaded(&conn, &dir.path().join("good"), "f").await;

        let device = fabric.device("doomed");
        let doomed = Client::<Loopback>::on(device.clone(), node.clone()).unwrap();
        let doomed_conn = doomed.connect(addr(7302), "files").await.unwrap();
        let big_path = dir.path().join("big");
        let transfer = actix::spawn(async move {
            let opts = SendOptions {
                overwrite: true,
                ..SendOptions::default()
            };
            send_file(&doomed_conn, &big_path, "f", &opts, |_| {}).await
        });
        // Progress, seen on the server's side: the temporary file grows.
        let started = Instant::now();
        loop {
            let partial = fs::read_dir(&store).unwrap().any(|e| {
                let e = e.unwrap();
                e.file_name().to_string_lossy().starts_with(".f.")
                    && e.metadata().unwrap().len() >= (MIB as u64)
            });
            if partial {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "no partial upload: {:?}",
                names(&store)
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        device.vanish();
        let cut = Instant::now();
        while server.stats().await.connections != 1 {
            assert!(
                cut.elapsed() < bound * 4,
                "the vanished client's connection still open after {:?}",
                cut.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The temporary file goes on the service's reaper thread, soon after.
        while names(&store) != set(&["f"]) {
            assert!(
                cut.elapsed() < Duration::from_secs(10),
                "{:?}",
                names(&store)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            fs::read(store.join("f")).unwrap() == good,
            "the half upload replaced the file"
        );
        transfer.abort();
        // Everyone else keeps being served.
        uploaded(&conn, &dir.path().join("good"), "g").await;
        first.shutdown().await;
        server.shutdown().await;
        drop(doomed);
    });
    assert_eq!(names(&store), set(&["f", "g"]));
}

#[test]
fn a_connection_fetches_and_replaces_only_its_own_files_and_bad_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (store, out) = (dir.path().join("store"), dir.path().join("out"));
    fs::create_dir_all(&store).unwrap();
    fs::create_dir_all(&out).unwrap();
    let (mine, theirs) = (pattern(70_000, 5), pattern(5000, 6));
    fs::write(dir.path().join("mine"), &mine).unwrap();
    fs::write(dir.path().join("theirs"), &theirs).unwrap();
    actix::System::new().block_on(async {
        let fabric = Fabric::default();
        // The default rules: fetch and overwrite only what this connection uploaded.
        let config = Config::new(&store).with_secret("alice", "a-key");
        let server = files_server(&fabric, addr(7303), config);
        let (a, b) = (client(&fabric, "a"), client(&fabric, "b"));
        let conn_a = a.connect(addr(7303), "files").await.unwrap();
        let conn_b = b.connect(addr(7303), "files").await.unwrap();
        uploaded(&conn_a, &dir.path().join("mine"), "a").await;
        // B may neither read nor replace A's file, and is not told it exists.
        let outcome = fetch(&conn_b, &b, "a", &out, &FetchOptions::default()).await;
        assert_eq!(outcome, Outcome::Rejected(RejectReason::NotFound));
        let opts = SendOptions {
            overwrite: true,
            ..SendOptions::default()
        };
        let outcome = upload(&conn_b, &dir.path().join("theirs"), "a", &opts).await;
        assert_eq!(outcome, Outcome::Rejected(RejectReason::Exists));
        assert!(fs::read(store.join("a")).unwrap() == mine);
        // A may.
        let outcome = fetch(&conn_a, &a, "a", &out, &FetchOptions::default()).await;
        assert!(matches!(outcome, Outcome::Stored { .. }), "{outcome:?}");
        assert!(fs::read(out.join("a")).unwrap() == mine);
        // A name that leaves the directory, offered by hand (the client library refuses
        // to send one): refused with the reason, and the connection goes on.
        for name in ["../x", "sub/x", ".hidden", ""] {
            let offer = FileOffer {
                name: name.into(),
                len: 4,
                digest: hash_bytes(HashAlg::Sha256, b"evil"),
                overwrite: true,
            };
            conn_b.send(Msg::Offer(offer).encode()).await.unwrap();
            let answer = conn_b.recv().await.expect("an answer");
            let answer = Msg::decode(&answer.data).unwrap();
            assert!(
                matches!(
                    answer,
                    Msg::Reject {
                        reason: RejectReason::BadName { .. }
                    }
                ),
                "{name:?}: {answer:?}"
            );
        }
        // An identity is proven only by a GOOD upload of a new file named after it.
        let opts = SendOptions {
            identity: Some("alice".into()),
            ..SendOptions::default()
        };
        let outcome = upload(&conn_b, &dir.path().join("theirs"), "alice", &opts).await;
        let Outcome::Delivered {
            auth: Some(Auth::Secret(key)),
        } = outcome
        else {
            panic!("{outcome:?}")
        };
        assert_eq!(key.expose(), "a-key");
        let outcome = upload(&conn_a, &dir.path().join("mine"), "a2", &opts).await;
        assert_eq!(
            outcome,
            Outcome::Delivered {
                auth: Some(Auth::Refused)
            }
        );
        // Identify outside a GOOD transfer is a protocol error: the server hangs up on
        // that connection only.
        let rogue = b.connect(addr(7303), "files").await.unwrap();
        rogue
            .send(Msg::Identify { id: "alice".into() }.encode())
            .await
            .unwrap();
        assert_eq!(rogue.recv().await, None, "no secret, connection closed");
        let outcome = fetch(&conn_b, &b, "alice", &out, &FetchOptions::default()).await;
        assert!(matches!(outcome, Outcome::Stored { .. }), "{outcome:?}");
        a.shutdown().await;
        b.shutdown().await;
        server.shutdown().await;
    });
    assert_eq!(names(&store), set(&["a", "a2", "alice"]));
    assert!(!dir.path().join("x").exists());
}

/// A `files` server at `at` whose clients must prove a key of `keys` (as
/// `server --authorized-keys FILE` on every node of a cluster sharing one file).
fn keyed_files_server(
    fabric: &Fabric,
    device: &str,
    at: SocketAddr,
    config: Config,
    keys: &rdmactor::runtime::KeySet,
) -> Server<Loopback> {
    Server::over(Loopback)
        .domain(fabric.device(device))
        .listen(at, None)
        .service("files", FileTransfer::new(config).expect("files service"))
        .authorized_keys(rdmactor::runtime::Keys::from_set(keys.clone()))
        .start()
        .expect("server")
}

#[test]
fn an_identity_owns_its_files_on_every_connection_and_every_server() {
    use rdmactor::runtime::{Credential, KeySet};
    let dir = tempfile::tempdir().unwrap();
    let (one, two, out) = (
        dir.path().join("node1"),
        dir.path().join("node2"),
        dir.path().join("out"),
    );
    for d in [&one, &two, &out] {
        fs::create_dir_all(d).unwrap();
    }
    let (report, forged) = (pattern(300_000, 7), pattern(1000, 8));
    fs::write(dir.path().join("report"), &report).unwrap();
    fs::write(dir.path().join("forged"), &forged).unwrap();
    let alice = Credential::generate_ed25519("alice").unwrap();
    let bob = Credential::generate_psk("bob").unwrap();
    let keys = KeySet::parse(&format!(
        "{}\n{}",
        alice.authorized_line(),
        bob.authorized_line()
    ))
    .unwrap();
    actix::System::new().block_on(async {
        let fabric = Fabric::default();
        // Two servers sharing one key file, neither with public fetch, each with a
        // secret for both IDs.
        let config = |d: &Path| {
            Config::new(d)
                .with_secret("alice", "a-key")
                .with_secret("bob", "b-key")
        };
        let node1 = keyed_files_server(&fabric, "n1", addr(7311), config(&one), &keys);
        let node2 = keyed_files_server(&fabric, "n2", addr(7312), config(&two), &keys);
        let a = client(&fabric, "a").with_identity(alice.clone());
        let b = client(&fabric, "b").with_identity(bob.clone());
        // Alice stores "report" on both nodes (as a cluster client puts each replica),
        // each on a connection she closes at once.
        for at in [addr(7311), addr(7312)] {
            let conn = a.connect(at, "files").await.unwrap();
            uploaded(&conn, &dir.path().join("report"), "report").await;
            conn.close().await;
        }
        // New connections, both nodes: alice fetches her file, bob is refused, and is
        // told only what a missing file would tell him.
        for (at, node) in [(addr(7311), &one), (addr(7312), &two)] {
            let conn = a.connect(at, "files").await.unwrap();
            let got = out.join("report");
            let _ = fs::remove_file(&got);
            let outcome = fetch(&conn, &a, "report", &out, &FetchOptions::default()).await;
            assert!(matches!(outcome, Outcome::Stored { .. }), "{outcome:?}");
            assert!(fs::read(&got).unwrap() == report);
            conn.close().await;
            let conn = b.connect(at, "files").await.unwrap();
            let outcome = fetch(&conn, &b, "report", &out, &FetchOptions::default()).await;
            assert_eq!(outcome, Outcome::Rejected(RejectReason::NotFound));
            // Nor may bob replace it, even asking to overwrite.
            let opts = SendOptions {
                overwrite: true,
                ..SendOptions::default()
            };
            let outcome = upload(&conn, &dir.path().join("forged"), "report", &opts).await;
            assert_eq!(outcome, Outcome::Rejected(RejectReason::Exists));
            assert!(fs::read(node.join("report")).unwrap() == report);
            assert_eq!(
                rdmactor_services::file_transfer::ownership::owner_at(&node.join("report"))
                    .unwrap()
                    .as_deref(),
                Some("alice")
            );
            conn.close().await;
        }
        // Alice replaces her own file from yet another connection.
        let conn = a.connect(addr(7312), "files").await.unwrap();
        let opts = SendOptions {
            overwrite: true,
            ..SendOptions::default()
        };
        let outcome = upload(&conn, &dir.path().join("forged"), "report", &opts).await;
        assert!(delivered(&outcome), "{outcome:?}");
        assert!(fs::read(two.join("report")).unwrap() == forged);
        // The Identify secret follows the identity, not the file's name: bob stores a
        // file named "alice" and asks for alice's secret, and is refused; he gets his.
        let conn_b = b.connect(addr(7311), "files").await.unwrap();
        let as_alice = SendOptions {
            identity: Some("alice".into()),
            ..SendOptions::default()
        };
        let outcome = upload(&conn_b, &dir.path().join("forged"), "alice", &as_alice).await;
        assert_eq!(
            outcome,
            Outcome::Delivered {
                auth: Some(Auth::Refused)
            }
        );
        let as_bob = SendOptions {
            identity: Some("bob".into()),
            ..SendOptions::default()
        };
        let outcome = upload(&conn_b, &dir.path().join("forged"), "b1", &as_bob).await;
        let Outcome::Delivered {
            auth: Some(Auth::Secret(key)),
        } = outcome
        else {
            panic!("{outcome:?}")
        };
        assert_eq!(key.expose(), "b-key");
        for c in [a, b] {
            c.shutdown().await;
        }
        node1.shutdown().await;
        node2.shutdown().await;
    });
    assert_eq!(names(&one), set(&["report", "alice", "b1"]));
    assert_eq!(names(&two), set(&["report"]));
}

/// Issues 46/47 through the whole runtime: a replicator (a cluster's server) reads
/// another identity's file and stores a copy for its owner; nobody else may offer a
/// copy for another; only the owner deletes, from any connection.
#[test]
fn a_replicator_copies_for_the_owner_and_only_the_owner_deletes() {
    use rdmactor::runtime::{Credential, KeySet};
    use rdmactor_services::file_transfer::{delete_file, ownership::owner_at};
    let dir = tempfile::tempdir().unwrap();
    let (store, out) = (dir.path().join("store"), dir.path().join("out"));
    for d in [&store, &out] {
        fs::create_dir_all(d).unwrap();
    }
    let report = pattern(200_000, 3);
    fs::write(dir.path().join("report"), &report).unwrap();
    let alice = Credential::generate_ed25519("alice").unwrap();
    let bob = Credential::generate_ed25519("bob").unwrap();
    let node = Credential::generate_ed25519("node-b").unwrap();
    let lines = [&alice, &bob, &node]
        .map(|c| c.authorized_line())
        .join("\n");
    let keys = KeySet::parse(&lines).unwrap();
    actix::System::new().block_on(async {
        let fabric = Fabric::default();
        let config = Config::new(&store).with_replicator("node-b");
        let _server = keyed_files_server(&fabric, "n1", addr(7321), config, &keys);
        let a = client(&fabric, "a").with_identity(alice.clone());
        let b = client(&fabric, "b").with_identity(bob.clone());
        let n = client(&fabric, "n").with_identity(node.clone());
        let at = addr(7321);
        let conn = a.connect(at, "files").await.unwrap();
        uploaded(&conn, &dir.path().join("report"), "report").await;
        conn.close().await;

        // The replicator fetches alice's file, keeping her as its owner.
        let conn = n.connect(at, "files").await.unwrap();
        let keep_owner = FetchOptions {
            copy_for: Some("alice".into()),
            ..FetchOptions::default()
        };
        let outcome = fetch(&conn, &n, "report", &out, &keep_owner).await;
        assert!(matches!(outcome, Outcome::Stored { .. }), "{outcome:?}");
        assert_eq!(
            owner_at(&out.join("report")).unwrap().as_deref(),
            Some("alice")
        );
        // It stores a copy for alice; bob may not.
        let for_alice = SendOptions {
            copy_for: Some("alice".into()),
            ..SendOptions::default()
        };
        let outcome = upload(&conn, &out.join("report"), "copy", &for_alice).await;
        assert!(delivered(&outcome), "{outcome:?}");
        assert_eq!(
            owner_at(&store.join("copy")).unwrap().as_deref(),
            Some("alice")
        );
        conn.close().await;
        let conn = b.connect(at, "files").await.unwrap();
        let outcome = upload(&conn, &out.join("report"), "bobs", &for_alice).await;
        assert!(
            matches!(outcome, Outcome::Rejected(RejectReason::Forbidden { .. })),
            "{outcome:?}"
        );
        assert!(!store.join("bobs").exists());
        // bob cannot delete alice's files; the replicator cannot either.
        for name in ["report", "copy"] {
            let outcome = delete_file(&conn, name).await.unwrap();
            assert_eq!(outcome, Outcome::Rejected(RejectReason::NotFound));
        }
        conn.close().await;
        let conn = n.connect(at, "files").await.unwrap();
        let outcome = delete_file(&conn, "copy").await.unwrap();
        assert_eq!(outcome, Outcome::Rejected(RejectReason::NotFound));
        conn.close().await;
        assert_eq!(names(&store), set(&["copy", "report"]));
        // alice deletes both, on a connection of her own.
        let conn = a.connect(at, "files").await.unwrap();
        for name in ["report", "copy"] {
            assert_eq!(delete_file(&conn, name).await.unwrap(), Outcome::Deleted);
        }
        assert_eq!(
            delete_file(&conn, "report").await.unwrap(),
            Outcome::Rejected(RejectReason::NotFound)
        );
        conn.close().await;
        assert!(names(&store).is_empty());
    });
}
