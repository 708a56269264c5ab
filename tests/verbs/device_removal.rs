//! The server's RDMA device removed under load and added back (`rdma link delete rxe0`,
//! `rdma link add rxe0 type rxe netdev rxenet0`): the server process survives, logs the
//! removal, closes every connection with the reason, releases everything it had opened
//! on the device so that the kernel's delete returns, and listens again once the device
//! is back; new clients are served with verified bytes and the device's object counts
//! are what they were before the removal.
//!
//! The server and the clients run as child processes (the example binaries), and this
//! process never opens an RDMA device itself: a process that so much as listed the
//! devices through librdmacm holds them open, and the delete would wait for it.
//!
//! Twice: with a second rxe device listed (`rxe9` on a dummy netdev), as a host with more
//! than one RDMA port has, where librdmacm's next listing sees rxe0 gone and closes its
//! handle of it; and with rxe0 the only device, where librdmacm's listing gives up on the
//! empty list (rdma-core's `sync_devices_list`) and the server releases that handle itself
//! (`verbs::release_removed_devices`).

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdmactor_tests::{target_bin, test_addr, ResourceCounts};

/// The device and netdev of the test VM (`scripts/softroce`).
const DEVICE: &str = "rxe0";
const NETDEV: &str = "rxenet0";
/// The second device that lets librdmacm see the first one gone.
const SPARE_DEVICE: &str = "rxe9";
const SPARE_NETDEV: &str = "rxenet9";
const PORT: u16 = 7493;
/// How long the kernel's delete may take: the server has to close every connection and
/// release its pool, CQs, PD and context first.
const DELETE_LIMIT: Duration = Duration::from_secs(30);

fn log_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.ancestors().nth(3).unwrap().join("device-removal-tests");
    fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{name}-{}.log", std::process::id()))
}

fn device_listed(name: &str) -> bool {
    Path::new("/sys/class/infiniband").join(name).exists()
}

fn run(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Leaves the VM as it found it, even when the test fails: rxe0 on rxenet0, no spare.
/// Declared before the processes, so dropped after them (they hold the devices).
struct Devices;

impl Drop for Devices {
    fn drop(&mut self) {
        if !device_listed(DEVICE) {
            run(
                "rdma",
                &["link", "add", DEVICE, "type", "rxe", "netdev", NETDEV],
            );
        }
        run("rdma", &["link", "delete", SPARE_DEVICE]);
        run("ip", &["link", "delete", SPARE_NETDEV]);
    }
}

impl Devices {
    /// rxe0 alone, as the VM has it.
    fn only_rxe0() -> Devices {
        assert!(
            !device_listed(SPARE_DEVICE),
            "{SPARE_DEVICE} is left from an earlier run"
        );
        Devices
    }

    fn add_spare() -> Devices {
        let guard = Devices;
        assert!(
            run("ip", &["link", "add", SPARE_NETDEV, "type", "dummy"]),
            "ip link add {SPARE_NETDEV}"
        );
        assert!(run("ip", &["link", "set", SPARE_NETDEV, "up"]));
        assert!(
            run(
                "rdma",
                &[
                    "link",
                    "add",
                    SPARE_DEVICE,
                    "type",
                    "rxe",
                    "netdev",
                    SPARE_NETDEV
                ]
            ),
            "rdma link add {SPARE_DEVICE}"
        );
        guard
    }
}

/// Kills the process if the test fails before it ends it.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_logged(bin: &str, args: &[String], log: &Path) -> Running {
    let out = File::create(log).unwrap();
    let child = Command::new(target_bin(bin))
        .args(args)
        .env(
            "RUST_LOG",
            std::env::var("RDMACTOR_TEST_LOG").unwrap_or("info".into()),
        )
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("start the {bin} example: {e}"));
    Running(child)
}

fn wait_for_log(log: &Path, needle: &str, after: usize, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let text = fs::read_to_string(log).unwrap_or_default();
        if text.get(after..).is_some_and(|t| t.contains(needle)) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{needle:?} not logged within {limit:?}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `rdma resource show` counts of `device` (`None` when it is not listed).
fn counts_of(device: &str) -> Option<ResourceCounts> {
    let out = Command::new("rdma")
        .args(["resource", "show"])
        .output()
        .expect("run rdma resource show");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.split_whitespace().nth(1) == Some(&format!("{device}:")))
        .map(ResourceCounts::parse)
}

