//! The `files` service end to end over real verbs: many concurrent uploads verified
//! against independently computed SHA-256, large files through a small window, a
//! corrupted chunk, a client killed mid-transfer, rkeys that die with their window,
//! downloads, `Identify`, and a full disk refused with the reason.
//!
//! Files live under `target/file-transfer-tests/` (the repository is on the host's
//! disk; the VM's /tmp is a tmpfs in its 4 GiB of memory). `RDMACTOR_FT_BIG_MIB`
//! shrinks the large-file test (default 256 MiB per client) for quick runs.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdmactor::runtime::{
    Client, ClientConnection, CloseReason, NodeConfig, RequestError, Server, TransportConfig,
};
use rdmactor::verbs::RemoteRegion;
use rdmactor_services::file_transfer::{
    fetch_file, hash_bytes, send_file, Auth, BadReason, Config, FetchOptions, FileOffer,
    FileTransfer, HashAlg, Msg, Outcome, Progress, RejectReason, SendOptions, WindowGrant,
};
use rdmactor_tests::{
    actix_run, assert_released, close_all, eventually, rdma_context, resource_counts, target_bin,
    test_addr, wait_idle,
};
use sha2::{Digest as _, Sha256};

const MIB: u64 = 1 << 20;

/// A directory under `target/file-transfer-tests/`, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let exe = std::env::current_exe().expect("test binary path");
        // target/<profile>/deps/<binary>
        let target = exe.ancestors().nth(3).expect("target directory");
        let dir = target
            .join("file-transfer-tests")
            .join(format!("{test}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create scratch directory");
        Scratch(dir)
    }

    /// A subdirectory, created.
    fn sub(&self, name: &str) -> PathBuf {
        let p = self.0.join(name);
        fs::create_dir_all(&p).expect("create subdirectory");
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Pseudo-random bytes for block `index` of the file with `seed` (xorshift, 8 bytes a
/// step: generating a GiB must not dominate the run under emulation).
fn random_block(seed: u64, index: u64, buf: &mut [u8]) {
    let mut x =
        (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ index.wrapping_mul(0xd1b5_4a32_d192_ed03)) | 1;
    for out in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.copy_from_slice(&x.to_le_bytes()[..out.len()]);
    }
}

/// Writes `len` random bytes (by `seed`) to `path`; returns their SHA-256.
fn write_random_file(path: &Path, len: u64, seed: u64) -> [u8; 32] {
    let mut f = File::create(path).expect("create source file");
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; MIB as usize];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(MIB) as usize;
        random_block(seed, at / MIB, &mut buf[..n]);
        hasher.update(&buf[..n]);
        f.write_all(&buf[..n]).expect("write source file");
        at += n as u64;
    }
    hasher.finalize().into()
}

/// Asserts the file at `path` holds exactly what `write_random_file(_, len, seed)`
/// wrote, comparing bytes (cheaper than hashing a GiB under emulation).
fn assert_random_file(path: &Path, len: u64, seed: u64) {
    let mut f = File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    assert_eq!(f.metadata().unwrap().len(), len, "{}", path.display());
    let mut want = vec![0u8; MIB as usize];
    let mut got = vec![0u8; MIB as usize];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(MIB) as usize;
        random_block(seed, at / MIB, &mut want[..n]);
        f.read_exact(&mut got[..n]).expect("read stored file");
        assert!(
            got[..n] == want[..n],
            "{} differs in MiB {}",
            path.display(),
            at / MIB
        );
        at += n as u64;
    }
}

/// SHA-256 of a file, computed here (not by the service).
fn sha256_file(path: &Path) -> [u8; 32] {
    let mut f = File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; MIB as usize];
    loop {
        let n = f.read(&mut buf).expect("read");
        if n == 0 {
            return hasher.finalize().into();
        }
        hasher.update(&buf[..n]);
    }
}

/// `f` over `items` on two threads (the VM has two vCPUs; hashing dominates there).
fn on_two_threads<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let (left, right) = items.split_at(items.len() / 2);
    std::thread::scope(|s| {
        let other = s.spawn(|| left.iter().map(&f).collect::<Vec<_>>());
        let mut rest: Vec<R> = right.iter().map(&f).collect();
        let mut all = other.join().expect("worker thread");
        all.append(&mut rest);
        all
    })
}

/// Every name in `dir`, hidden ones (temporary files) included.
fn names(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

/// A server with the `files` service. Two pollers: a session hashes and writes each
/// chunk on its poller thread, and the VM has two vCPUs to share that work.
fn files_server(config: Config) -> Server {
    files_server_with(FileTransfer::new(config).expect("files service"))
}

/// [`files_server`] with a service made by the caller (who keeps a clone to ask its
/// quota owner).
fn files_server_with(files: FileTransfer) -> Server {
    Server::builder()
        .config(NodeConfig {
            transport: TransportConfig {
                pollers: 2,
                ..TransportConfig::default()
            },
            ..NodeConfig::default()
        })
        .listen(test_addr(), None)
        .service("files", files)
        .start()
        .expect("server")
}

/// Sends `path` as `name` and returns the outcome and the window the server granted.
async fn send(
    conn: &ClientConnection,
    path: &Path,
    name: &str,
    opts: &SendOptions,
) -> (Outcome, Option<WindowGrant>) {
    let mut grant = None;
    let outcome = send_file(conn, path, name, opts, |p| {
        if let Progress::Window(g) = p {
            grant = Some(*g);
        }
    })
    .await
    .unwrap_or_else(|e| panic!("sending {name}: {e}"));
    (outcome, grant)
}

fn delivered(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Delivered { auth: None })
}

fn region(grant: &WindowGrant) -> RemoteRegion {
    RemoteRegion {
        addr: grant.region.addr,
        len: grant.region.len,
        rkey: grant.region.rkey,
    }
}

