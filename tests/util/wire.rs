//! The driver's side of `scripts/wire`: a test that runs on this machine (not in a VM)
//! and steers Soft-RoCE hosts, a (192.0.2.1) and b (192.0.2.2), and with `--hosts 3` or
//! `4` also c (192.0.2.3) and d (192.0.2.4), joined by a virtual wire: jobs on any host,
//! faults on the wire, a host killed and booted again.
//!
//! Every call is one `scripts/wire ctl` request; the wire itself is the one named by
//! `RDMACTOR_WIRE`, which `scripts/wire --driver` sets. Without it the tests skip, unless
//! `RDMACTOR_REQUIRE_WIRE=1` (set by `scripts/test`) makes that a failure.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::ResourceCounts;

/// One of the hosts (c and d exist only on a wire of `scripts/wire --hosts 3` or `4`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Host {
    /// 192.0.2.1: where the two-host tests run the server.
    A,
    /// 192.0.2.2: where the two-host tests run the clients, and the host that fails.
    B,
    /// 192.0.2.3.
    C,
    /// 192.0.2.4.
    D,
}

impl Host {
    /// The host's name for `scripts/wire ctl` (and its guest's hostname): a to d.
    pub fn name(self) -> &'static str {
        match self {
            Host::A => "a",
            Host::B => "b",
            Host::C => "c",
            Host::D => "d",
        }
    }

    /// The host's address on the wire.
    pub fn ip(self) -> &'static str {
        match self {
            Host::A => "192.0.2.1",
            Host::B => "192.0.2.2",
            Host::C => "192.0.2.3",
            Host::D => "192.0.2.4",
        }
    }
}

/// The running wire.
pub struct Wire {
    script: PathBuf,
    dir: PathBuf,
}

/// What a finished job printed and how it ended.
#[derive(Debug)]
pub struct Job {
    /// Exit status (124: still running at the deadline, 255: its host died).
    pub status: i32,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

impl Job {
    /// Panics with everything the job printed unless it exited 0.
    pub fn ok(self, what: &str) -> Job {
        assert!(
            self.status == 0,
            "{what} exited {}\n--- stdout\n{}\n--- stderr\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
        self
    }
}

/// A job name no other test uses: the suite runs each test in its own process, and all of
/// them share the wire's job directories, so the process id is part of the name.
fn unique(prefix: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{n}", std::process::id())
}

impl Wire {
    /// The wire of `scripts/wire --driver`, or `None` (the test skips) outside one.
    pub fn from_env() -> Option<Wire> {
        let Some(dir) = std::env::var_os("RDMACTOR_WIRE") else {
            assert!(
                std::env::var_os("RDMACTOR_REQUIRE_WIRE").is_none(),
                "RDMACTOR_REQUIRE_WIRE is set but RDMACTOR_WIRE is not: run under scripts/wire --driver"
            );
            eprintln!("skipped: no wire (run with scripts/wire --driver, as scripts/test does)");
            return None;
        };
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("repo");
        let wire = Wire {
            script: repo.join("scripts/wire"),
            dir: PathBuf::from(dir),
        };
        wire.restore();
        Some(wire)
    }

    /// Every host running, its link up and no netem on its NIC, whatever an earlier test
    /// left: each test runs in its own process, and one that fails halfway (with b killed,
    /// or the cable pulled) must not fail the tests after it for that.
    fn restore(&self) {
        let out = self.ctl(&["hosts"]);
        let hosts = String::from_utf8_lossy(&out.stdout).into_owned();
        for name in hosts.split_whitespace() {
            if !self.ctl(&["alive", name]).status.success() {
                eprintln!("wire: host {name} was down (left so by an earlier test): booting it");
                self.ctl_ok(&["boot", name]);
            }
            self.ctl_ok(&["link", name, "up"]);
            // Fails when there is no qdisc to delete, which is the state wanted.
            let _ = self.ctl(&["netem", name, "off"]);
        }
    }

    fn ctl(&self, args: &[&str]) -> Output {
        Command::new(&self.script)
            .arg("ctl")
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("scripts/wire ctl {args:?}: {e}"))
    }