/// Lines of `rdma resource show KIND` that name process `pid`.
fn objects_of(pid: u32) -> Vec<String> {
    let mut out = Vec::new();
    for kind in ["qp", "cq", "mr", "pd", "cm_id"] {
        let text = Command::new("rdma")
            .args(["resource", "show", kind])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let needle = format!("pid {pid} ");
        out.extend(
            text.lines()
                .filter(|l| l.contains(&needle) || l.ends_with(&format!("pid {pid}")))
                .map(|l| format!("{kind}: {l}")),
        );
    }
    out
}

/// One round of verified echoes on four new connections: true if all came back.
fn served() -> bool {
    let out = Command::new(target_bin("client"))
        .args(client_args(&[
            "echo",
            "--connections",
            "4",
            "--requests",
            "200",
        ]))
        .output()
        .expect("run the client example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let ok = out.status.success() && stdout.contains("RESULT kind=echo connections=4 requests=800");
    if !ok {
        eprintln!("client: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    }
    ok
}

/// The device's counts once they stopped changing (closed connections' cm_ids leave
/// after TIMEWAIT).
fn settled_counts() -> ResourceCounts {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = counts_of(DEVICE).expect("rxe0 listed");
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = counts_of(DEVICE).expect("rxe0 listed");
        if now == last || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

fn client_args(run: &[&str]) -> Vec<String> {
    let mut args = vec![
        "--addr".to_owned(),
        format!("{}:{PORT}", test_addr().ip()),
        "--device".to_owned(),
        DEVICE.to_owned(),
    ];
    args.extend(run.iter().map(|s| (*s).to_owned()));
    args
}

#[test]
fn the_server_survives_rdma_link_delete_and_serves_again_after_rdma_link_add() {
    delete_under_load_then_add(Devices::add_spare);
}

#[test]
fn the_same_with_rxe0_the_only_rdma_device() {
    delete_under_load_then_add(Devices::only_rxe0);
}

/// Echo load on rxe0, `rdma link delete rxe0`, checks, `rdma link add`, checks; with the
/// devices `devices` sets up.
fn delete_under_load_then_add(devices: fn() -> Devices) {
    if !device_listed(DEVICE) {
        assert!(
            std::env::var("RDMACTOR_REQUIRE_RDMA").as_deref() != Ok("1"),
            "RDMACTOR_REQUIRE_RDMA=1 but {DEVICE} is not listed"
        );
        eprintln!("no {DEVICE}: skipped (run in the Soft-RoCE VM)");
        return;
    }
    let _devices = devices();

    // A read region (a file) registered at start: the read service must let it go with
    // the device and register it again on the new one.
    let region = log_path("region");
    fs::write(&region, b"region bytes").unwrap();
    let log = log_path("server");
    let server = spawn_logged(
        "server",
        &[
            "--listen".to_owned(),
            format!("{}:{PORT}", test_addr().ip()),
            "--device".to_owned(),
            DEVICE.to_owned(),
            "--region".to_owned(),
            format!("motd={}", region.display()),
        ],
        &log,
    );
    let server_pid = server.0.id();
    wait_for_log(&log, "listening on", 0, Duration::from_secs(20));
    // One round of clients first: the server keeps some of what connections made it
    // create (a shared receive queue and its CQ, pool arenas), and the counts after the
    // same round on the returned device must be these.
    assert!(served(), "served before the removal");
    let baseline = settled_counts();
    println!("served once, idle: {baseline:?}");

    // Load: three client processes echoing verified bytes in a loop on two connections
    // each.
    let mut clients = Vec::new();
    for i in 0..3 {
        let log = log_path(&format!("client{i}"));
        let child = spawn_logged(
            "client",
            &client_args(&["echo", "--connections", "2", "--forever"]),
            &log,
        );
        clients.push((child, log));
    }
    for (_, log) in &clients {
        wait_for_log(log, "connected 2", 0, Duration::from_secs(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    let before = fs::read_to_string(&log).unwrap_or_default().len();

    // The removal: must return once the server (and the clients, which exit when their
    // connections end) released the device.
    let begun = Instant::now();
    let mut delete = Command::new("rdma")
        .args(["link", "delete", DEVICE])
        .spawn()
        .expect("run rdma link delete");
    let deleted = loop {
        if let Some(status) = delete.try_wait().unwrap() {
            break status;
        }
        if begun.elapsed() > DELETE_LIMIT {
            let text = fs::read_to_string(&log).unwrap_or_default();
            // What the server still has open, and where its threads are.
            let what = format!(
                "ls -l /proc/{server_pid}/fd; for t in /proc/{server_pid}/task/*; do \
                 echo \"== $(cat $t/comm)\"; cat $t/stack; done"
            );
            if let Ok(out) = Command::new("sh").args(["-c", &what]).output() {
                println!("{}", String::from_utf8_lossy(&out.stdout));
            }
            for (_, log) in &clients {
                println!(
                    "{}:\n{}",
                    log.display(),
                    fs::read_to_string(log).unwrap_or_default()
                );
            }
            // Let the delete finish (the server's exit releases the device) before the
            // guard adds the link back.
            drop(server);
            let _ = delete.wait();
            panic!(
                "rdma link delete {DEVICE} did not return within {DELETE_LIMIT:?}: the server \
                 still holds the device. Its log:\n{}\nits objects: {:?}",
                &text[before.min(text.len())..],
                objects_of(server_pid)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let delete_took = begun.elapsed();
    assert!(deleted.success(), "rdma link delete: {deleted}");
    println!("rdma link delete {DEVICE} returned in {delete_took:?}");

    let mut server = server;
    assert!(
        server.0.try_wait().unwrap().is_none(),
        "the server process survives the removal"
    );
    let text = wait_for_log(
        &log,
        "waiting for rxe0 to return",
        before,
        Duration::from_secs(10),
    );
    let after_removal = &text[before..];
    println!("server log after the removal:\n{after_removal}");
    assert!(
        after_removal.contains("RDMA device removed (RDMA_CM_EVENT_DEVICE_REMOVAL)"),
        "the removal is logged"
    );
    assert!(
        after_removal.contains("the RDMA device is gone"),
        "connections closed naming the removal"
    );
    assert!(
        objects_of(server_pid).is_empty(),
        "nothing of the server is left: {:?}",
        objects_of(server_pid)
    );
    assert!(counts_of(DEVICE).is_none(), "{DEVICE} is gone");
    // The process answers `Server::stats` meanwhile (the example prints a line when
    // `device_present` changes and, while it is false, when the count of connections
    // does: its first sample may come before the last connection let go, as in one CI
    // run).
    wait_for_log(
        &log,
        "stats: device_present=false connections=0 device_losses=1",
        before,
        Duration::from_secs(5),
    );

    // The clients' requests failed with the reason, and they exited.
    for (child, log) in &mut clients {
        let deadline = Instant::now() + Duration::from_secs(15);
        let status = loop {
            if let Some(s) = child.0.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "a client still runs");
            std::thread::sleep(Duration::from_millis(100));
        };
        let text = fs::read_to_string(&*log).unwrap_or_default();
        assert!(!status.success(), "a client's echo loop ends in an error");
        // The clients share the removed device with the server: a client's connection
        // ends on whichever comes first, its own DEVICE_REMOVAL event or the server's
        // disconnect (seen once in a CI run), and its error says which.
        assert!(
            text.contains("the RDMA device is gone") || text.contains("peer disconnected"),
            "the client's error names the removal or the server's disconnect:\n{text}"
        );
    }
    println!(
        "a client's end: {}",
        fs::read_to_string(&clients[0].1)
            .unwrap_or_default()
            .lines()
            .rev()
            .find(|l| l.contains("device"))
            .unwrap_or_default()
    );

    // The device comes back: the server listens again on the same address.
    let mark = fs::read_to_string(&log).unwrap_or_default().len();
    assert!(
        run(
            "rdma",
            &["link", "add", DEVICE, "type", "rxe", "netdev", NETDEV]
        ),
        "rdma link add {DEVICE}"
    );
    let text = wait_for_log(&log, "serving again", mark, Duration::from_secs(20));
    wait_for_log(
        &log,
        "stats: device_present=true",
        mark,
        Duration::from_secs(5),
    );
    println!("server log after the add:\n{}", &text[mark..]);

    // New clients, verified bytes (the route may take a moment to come back).
    let deadline = Instant::now() + Duration::from_secs(30);
    while !served() {
        assert!(
            Instant::now() < deadline,
            "not served after the device came back"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // The same objects as before the removal, on the new device: pool, CQs, PD, shared
    // receive queue, listening id, the read region registered again; nothing of the
    // clients.
    let now = settled_counts();
    assert_eq!(now, baseline, "counts after the same round of clients");
    println!("served again, idle: {now:?}");

    // SIGTERM: a clean shutdown.
    assert!(run("kill", &[&server_pid.to_string()]));
    let status = server.0.wait().unwrap();
    assert!(status.success(), "clean exit: {status}");
    let _ = fs::remove_file(&log);
    let _ = fs::remove_file(&region);
    for (_, log) in &clients {
        let _ = fs::remove_file(log);
    }
}