#[test]
fn fifty_clients_upload_two_files_each_and_every_file_matches() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    const CLIENTS: usize = 50;
    let scratch = Scratch::new("fifty");
    let (src, store) = (scratch.sub("src"), scratch.sub("store"));
    let specs: Vec<(String, u64, u64)> = (0..CLIENTS as u64)
        .flat_map(|c| {
            [("small", 1024), ("big", 4 * MIB)]
                .map(|(kind, len)| (format!("{kind}-{c}"), len, c * 2 + len))
        })
        .collect();
    // (name, SHA-256 of the source)
    let files: Vec<(String, [u8; 32])> = on_two_threads(&specs, |(name, len, seed)| {
        (
            name.clone(),
            write_random_file(&src.join(name), *len, *seed),
        )
    });
    actix_run(async {
        let server = files_server(Config::new(&store));
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");
        let mut conns = Vec::new();
        for _ in 0..CLIENTS {
            conns.push(client.connect(addr, "files").await.expect("connect"));
        }
        let started = Instant::now();
        let tasks = conns.iter().enumerate().map(|(c, conn)| {
            let src = &src;
            async move {
                // Both algorithms on every connection, in alternating order.
                let algs = if c % 2 == 0 {
                    [HashAlg::Sha256, HashAlg::Blake3]
                } else {
                    [HashAlg::Blake3, HashAlg::Sha256]
                };
                for (kind, alg) in ["small", "big"].into_iter().zip(algs) {
                    let name = format!("{kind}-{c}");
                    let opts = SendOptions {
                        alg,
                        ..SendOptions::default()
                    };
                    let (outcome, _) = send(conn, &src.join(&name), &name, &opts).await;
                    assert!(delivered(&outcome), "{name}: {outcome:?}");
                }
            }
        });
        futures::future::join_all(tasks).await;
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "{CLIENTS} clients, {} files, {:.1} MiB in {secs:.2} s",
            files.len(),
            (CLIENTS as u64 * (4 * MIB + 1024)) as f64 / MIB as f64
        );
        close_all(&server, client, conns).await;
        server.shutdown().await;
    });
    let want: BTreeSet<String> = files.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(
        names(&store),
        want,
        "exactly the sent files, no temporary ones"
    );
    let stored = on_two_threads(&files, |(name, _)| sha256_file(&store.join(name)));
    for ((name, sha), got) in files.iter().zip(stored) {
        assert_eq!(&got, sha, "{name} differs");
    }
    assert_released(&base);
}

#[test]
fn four_clients_send_large_files_through_a_small_window() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    let mib: u64 = std::env::var("RDMACTOR_FT_BIG_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let len = mib * MIB + 12_345; // a short last chunk too
    let scratch = Scratch::new("large");
    let (src, store) = (scratch.sub("src"), scratch.sub("store"));
    on_two_threads(&[0u64, 1, 2, 3], |c| {
        write_random_file(&src.join(format!("large-{c}")), len, 1000 + c)
    });
    // 4 slots of a 64th of the file, at most 1 MiB:
    // a window of 4 MiB for 256 MiB files, always a 16th of the file or less.
    let slot_len = (len / 64).min(MIB) as u32;
    let windows = actix_run(async {
        let server = files_server(Config::new(&store).with_window(4, slot_len));
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");
        let mut conns = Vec::new();
        for _ in 0..4 {
            conns.push(client.connect(addr, "files").await.expect("connect"));
        }
        let tasks = conns.iter().enumerate().map(|(c, conn)| {
            let src = &src;
            async move {
                let name = format!("large-{c}");
                let opts = SendOptions {
                    alg: [HashAlg::Sha256, HashAlg::Blake3][c % 2],
                    ..SendOptions::default()
                };
                let mut grant = None;
                let mut offered = None;
                let outcome = send_file(conn, &src.join(&name), &name, &opts, |p| match p {
                    Progress::Offer(_) => offered = Some(Instant::now()),
                    Progress::Window(g) => grant = Some(*g),
                    _ => {}
                })
                .await
                .unwrap_or_else(|e| panic!("sending {name}: {e}"));
                assert!(delivered(&outcome), "{name}: {outcome:?}");
                (
                    grant.expect("a window was granted"),
                    offered.expect("offered"),
                )
            }
        });
        let sent = futures::future::join_all(tasks).await;
        // From the first offer (the files were hashed before) to the last verdict.
        let first = sent.iter().map(|(_, t)| *t).min().expect("4 transfers");
        let secs = first.elapsed().as_secs_f64();
        eprintln!(
            "4 x {mib} MiB through {} B windows in {secs:.2} s: {:.1} MB/s in all",
            sent[0].0.region.len,
            (4 * len) as f64 / 1e6 / secs
        );
        let windows: Vec<WindowGrant> = sent.into_iter().map(|(g, _)| g).collect();
        close_all(&server, client, conns).await;
        server.shutdown().await;
        windows
    });
    for w in &windows {
        assert!(
            w.region.len * 16 <= len,
            "the window ({} B) is much smaller than the file",
            w.region.len
        );
        assert!(w.slots > 1, "several chunks in flight");
    }
    assert_eq!(
        names(&store),
        (0..4)
            .map(|c| format!("large-{c}"))
            .collect::<BTreeSet<_>>()
    );
    on_two_threads(&[0u64, 1, 2, 3], |c| {
        assert_random_file(&store.join(format!("large-{c}")), len, 1000 + c)
    });
    assert_released(&base);
}

#[test]
fn a_corrupted_chunk_is_bad_and_leaves_no_file() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    let scratch = Scratch::new("corrupt");
    let (src, store) = (scratch.sub("src"), scratch.sub("store"));
    let len = 3 * MIB + 100; // 4 chunks of 1 MiB (the last short)
    let sha = write_random_file(&src.join("f"), len, 7);
    actix_run(async {
        let server = files_server(Config::new(&store));
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");
        let conn = client.connect(addr, "files").await.expect("connect");
        for (alg, chunk) in [(HashAlg::Sha256, 2), (HashAlg::Blake3, 3)] {
            let opts = SendOptions {
                alg,
                corrupt_chunk: Some(chunk),
                ..SendOptions::default()
            };
            let (outcome, _) = send(&conn, &src.join("f"), "f", &opts).await;
            assert!(
                matches!(outcome, Outcome::Bad(BadReason::Mismatch { .. })),
                "{outcome:?}"
            );
            assert_eq!(names(&store), set(&[]), "no file, no temporary file");
        }
        // The connection is still good for a correct transfer.
        let (outcome, _) = send(&conn, &src.join("f"), "f", &SendOptions::default()).await;
        assert!(delivered(&outcome), "{outcome:?}");
        close_all(&server, client, vec![conn]).await;
        server.shutdown().await;
    });
    assert_eq!(names(&store), set(&["f"]));
    assert_eq!(sha256_file(&store.join("f")), sha);
    assert_released(&base);
}

