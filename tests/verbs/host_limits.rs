//! Limits of the host, met as a new user would meet them: a server started under a
//! locked-memory limit too small for its pool (`ulimit -l 64`, as many distributions
//! set it) stops at once with a message naming `RLIMIT_MEMLOCK` and how to raise it,
//! and a non-zero status, instead of failing every connection later or panicking.
//!
//! The VM runs tests as root, and `CAP_IPC_LOCK` exempts a process from the limit, so
//! the server runs with that capability dropped (`setpriv`), as an ordinary user's
//! would be.

use std::fs::{self, File};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use rdmactor_tests::{rdma_context, target_bin, test_addr};

/// Starts the server example without `CAP_IPC_LOCK` under `ulimit -l LIMIT`, its
/// stdout and stderr into `log`.
fn server_without_ipc_lock(limit: &str, log: &PathBuf) -> Child {
    let addr = test_addr();
    let out = File::create(log).expect("log file");
    Command::new("setpriv")
        .args([
            "--inh-caps=-ipc_lock",
            "--bounding-set=-ipc_lock",
            "--",
            "sh",
            "-c",
            &format!("ulimit -l {limit} && exec \"$0\" --listen {}:0", addr.ip()),
        ])
        .arg(target_bin("server"))
        .env("RUST_LOG", "info")
        .env("RUST_BACKTRACE", "0")
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("start the server under setpriv (cargo build --release -p rdmactor-examples)")
}

/// Waits up to `limit` for the child's exit.
fn wait(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

fn log_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.ancestors().nth(3).unwrap().join("host-limits-tests");
    fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{name}-{}.log", std::process::id()))
}

#[test]
fn a_server_under_ulimit_l_64_stops_with_a_message_naming_the_limit() {
    let Some(_ctx) = rdma_context() else { return };
    // Control: the same command with no limit serves (it is still running after 3 s),
    // so the failure below is the limit's doing.
    let log = log_path("unlimited");
    let mut server = server_without_ipc_lock("unlimited", &log);
    let early = wait(&mut server, Duration::from_secs(3));
    let _ = server.kill();
    let _ = server.wait();
    let text = fs::read_to_string(&log).unwrap();
    assert!(
        early.is_none(),
        "without a limit the server runs: {early:?}\n{text}"
    );
    assert!(text.contains("RLIMIT_MEMLOCK is unlimited"), "{text}");

    let log = log_path("64k");
    let mut server = server_without_ipc_lock("64", &log);
    let status = wait(&mut server, Duration::from_secs(30)).unwrap_or_else(|| {
        let _ = server.kill();
        panic!(
            "the server kept running under ulimit -l 64:\n{}",
            fs::read_to_string(&log).unwrap()
        )
    });
    let text = fs::read_to_string(&log).unwrap();
    println!("server under `ulimit -l 64` without CAP_IPC_LOCK ({status}):\n{text}");
    assert!(!status.success(), "{status}");
    assert_ne!(status.code(), Some(101), "a panic's status: {text}");
    assert!(!text.contains("panicked"), "{text}");
    for part in ["RLIMIT_MEMLOCK", "ulimit -l", "64 KiB", "CAP_IPC_LOCK"] {
        assert!(text.contains(part), "{part:?} missing:\n{text}");
    }
    let _ = fs::remove_file(log);
}
