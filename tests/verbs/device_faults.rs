//! The device's own faults, as the server meets them: a port going down and up
//! (`ip link set rxenet0 down/up` under rxe) reaches the server as the device's
//! asynchronous events, which it logs by name, and it serves new clients once the
//! port is back.
//!
//! The server runs as a child process (the example binary, as an operator runs it) so
//! that its log is what is checked.

use std::fs::{self, File};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use rdmactor_tests::{rdma_context, target_bin, test_addr};

/// The netdev rxe0 runs on in the test VM (`scripts/softroce`).
const NETDEV: &str = "rxenet0";
const PORT: u16 = 7491;

fn log_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.ancestors().nth(3).unwrap().join("device-faults-tests");
    fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{name}-{}.log", std::process::id()))
}

/// Kills the server if the test fails before it stops it.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for_log(log: &PathBuf, needle: &str, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let text = fs::read_to_string(log).unwrap_or_default();
        if text.contains(needle) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{needle:?} not logged within {limit:?}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A short latency run of the client example: true if it finished its round trips.
fn client_served() -> bool {
    let out = Command::new(target_bin("client"))
        .args([
            "--addr",
            &format!("{}:{PORT}", test_addr().ip()),
            "latency",
            "--iters",
            "20",
        ])
        .output()
        .expect("run the client example");
    if !out.status.success() {
        eprintln!(
            "client: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out.status.success()
}

fn ip_link(state: &str) {
    let status = Command::new("ip")
        .args(["link", "set", NETDEV, state])
        .status()
        .expect("run ip");
    assert!(status.success(), "ip link set {NETDEV} {state}");
}

#[test]
fn a_port_going_down_and_up_is_logged_by_name_and_the_server_serves_again() {
    let Some(_ctx) = rdma_context() else { return };
    let log = log_path("port");
    let out = File::create(&log).unwrap();
    let server = Command::new(target_bin("server"))
        .args(["--listen", &format!("{}:{PORT}", test_addr().ip())])
        .env("RUST_LOG", "info")
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("start the server example (cargo build --release -p rdmactor-examples)");
    let mut server = Running(server);
    wait_for_log(&log, "listening", Duration::from_secs(20));
    assert!(client_served(), "served before the fault");

    ip_link("down");
    let text = wait_for_log(
        &log,
        "IBV_EVENT_PORT_ERR on port 1",
        Duration::from_secs(20),
    );
    ip_link("up");
    let text = wait_for_log(
        &log,
        "IBV_EVENT_PORT_ACTIVE on port 1",
        Duration::from_secs(20),
    )
    .split_at(text.len())
    .1
    .to_owned();
    println!("server log after the port went down:\n{text}");
    assert!(
        server.0.try_wait().unwrap().is_none(),
        "the server survives"
    );
    // The route comes back with the link; give the client a few tries meanwhile.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !client_served() {
        assert!(
            Instant::now() < deadline,
            "not served after the port came back"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // SIGTERM: a clean shutdown.
    let status = Command::new("kill")
        .arg(server.0.id().to_string())
        .status()
        .unwrap();
    assert!(status.success());
    let status = server.0.wait().unwrap();
    assert!(status.success(), "clean exit: {status}");
    let _ = fs::remove_file(log);
}