#[test]
fn a_killed_sender_leaves_no_file_and_the_server_keeps_serving() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    let scratch = Scratch::new("killed");
    let (src, store) = (scratch.sub("src"), scratch.sub("store"));
    let len = 64 * MIB;
    write_random_file(&src.join("big"), len, 11);
    write_random_file(&src.join("after"), 100_000, 12);
    actix_run(async {
        // Small slots: many chunks, so the kill surely lands mid-transfer.
        let server = files_server(Config::new(&store).with_window(2, 64 << 10));
        let addr = server.local_addrs()[0];
        let mut child = Command::new(target_bin("ft"))
            .args(["--addr", &addr.to_string(), "send", "--hash", "blake3"])
            .arg(src.join("big"))
            .stdout(Stdio::null())
            .spawn()
            .expect("start ft (cargo build --release -p rdmactor-examples)");
        // Progress, seen on the server's side: the temporary file grows.
        eventually("a partial upload", Duration::from_secs(60), || async {
            fs::read_dir(&store).unwrap().any(|e| {
                let e = e.unwrap();
                e.file_name().to_string_lossy().starts_with(".big.")
                    && e.metadata().unwrap().len() >= 2 * MIB
            })
        })
        .await;
        child.kill().expect("SIGKILL");
        let status = child.wait().unwrap();
        assert!(!status.success(), "ft was killed: {status:?}");
        wait_idle(
            &server,
            "the killed client's connection to be torn down",
            Duration::from_secs(30),
        )
        .await;
        // The temporary file is removed by the service's reaper thread, off the
        // poller: soon after the connection goes, not necessarily before.
        eventually(
            "the temporary file to be removed",
            Duration::from_secs(10),
            || async { names(&store).is_empty() },
        )
        .await;
        assert_eq!(names(&store), set(&[]), "no file, no temporary file");

        let client = Client::start(NodeConfig::default()).expect("client");
        let conn = client.connect(addr, "files").await.expect("connect");
        let (outcome, _) = send(&conn, &src.join("after"), "after", &SendOptions::default()).await;
        assert!(delivered(&outcome), "{outcome:?}");
        close_all(&server, client, vec![conn]).await;
        server.shutdown().await;
    });
    assert_eq!(names(&store), set(&["after"]));
    assert_random_file(&store.join("after"), 100_000, 12);
    assert_released(&base);
}

/// A tmpfs of `size` mounted on `dir` for the life of the guard (the VM runs tests as
/// root), so that a test meets a disk that is really full.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mount a {size} tmpfs on {}",
            dir.display()
        );
        Tmpfs(dir.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Runs `ft ARGS` to its end without blocking the actors (the server runs in this
/// process); returns its exit status and what it printed (stdout and stderr).
async fn run_ft(args: &[&str], out: &Path) -> (std::process::ExitStatus, String) {
    let log = File::create(out).expect("ft output file");
    let mut child = Command::new(target_bin("ft"))
        .args(args)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start ft (cargo build --release -p rdmactor-examples)");
    let mut status = None;
    eventually("ft to exit", Duration::from_secs(120), || {
        status = status.or_else(|| child.try_wait().expect("wait for ft"));
        let done = status.is_some();
        async move { done }
    })
    .await;
    (status.unwrap(), fs::read_to_string(out).unwrap())
}

#[test]
fn a_full_disk_is_refused_with_the_reason_before_any_data_moves() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    let scratch = Scratch::new("disk-full");
    let (src, store) = (scratch.sub("src"), scratch.sub("store"));
    let _tmpfs = Tmpfs::mount(&store, "20m");
    write_random_file(&src.join("big"), 64 * MIB, 31);
    write_random_file(&src.join("fits"), 12 * MIB, 32);
    write_random_file(&src.join("second"), 12 * MIB, 33);
    actix_run(async {
        let server = files_server(Config::new(&store));
        let addr = server.local_addrs()[0].to_string();
        let big = src.join("big");
        let (status, out) = run_ft(
            &["--addr", &addr, "send", big.to_str().unwrap()],
            &scratch.0.join("ft-big.out"),
        )
        .await;
        println!("ft send of 64 MiB into a 20 MiB tmpfs:\n{out}");
        assert!(!status.success(), "{status:?}");
        assert!(
            out.contains(
                "REJECTED big: no space left on the receiver's disk: the file needs 67108864 bytes"
            ),
            "the client names the lack of space: {out}"
        );
        assert!(!out.contains("WrFlush"), "{out}");
        assert_eq!(names(&store), set(&[]), "no file, no temporary file");

        // 12 MiB fits and is reserved when its offer arrives; a second 12 MiB offer
        // then finds 8 MiB free and is refused, although nothing has been written yet.
        let client = Client::start(NodeConfig::default()).expect("client");
        let conn = client
            .connect(server.local_addrs()[0], "files")
            .await
            .expect("connect");
        let other = client
            .connect(server.local_addrs()[0], "files")
            .await
            .expect("connect");
        let (outcome, _) = send(&conn, &src.join("fits"), "fits", &SendOptions::default()).await;
        assert!(delivered(&outcome), "{outcome:?}");
        let (outcome, _) = send(
            &other,
            &src.join("second"),
            "second",
            &SendOptions::default(),
        )
        .await;
        match &outcome {
            Outcome::Rejected(RejectReason::NoSpace { needed, available }) => {
                assert_eq!(*needed, 12 * MIB);
                assert!(*available < 12 * MIB, "{available}");
            }
            other => panic!("expected NoSpace, got {other:?}"),
        }
        // Both connections still serve: a small file goes through the refused one.
        let small = src.join("small");
        fs::write(&small, b"still served").unwrap();
        let (outcome, _) = send(&other, &small, "small", &SendOptions::default()).await;
        assert!(delivered(&outcome), "{outcome:?}");
        close_all(&server, client, vec![conn, other]).await;
        server.shutdown().await;
    });
    assert_eq!(names(&store), set(&["fits", "small"]));
    assert_random_file(&store.join("fits"), 12 * MIB, 32);
    assert_released(&base);
}

#[test]
fn a_window_beyond_the_pools_cap_is_refused_with_the_reason_and_the_connection_stays() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    let scratch = Scratch::new("window-cap");
    let (src, store) = (scratch.sub("src"), scratch.sub("store"));
    write_random_file(&src.join("big"), 16 * MIB, 41);
    write_random_file(&src.join("small"), 200 << 10, 42);
    actix_run(async {
        // Room for 4 MiB outside the receive buffers: an upload's window of 8 slots of
        // 1 MiB does not fit, a small file's one slot of its own size does.
        let (server, addr, client) = rdmactor_tests::serve_with(
            rdmactor_tests::capped_pool(4 << 20),
            "files",
            FileTransfer::new(Config::new(&store)).expect("files"),
        );
        let conn = client.connect(addr, "files").await.expect("connect");
        let (outcome, grant) = send(&conn, &src.join("big"), "big", &SendOptions::default()).await;
        assert!(grant.is_none(), "no window was granted");
        match &outcome {
            Outcome::Rejected(RejectReason::Unavailable { reason }) => assert!(
                reason.contains("window") && reason.contains("pool's cap"),
                "the reason names the window and the cap: {reason}"
            ),
            other => panic!("expected Unavailable, got {other:?}"),
        }
        assert_eq!(names(&store), set(&[]), "no file, no temporary file");
        assert_eq!(
            server.stats().await.pool.charged_bytes,
            0,
            "nothing stays charged"
        );
        let (outcome, _) = send(&conn, &src.join("small"), "small", &SendOptions::default()).await;
        assert!(
            delivered(&outcome),
            "the same connection still serves: {outcome:?}"
        );
        close_all(&server, client, vec![conn]).await;
        server.shutdown().await;
    });
    assert_eq!(names(&store), set(&["small"]));
    assert_random_file(&store.join("small"), 200 << 10, 42);
    assert_released(&base);
}