    fn ctl_ok(&self, args: &[&str]) {
        let out = self.ctl(args);
        assert!(
            out.status.success(),
            "scripts/wire ctl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts `cmd` on `host` as a background job; returns its name.
    pub fn spawn(&self, host: Host, cmd: &[&str]) -> String {
        let name = unique(
            Path::new(cmd[0])
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("job"),
        );
        let mut args = vec!["spawn", host.name(), &name, "--"];
        args.extend_from_slice(cmd);
        self.ctl_ok(&args);
        name
    }

    /// Waits up to `limit` for job `name` on `host` to end.
    pub fn wait(&self, host: Host, name: &str, limit: Duration) -> Job {
        let secs = limit.as_secs().max(1).to_string();
        let out = self.ctl(&["wait", host.name(), name, &secs]);
        let dir = self.job_dir(host, name);
        Job {
            status: out.status.code().unwrap_or(-1),
            stdout: std::fs::read_to_string(dir.join("out")).unwrap_or_default(),
            stderr: std::fs::read_to_string(dir.join("err")).unwrap_or_default(),
        }
    }

    /// The hosts of the running wire, from `scripts/wire ctl hosts` (a and b unless it
    /// was started with `--hosts 3` or `4`).
    pub fn hosts(&self) -> Vec<Host> {
        let out = self.ctl(&["hosts"]);
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|h| match h {
                "a" => Some(Host::A),
                "b" => Some(Host::B),
                "c" => Some(Host::C),
                "d" => Some(Host::D),
                _ => None,
            })
            .collect()
    }

    /// Whether job `name` on `host` has ended (its status is written).
    pub fn ended(&self, host: Host, name: &str) -> bool {
        self.job_dir(host, name).join("status").exists()
    }

    /// Runs `cmd` on `host` to its end (at most `limit`).
    pub fn run(&self, host: Host, cmd: &[&str], limit: Duration) -> Job {
        let name = self.spawn(host, cmd);
        self.wait(host, &name, limit)
    }

    /// A shell command line on `host`, which must exit 0; its stdout.
    pub fn sh(&self, host: Host, line: &str) -> String {
        self.run(host, &["bash", "-c", line], Duration::from_secs(120))
            .ok(line)
            .stdout
    }

    fn job_dir(&self, host: Host, name: &str) -> PathBuf {
        self.dir.join("jobs").join(host.name()).join(name)
    }

    /// What a job has printed on stdout so far.
    pub fn stdout_so_far(&self, host: Host, name: &str) -> String {
        std::fs::read_to_string(self.job_dir(host, name).join("out")).unwrap_or_default()
    }

    /// What a job has printed on stderr so far.
    pub fn stderr_so_far(&self, host: Host, name: &str) -> String {
        std::fs::read_to_string(self.job_dir(host, name).join("err")).unwrap_or_default()
    }

    /// Waits until a running job has printed a line containing `needle`.
    pub fn wait_for_output(&self, host: Host, name: &str, needle: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            if self.stdout_so_far(host, name).contains(needle) {
                return;
            }
            let dir = self.job_dir(host, name);
            if dir.join("status").exists() || Instant::now() > deadline {
                let job = self.wait(host, name, Duration::from_secs(1));
                panic!("{name} on {host:?} never printed {needle:?}: {job:#?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends `sig` (e.g. "TERM") to job `name`'s whole session.
    pub fn signal(&self, host: Host, name: &str, sig: &str) {
        self.ctl_ok(&["signal", host.name(), name, sig]);
    }

    /// SIGKILLs job `name`'s session if it still runs, ignoring failures (for `Drop`s,
    /// which must not panic while a failed test unwinds).
    pub fn kill_job_quietly(&self, host: Host, name: &str) {
        let _ = self.ctl(&["signal", host.name(), name, "KILL"]);
        let _ = self.ctl(&["wait", host.name(), name, "30"]);
    }

    /// `tc netem SPEC` on `host`'s NIC (egress), e.g. "loss 1% delay 2ms".
    pub fn netem(&self, host: Host, spec: &str) {
        let mut args = vec!["netem", host.name()];
        args.extend(spec.split_whitespace());
        self.ctl_ok(&args);
    }

    /// Removes `host`'s netem.
    pub fn netem_off(&self, host: Host) {
        self.ctl_ok(&["netem", host.name(), "off"]);
    }

    /// Carrier off (`false`) or on at `host`'s NIC: the cable pulled and put back.
    pub fn link(&self, host: Host, up: bool) {
        self.ctl_ok(&["link", host.name(), if up { "up" } else { "down" }]);
    }

    /// SIGKILLs `host`'s VM: no FIN, no DISCONNECT, nothing.
    pub fn kill(&self, host: Host) {
        self.ctl_ok(&["kill", host.name()]);
    }

    /// Boots `host` again (after [`kill`](Self::kill)) and waits until it takes jobs.
    pub fn boot(&self, host: Host) {
        self.ctl_ok(&["boot", host.name()]);
    }

    /// Where each thread of `host`'s rdmactor processes is (name, kernel wait channel and
    /// kernel stack): what a test prints when something on the host stopped moving, so a
    /// thread blocked in a verbs call shows which call.
    pub fn threads(&self, host: Host) -> String {
        const DUMP: &str = r#"for p in $(pgrep -f "^/[^ ]*/target/release/"); do
  echo "== process $p: $(tr '\0' ' ' </proc/$p/cmdline | cut -c1-120)"
  for t in /proc/$p/task/*; do
    echo "-- thread ${t##*/} $(cat $t/comm) wchan=$(cat $t/wchan 2>/dev/null)"
    cat $t/stack 2>/dev/null | head -12
  done
done
rdma resource show qp 2>&1 | head -40
rdma resource show cm_id 2>&1 | head -40"#;
        let job = self.run(host, &["bash", "-c", DUMP], Duration::from_secs(60));
        format!(
            "--- threads and resources on {host:?}\n{}{}",
            job.stdout, job.stderr
        )
    }

    /// `rdma resource show` on `host`.
    pub fn resources(&self, host: Host) -> ResourceCounts {
        ResourceCounts::parse(&self.sh(host, "rdma resource show"))
    }

    /// Waits until `host`'s counts of `kinds` equal `baseline`'s; how long that took.
    pub fn wait_resources(
        &self,
        host: Host,
        baseline: &ResourceCounts,
        kinds: &[&str],
        limit: Duration,
    ) -> Duration {
        let t = Instant::now();
        loop {
            let now = self.resources(host);
            let differ: Vec<String> = kinds
                .iter()
                .filter(|k| now.get(k) != baseline.get(k))
                .map(|k| format!("{k}: {} now {}", baseline.get(k), now.get(k)))
                .collect();
            if differ.is_empty() {
                return t.elapsed();
            }
            if t.elapsed() >= limit {
                panic!(
                    "{host:?}: resources not back to baseline after {limit:?}: {differ:?}\n{}",
                    self.threads(host)
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}