#[test]
fn a_served_file_that_shrinks_midway_aborts_the_download_with_the_reason() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    let scratch = Scratch::new("shrinks");
    let (store, out) = (scratch.sub("store"), scratch.sub("out"));
    write_random_file(&store.join("big"), 8 * MIB, 41);
    write_random_file(&store.join("after"), 100_000, 42);
    actix_run(async {
        let server = files_server(Config::new(&store).with_public_fetch(true));
        let client = Client::start(NodeConfig::default()).expect("client");
        let conn = client
            .connect(server.local_addrs()[0], "files")
            .await
            .expect("connect");
        let opts = FetchOptions {
            slots: 2,
            slot_len: 64 << 10,
            ..FetchOptions::default()
        };
        // The operator truncates the file after the server hashed it for the offer,
        // before any chunk is read: the server's reads end at 1 MiB.
        let big = store.join("big");
        let outcome = fetch_file(&conn, &client, "big", &out, &opts, |p| {
            if let Progress::Offer(_) = p {
                File::options()
                    .write(true)
                    .open(&big)
                    .and_then(|f| f.set_len(MIB))
                    .expect("truncate the served file");
            }
        })
        .await
        .expect("the fetch ends with a verdict, not a connection error");
        println!("fetch of a file that shrank: {outcome:?}");
        match &outcome {
            Outcome::Aborted(RejectReason::Unavailable { reason }) => assert!(
                reason.contains("ended at byte 1048576 of 8388608"),
                "{reason}"
            ),
            other => panic!("expected an abort naming the short file, got {other:?}"),
        }
        // A consume job still running when the abort came drops the temporary file
        // when it ends: soon, not necessarily before the outcome.
        eventually(
            "the temporary file to be removed",
            Duration::from_secs(10),
            || async { names(&out).is_empty() },
        )
        .await;
        // The same connection serves the next download.
        let outcome = fetch_file(&conn, &client, "after", &out, &opts, |_| {})
            .await
            .expect("fetch");
        assert!(matches!(outcome, Outcome::Stored { .. }), "{outcome:?}");
        close_all(&server, client, vec![conn]).await;
        server.shutdown().await;
    });
    assert_random_file(&out.join("after"), 100_000, 42);
    assert_released(&base);
}

/// Writes 16 bytes to `remote` and expects a remote access error. The server's side of
/// the queue pair fails too and disconnects; now and then (under emulation) that
/// disconnect reaches the client before the NAK's error completion does, and the WRITE
/// is answered with the closed connection instead, which is just as much a refusal.
async fn expect_remote_access_error(conn: &ClientConnection, remote: RemoteRegion, who: &str) {
    let err = conn
        .write(remote, vec![0xee; 16], None)
        .await
        .expect_err(who);
    assert!(
        err.to_string().contains("RemoteAccess")
            || err == RequestError::Closed(CloseReason::PeerDisconnected),
        "{who}: expected a remote access error, got {err}"
    );
}

#[test]
fn a_window_is_revoked_after_good_and_after_bad() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    let scratch = Scratch::new("revoked");
    let (src, store) = (scratch.sub("src"), scratch.sub("store"));
    let len = 2 * MIB + 5;
    let sha = write_random_file(&src.join("g"), len, 21);
    actix_run(async {
        let server = files_server(Config::new(&store));
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");
        let good = client.connect(addr, "files").await.expect("connect");
        let bad = client.connect(addr, "files").await.expect("connect");

        let (outcome, grant) = send(&good, &src.join("g"), "g", &SendOptions::default()).await;
        assert!(delivered(&outcome), "{outcome:?}");
        let grant = grant.expect("granted");
        expect_remote_access_error(&good, region(&grant), "reuse after GOOD").await;

        let opts = SendOptions {
            corrupt_chunk: Some(0),
            ..SendOptions::default()
        };
        let (outcome, grant) = send(&bad, &src.join("g"), "h", &opts).await;
        assert!(matches!(outcome, Outcome::Bad(_)), "{outcome:?}");
        let grant = grant.expect("granted");
        expect_remote_access_error(&bad, region(&grant), "reuse after BAD").await;

        // Both connections failed with the error and were closed by the server too.
        wait_idle(&server, "both connections closed", Duration::from_secs(20)).await;
        close_all(&server, client, vec![good, bad]).await;
        server.shutdown().await;
    });
    assert_eq!(names(&store), set(&["g"]), "the stored file is untouched");
    assert_eq!(sha256_file(&store.join("g")), sha);
    assert_released(&base);
}

#[test]
fn a_window_granted_to_one_client_is_useless_to_another() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    let scratch = Scratch::new("isolation");
    let store = scratch.sub("store");
    actix_run(async {
        let server = files_server(Config::new(&store));
        let addr = server.local_addrs()[0];
        let client_a = Client::start(NodeConfig::default()).expect("client A");
        let client_b = Client::start(NodeConfig::default()).expect("client B");
        let a = client_a.connect(addr, "files").await.expect("connect A");
        let b = client_b.connect(addr, "files").await.expect("connect B");
        // A offers a file by hand and keeps its window open (no chunks written).
        let data = vec![7u8; 2 * MIB as usize];
        let offer = FileOffer {
            name: "a".into(),
            len: data.len() as u64,
            digest: hash_bytes(HashAlg::Sha256, &data),
            overwrite: false,
        };
        a.send(Msg::Offer(offer).encode()).await.expect("offer");
        let reply = a.recv().await.expect("an answer to the offer");
        let Msg::Grant {
            window: Some(grant),
        } = Msg::decode(&reply.data).expect("decodes")
        else {
            panic!("expected a grant, got {reply:?}");
        };
        expect_remote_access_error(&b, region(&grant), "B with A's rkey").await;
        a.close().await;
        eventually(
            "the server to drop A's transfer",
            Duration::from_secs(20),
            || async { server.stats().await.connections == 0 && names(&store).is_empty() },
        )
        .await;
        client_a.shutdown().await;
        close_all(&server, client_b, vec![b]).await;
        server.shutdown().await;
    });
    assert_released(&base);
}

#[test]
fn fetched_files_match_the_served_ones() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    let scratch = Scratch::new("fetch");
    let (store, out, src) = (scratch.sub("store"), scratch.sub("out"), scratch.sub("src"));
    let served = [("five", 5 * MIB + 7), ("tiny", 10), ("empty", 0)];
    let mut shas = Vec::new();
    for (i, (name, len)) in served.iter().enumerate() {
        shas.push(write_random_file(&store.join(name), *len, 31 + i as u64));
    }
    write_random_file(&src.join("up"), 3 * MIB, 40);
    actix_run(async {
        // Files the operator put there: served to everyone only when the server says so.
        let server = files_server(Config::new(&store).with_public_fetch(true));
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");
        let conn = client.connect(addr, "files").await.expect("connect");
        // Back to back on one connection, both algorithms: a finished download's late
        // WRITE completions must not disturb the next transfer.
        for (i, (name, len)) in served.iter().enumerate() {
            let opts = FetchOptions {
                alg: [HashAlg::Sha256, HashAlg::Blake3][i % 2],
                ..FetchOptions::default()
            };
            let mut bytes = 0;
            let outcome = fetch_file(&conn, &client, name, &out, &opts, |p| {
                if let Progress::Bytes { done, .. } = p {
                    bytes = done;
                }
            })
            .await
            .unwrap_or_else(|e| panic!("fetching {name}: {e}"));
            assert!(
                matches!(&outcome, Outcome::Stored { len: l, .. } if l == len),
                "{name}: {outcome:?}"
            );
            assert_eq!(bytes, *len, "progress reached the end");
            assert_eq!(sha256_file(&out.join(name)), shas[i], "{name} differs");
        }
        // Fetching again without overwrite is refused locally (the file exists).
        let outcome = fetch_file(
            &conn,
            &client,
            "tiny",
            &out,
            &FetchOptions::default(),
            |_| {},
        )
        .await
        .expect("fetch");
        assert_eq!(outcome, Outcome::Rejected(RejectReason::Exists));
        // Through a small window: 81 chunks, each read on the server's blocking pool
        // (one at a time) and its slot reused, still in order and verified.
        let small = scratch.sub("out-small");
        let opts = FetchOptions {
            slots: 2,
            slot_len: 64 << 10,
            ..FetchOptions::default()
        };
        let outcome = fetch_file(&conn, &client, "five", &small, &opts, |_| {})
            .await
            .expect("fetch through a small window");
        assert!(
            matches!(&outcome, Outcome::Stored { len, .. } if *len == 5 * MIB + 7),
            "{outcome:?}"
        );
        assert_eq!(sha256_file(&small.join("five")), shas[0], "five differs");
        let outcome = fetch_file(
            &conn,
            &client,
            "missing",
            &out,
            &FetchOptions::default(),
            |_| {},
        )
        .await
        .expect("fetch");
        assert_eq!(outcome, Outcome::Rejected(RejectReason::NotFound));
        // The same connection uploads after downloading.
        let (outcome, _) = send(&conn, &src.join("up"), "up", &SendOptions::default()).await;
        assert!(delivered(&outcome), "{outcome:?}");
        close_all(&server, client, vec![conn]).await;
        server.shutdown().await;
    });
    assert_eq!(names(&out), set(&["empty", "five", "tiny"]));
    assert_eq!(names(&store), set(&["empty", "five", "tiny", "up"]));
    assert_random_file(&store.join("up"), 3 * MIB, 40);
    assert_released(&base);
}

#[test]
fn identify_answers_only_the_id_an_upload_proved() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    let scratch = Scratch::new("identify");
    let (src, store) = (scratch.sub("src"), scratch.sub("store"));
    write_random_file(&src.join("f"), 5000, 51);
    write_random_file(&src.join("empty"), 0, 52);
    actix_run(async {
        let server = files_server(
            Config::new(&store)
                .with_secret("alice", "a-key")
                .with_secret("bob", "b-key"),
        );
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");
        let conn = client.connect(addr, "files").await.expect("connect");
        // (source, stored name, ID): a new non-empty file named after the ID proves it;
        // an empty one (security issue item 5), another name, or an unknown ID do not,
        // and all three get the same Refused.
        for (file, name, id) in [
            ("empty", "bob", "bob"),
            ("f", "f2", "bob"),
            ("f", "mallory", "mallory"),
            ("f", "alice", "alice"),
        ] {
            let opts = SendOptions {
                identity: Some(id.into()),
                ..SendOptions::default()
            };
            let (outcome, _) = send(&conn, &src.join(file), name, &opts).await;
            let Outcome::Delivered { auth: Some(auth) } = outcome else {
                panic!("{name}: {outcome:?}");
            };
            match (name, auth) {
                ("alice", Auth::Secret(key)) => assert_eq!(key.expose(), "a-key"),
                ("alice", auth) => panic!("alice: {auth:?}"),
                (_, Auth::Refused) => {}
                (name, auth) => panic!("{name}: {auth:?}"),
            }
        }
        // Identify outside a GOOD transfer is a protocol error: the server hangs up.
        let rogue = client.connect(addr, "files").await.expect("connect");
        rogue
            .send(Msg::Identify { id: "alice".into() }.encode())
            .await
            .expect("send");
        assert_eq!(rogue.recv().await, None, "no secret, connection closed");
        close_all(&server, client, vec![conn, rogue]).await;
        server.shutdown().await;
    });
    assert_eq!(names(&store), set(&["alice", "bob", "f2", "mallory"]));
    assert_released(&base);
}

/// Security issue item 1: a client fetches its own 2-byte file and answers the offer
/// with a grant at the top of the address space. That used to panic the server's
/// sender on the poller thread and freeze every connection on it; now it ends only
/// that client's connection and another client's echo is answered.
#[test]
fn a_hostile_grant_ends_only_its_connection() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    let scratch = Scratch::new("hostile-grant");
    let (src, store) = (scratch.sub("src"), scratch.sub("store"));
    fs::write(src.join("f"), b"hi").expect("source");
    actix_run(async {
        let server = Server::builder()
            .listen(test_addr(), None)
            .service(
                "files",
                FileTransfer::new(Config::new(&store)).expect("files"),
            )
            .service("echo", rdmactor_services::echo::Echo)
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");
        let hostile = client.connect(addr, "files").await.expect("connect");
        let (outcome, _) = send(&hostile, &src.join("f"), "f", &SendOptions::default()).await;
        assert!(delivered(&outcome), "{outcome:?}");
        let fetch = Msg::Fetch {
            name: "f".into(),
            alg: HashAlg::Sha256,
        };
        hostile.send(fetch.encode()).await.expect("send Fetch");
        let offer = hostile.recv().await.expect("the offer");
        assert!(
            matches!(Msg::decode(&offer.data), Ok(Msg::Offer(o)) if o.len == 2),
            "{offer:?}"
        );
        let grant = Msg::Grant {
            window: Some(WindowGrant {
                region: rdmactor_services::file_transfer::RemoteWindow {
                    addr: u64::MAX,
                    len: 2,
                    rkey: 1,
                },
                slots: 2,
                slot_len: 1,
            }),
        };
        hostile.send(grant.encode()).await.expect("send Grant");
        let closed = tokio::time::timeout(Duration::from_secs(20), hostile.recv()).await;
        assert_eq!(closed, Ok(None), "the hostile connection is closed");
        let other = client.connect(addr, "echo").await.expect("connect echo");
        tokio::time::timeout(
            Duration::from_secs(20),
            rdmactor_tests::echo_ok(&other, b"still served".to_vec()),
        )
        .await
        .expect("another client's echo is answered");
        close_all(&server, client, vec![hostile, other]).await;
        server.shutdown().await;
    });
    assert_eq!(names(&store), set(&["f"]));
    assert_released(&base);
}

/// Issue 26 (1): a client fetching its own 1 MiB file grants 64 Mi slots of one byte.
/// The server kept `vec![None; slots]` of slot state for it (about a gigabyte) and
/// registered a staging buffer of the whole 64 MiB window, for every such Fetch. Now the
/// grant is refused, only that connection ends, with the cap in its reason, and the
/// server's memory does not move.
#[test]
fn a_fetch_grant_of_millions_of_one_byte_slots_is_refused_without_allocating() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    let scratch = Scratch::new("slot-grant");
    let (src, store) = (scratch.sub("src"), scratch.sub("store"));
    write_random_file(&src.join("own"), MIB, 61);
    actix_run(async {
        let (files, reasons) =
            rdmactor_tests::Recorded::new(FileTransfer::new(Config::new(&store)).expect("files"));
        let server = Server::builder()
            .listen(test_addr(), None)
            .service("files", files)
            .service("echo", rdmactor_services::echo::Echo)
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");
        let other = client.connect(addr, "echo").await.expect("connect echo");
        rdmactor_tests::echo_ok(&other, b"before".to_vec()).await;
        let hostile = client.connect(addr, "files").await.expect("connect");
        let (outcome, _) = send(&hostile, &src.join("own"), "own", &SendOptions::default()).await;
        assert!(delivered(&outcome), "{outcome:?}");
        let before = rdmactor_tests::rss_kib();
        let fetch = Msg::Fetch {
            name: "own".into(),
            alg: HashAlg::Sha256,
        };
        hostile.send(fetch.encode()).await.expect("send Fetch");
        let offer = hostile.recv().await.expect("the offer");
        assert!(
            matches!(Msg::decode(&offer.data), Ok(Msg::Offer(o)) if o.len == MIB),
            "{offer:?}"
        );
        let (slots, slot_len) = (64u32 << 20, 1u32);
        let grant = Msg::Grant {
            window: Some(WindowGrant {
                region: rdmactor_services::file_transfer::RemoteWindow {
                    addr: 0x7f00_0000_0000,
                    len: u64::from(slots) * u64::from(slot_len),
                    rkey: 1,
                },
                slots,
                slot_len,
            }),
        };
        hostile.send(grant.encode()).await.expect("send Grant");
        let closed = tokio::time::timeout(Duration::from_secs(30), hostile.recv()).await;
        assert_eq!(closed, Ok(None), "the hostile connection is closed");
        let grown = rdmactor_tests::rss_kib().saturating_sub(before);
        let reason = rdmactor_tests::first_close_reason(&reasons, Duration::from_secs(10)).await;
        println!("hostile slot grant: closed with {reason:?}; RSS grew by {grown} KiB");
        assert!(reason.contains("more than the 1024 accepted"), "{reason}");
        assert!(grown < 32 * 1024, "RSS grew by {grown} KiB for one grant");
        for i in 0..10u8 {
            rdmactor_tests::echo_ok(&other, vec![i; 1000 + 300 * i as usize]).await;
        }
        close_all(&server, client, vec![other]).await;
        server.shutdown().await;
    });
    assert_eq!(names(&store), set(&["own"]));
    assert_released(&base);
}

/// Issue 26 (4): a client that takes its grant and never writes, or asks for a file and
/// never grants a window, held the window (or the staging and the open file), its quota
/// share and its reserved disk for as long as its QP lived. With a stall limit the server
/// ends each transfer with the reason, frees all of it, and keeps the connection: the
/// same client uploads a file afterwards. Another client is served throughout.
#[test]
fn a_client_that_goes_silent_mid_transfer_is_told_why_and_everything_it_held_is_freed() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    let scratch = Scratch::new("stalled");
    let (src, store) = (scratch.sub("src"), scratch.sub("store"));
    let len = 2 * MIB + 3;
    write_random_file(&src.join("mine"), len, 71);
    write_random_file(&src.join("other"), 3 * MIB, 72);
    let stall = Duration::from_secs(2);
    actix_run(async {
        let files = FileTransfer::new(Config::new(&store).with_stall(Some(stall))).expect("files");
        let server = files_server_with(files.clone());
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");
        let silent = client.connect(addr, "files").await.expect("connect");
        let other = client.connect(addr, "files").await.expect("connect");
        let (outcome, _) = send(&silent, &src.join("mine"), "mine", &SendOptions::default()).await;
        assert!(delivered(&outcome), "{outcome:?}");
        let usage = || {
            let owner = files.quota_owner().expect("the quota owner");
            async move {
                owner
                    .send(rdmactor_services::file_transfer::Usage(
                        test_addr().ip().to_string(),
                    ))
                    .await
                    .expect("usage")
            }
        };
        let expect_stalled = |msg: Option<rdmactor::runtime::Incoming>, what: &str| {
            let msg = msg.unwrap_or_else(|| panic!("{what}: the connection closed"));
            match Msg::decode(&msg.data) {
                Ok(Msg::Abort {
                    reason: RejectReason::Stalled { secs },
                }) => assert_eq!(secs, 2, "{what}"),
                other => panic!("{what}: expected Abort with Stalled, got {other:?}"),
            }
        };

        // Upload: offer, take the grant, write nothing.
        let mrs = resource_counts().get("mr");
        let offer = FileOffer {
            name: "never".into(),
            len: 2 * MIB,
            digest: hash_bytes(HashAlg::Sha256, b"not these bytes"),
            overwrite: false,
        };
        let t0 = Instant::now();
        silent
            .send(Msg::Offer(offer).encode())
            .await
            .expect("offer");
        let reply = silent.recv().await.expect("an answer to the offer");
        let Ok(Msg::Grant {
            window: Some(grant),
        }) = Msg::decode(&reply.data)
        else {
            panic!("expected a grant, got {reply:?}");
        };
        assert_eq!(
            resource_counts().get("mr"),
            mrs + 1,
            "the window is registered"
        );
        assert_eq!(usage().await, (1, 2 * MIB), "the upload holds its share");
        // The other client's upload goes through while this one stalls.
        let (outcome, _) = send(&other, &src.join("other"), "other", &SendOptions::default()).await;
        assert!(delivered(&outcome), "{outcome:?}");
        let abort = tokio::time::timeout(Duration::from_secs(30), silent.recv())
            .await
            .expect("an Abort within 30 s of a 2 s stall limit");
        let waited = t0.elapsed();
        expect_stalled(abort, "the silent upload");
        println!("silent upload: Abort(Stalled) after {waited:?}");
        assert!(waited >= stall, "ended after {waited:?}, before the limit");
        assert_eq!(
            resource_counts().get("mr"),
            mrs,
            "the window is deregistered"
        );
        assert_eq!(usage().await, (0, 0), "the share is given back");
        assert_eq!(
            names(&store),
            set(&["mine", "other"]),
            "no temporary file is left"
        );
        expect_remote_access_error(&other, region(&grant), "the stalled window").await;

        // Download: ask for our own file, take the offer, never grant a window.
        let fetch = Msg::Fetch {
            name: "mine".into(),
            alg: HashAlg::Sha256,
        };
        silent.send(fetch.encode()).await.expect("fetch");
        let offer = silent.recv().await.expect("the offer");
        assert!(
            matches!(Msg::decode(&offer.data), Ok(Msg::Offer(o)) if o.len == len),
            "{offer:?}"
        );
        let abort = tokio::time::timeout(Duration::from_secs(30), silent.recv())
            .await
            .expect("an Abort within 30 s of a 2 s stall limit");
        expect_stalled(abort, "the ungranted download");

        // The connection stays usable: the same client uploads again.
        let (outcome, _) = send(
            &silent,
            &src.join("other"),
            "again",
            &SendOptions::default(),
        )
        .await;
        assert!(delivered(&outcome), "{outcome:?}");
        assert_eq!(
            sha256_file(&store.join("again")),
            sha256_file(&src.join("other"))
        );
        close_all(&server, client, vec![silent]).await;
        server.shutdown().await;
    });
    assert_released(&base);
}

/// The digest store's size for the tests below: `RDMACTOR_FT_DIGEST_CACHE=0` turns it
/// off, which is how fetches were served before it (every one hashed its file).
fn digest_cache() -> usize {
    std::env::var("RDMACTOR_FT_DIGEST_CACHE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(rdmactor_services::file_transfer::DigestCache::DEFAULT_CAPACITY)
}

/// Issue 26, item 10: every fetch read and hashed its whole file on the blocking pool,
/// so a client could make the server read a large file in full for a few bytes of
/// request, again and again. The digest verified when the file was uploaded is now
/// reused as long as the file is unchanged.
#[test]
fn fetching_an_uploaded_file_again_and_again_never_hashes_it() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    let scratch = Scratch::new("digest-cache");
    let (src, store) = (scratch.sub("src"), scratch.sub("store"));
    let sha = write_random_file(&src.join("up"), 8 * MIB, 51);
    const FETCHES: u64 = 4;
    let files =
        FileTransfer::new(Config::new(&store).with_digest_cache(digest_cache())).expect("files");
    actix_run(async {
        let server = files_server_with(files.clone());
        let client = Client::start(NodeConfig::default()).expect("client");
        let conn = client
            .connect(server.local_addrs()[0], "files")
            .await
            .expect("connect");
        let (outcome, _) = send(&conn, &src.join("up"), "up", &SendOptions::default()).await;
        assert!(delivered(&outcome), "{outcome:?}");
        for i in 0..FETCHES {
            let out = scratch.sub(&format!("out-{i}"));
            let started = Instant::now();
            let outcome = fetch_file(&conn, &client, "up", &out, &FetchOptions::default(), |_| {})
                .await
                .expect("fetch");
            assert!(
                matches!(&outcome, Outcome::Stored { len, .. } if *len == 8 * MIB),
                "{outcome:?}"
            );
            assert_eq!(sha256_file(&out.join("up")), sha, "fetch {i} differs");
            println!(
                "fetch {i}: {:?}, files hashed so far: {}",
                started.elapsed(),
                files.files_hashed()
            );
        }
        let stats = files.digest_stats();
        println!("digest store after the upload and {FETCHES} fetches: {stats:?}");
        assert_eq!(
            files.files_hashed(),
            0,
            "the digest verified at upload serves every fetch: {stats:?}"
        );
        assert_eq!(stats.hits, FETCHES);
        // Replaced by another upload: that one's digest is the one offered.
        write_random_file(&src.join("up"), 3 * MIB, 52);
        let opts = SendOptions {
            overwrite: true,
            ..SendOptions::default()
        };
        let (outcome, _) = send(&conn, &src.join("up"), "up", &opts).await;
        assert!(delivered(&outcome), "{outcome:?}");
        let out = scratch.sub("out-replaced");
        let outcome = fetch_file(&conn, &client, "up", &out, &FetchOptions::default(), |_| {})
            .await
            .expect("fetch");
        assert!(
            matches!(&outcome, Outcome::Stored { len, .. } if *len == 3 * MIB),
            "{outcome:?}"
        );
        assert_random_file(&out.join("up"), 3 * MIB, 52);
        assert_eq!(files.files_hashed(), 0);
        close_all(&server, client, vec![conn]).await;
        server.shutdown().await;
    });
    assert_released(&base);
}

/// Issue 26, item 10: one client could have any number of files hashed at once by
/// fetching over many connections. Each client now has at most
/// `Config::DEFAULT_FETCH_PREPARATIONS` (2) at once; the third is refused with the
/// reason, while another client is served.
#[test]
fn a_client_preparing_more_fetches_than_allowed_is_refused_while_others_are_served() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    let scratch = Scratch::new("preparations");
    let store = scratch.sub("store");
    // Files the operator put there: unknown to the service, so each fetch hashes.
    let names = ["a1", "a2", "a3", "b1"];
    for (i, name) in names.iter().enumerate() {
        write_random_file(&store.join(name), 32 * MIB, 60 + i as u64);
    }
    let files = FileTransfer::new(
        Config::new(&store)
            .with_public_fetch(true)
            .with_digest_cache(digest_cache()),
    )
    .expect("files");
    let limit = Config::DEFAULT_FETCH_PREPARATIONS;
    assert_eq!(limit, 2);
    actix_run(async {
        let server = files_server_with(files.clone());
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");
        let mut conns = Vec::new();
        for _ in 0..3 {
            conns.push(client.connect(addr, "files").await.expect("connect"));
        }
        let other = client
            .connect_from(rdmactor_tests::second_peer_ip(), addr, "files")
            .await
            .expect("connect from the second address");
        let fetch = |conn: &ClientConnection, name: &'static str| {
            let out = scratch.sub(&format!("out-{name}"));
            let client = &client;
            let conn = conn.clone();
            async move {
                let outcome =
                    fetch_file(&conn, client, name, &out, &FetchOptions::default(), |_| {})
                        .await
                        .unwrap_or_else(|e| panic!("fetching {name}: {e}"));
                (name, outcome)
            }
        };
        // Three fetches from one host at once, and one from another host.
        let (a1, a2, a3, b1) = futures::join!(
            fetch(&conns[0], "a1"),
            fetch(&conns[1], "a2"),
            fetch(&conns[2], "a3"),
            fetch(&other, "b1"),
        );
        let mut refused = Vec::new();
        for (name, outcome) in [a1, a2, a3] {
            println!("client A, {name}: {outcome:?}");
            match outcome {
                Outcome::Stored { len, .. } => assert_eq!(len, 32 * MIB),
                Outcome::Rejected(reason) => {
                    assert_eq!(
                        reason,
                        RejectReason::Quota {
                            what: "fetches being prepared at once".into(),
                            limit: 2,
                            would_use: 3,
                        }
                    );
                    println!("refused with: {reason}");
                    refused.push(name);
                }
                other => panic!("{name}: {other:?}"),
            }
        }
        assert_eq!(refused.len(), 1, "exactly one of three is over the limit");
        println!("client B, {}: {:?}", b1.0, b1.1);
        assert!(
            matches!(b1.1, Outcome::Stored { len, .. } if len == 32 * MIB),
            "the other client is served: {:?}",
            b1.1
        );
        assert_eq!(files.files_hashed(), 3);
        // Once the others are prepared, the refused one is served.
        let (name, outcome) = fetch(&conns[0], refused[0]).await;
        assert!(
            matches!(outcome, Outcome::Stored { .. }),
            "{name}: {outcome:?}"
        );
        conns.push(other);
        close_all(&server, client, conns).await;
        server.shutdown().await;
    });
    for (i, name) in names.iter().enumerate() {
        assert_random_file(
            &scratch.0.join(format!("out-{name}")).join(name),
            32 * MIB,
            60 + i as u64,
        );
    }
    assert_released(&base);
}
