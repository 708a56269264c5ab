//! A real etcd for tests: `/usr/bin/etcd` (Debian's etcd-server, which scripts/setup
//! installs) on free loopback ports in a temporary directory, killed on drop. No mock:
//! the cluster's rules are etcd's (leases, watches, transactions). Shared by the cluster
//! crate's native tests and the VM test of `server --cluster`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One etcd member, a cluster of its own.
pub struct Etcd {
    dir: tempfile::TempDir,
    binary: PathBuf,
    client_port: u16,
    peer_port: u16,
    /// Where `/health` is asked: the client port, or with TLS a plain-HTTP metrics port
    /// (the client port then wants a client certificate).
    health_port: u16,
    /// With TLS and auth: the certificates' directory (see [`Etcd::start_secured`]).
    certs: Option<PathBuf>,
    child: Option<Child>,
}

/// The script that makes the certificates and roles, as docs/operations.md runs it.
fn secure_script() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/etcd-secure"
    ))
}

/// The etcd binary the tests run: `$RDMACTOR_ETCD`, else `/usr/bin/etcd`. Without one
/// this fails the test, saying to run scripts/setup, unless `RDMACTOR_SKIP_ETCD=1` asks
/// to skip (then it returns `None` and says so on stderr).
pub fn binary() -> Option<PathBuf> {
    let binary = std::env::var_os("RDMACTOR_ETCD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/etcd"));
    if binary.exists() {
        return Some(binary);
    }
    if std::env::var("RDMACTOR_SKIP_ETCD").as_deref() == Ok("1") {
        eprintln!(
            "SKIPPED: no etcd at {} and RDMACTOR_SKIP_ETCD=1",
            binary.display()
        );
        return None;
    }
    panic!(
        "no etcd at {}: run scripts/setup (it installs Debian's etcd-server), point \
         RDMACTOR_ETCD at an etcd binary, or set RDMACTOR_SKIP_ETCD=1 to skip the etcd tests",
        binary.display()
    );
}

/// Runs scripts/etcd-secure with `args`, failing the test with its output if it fails.
fn run_script(args: &[&std::ffi::OsStr]) {
    let out = Command::new(secure_script())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", secure_script().display()));
    assert!(
        out.status.success(),
        "scripts/etcd-secure {args:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

impl Etcd {
    /// Starts etcd and waits until it is healthy. Without an etcd binary this fails
    /// the test, saying to run scripts/setup, unless `RDMACTOR_SKIP_ETCD=1` asks to
    /// skip (then it returns `None` and says so on stderr).
    pub fn start() -> Option<Etcd> {
        Etcd::start_with(false)
    }

    /// Starts an etcd closed as docs/operations.md ("A closed control plane") closes
    /// it, with `scripts/etcd-secure` run as written there: TLS with client certificates
    /// (`--client-cert-auth`), the users root, rdmactor-server and rdmactor-client, their
    /// roles for `cluster`, and auth on. [`cert`](Self::cert) gives each user's files.
    pub fn start_secured(cluster: &str) -> Option<Etcd> {
        let etcd = Etcd::start_with(true)?;
        let certs = etcd.certs.clone().expect("made at start");
        run_script(&[
            "roles".as_ref(),
            etcd.url().as_ref(),
            certs.as_os_str(),
            cluster.as_ref(),
        ]);
        Some(etcd)
    }

    /// `user`'s certificate and key, and the CA's certificate: `(ca, cert, key)`.
    ///
    /// # Panics
    ///
    /// Not started with [`start_secured`](Self::start_secured).
    pub fn cert(&self, user: &str) -> (PathBuf, PathBuf, PathBuf) {
        let dir = self.certs.as_ref().expect("an etcd started secured");
        (
            dir.join("ca.pem"),
            dir.join(format!("{user}.pem")),
            dir.join(format!("{user}.key")),
        )
    }

    fn start_with(secured: bool) -> Option<Etcd> {
        let binary = binary()?;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let certs = secured.then(|| {
            let certs = dir.path().join("certs");
            run_script(&[
                "certs".as_ref(),
                certs.as_os_str(),
                "127.0.0.1".as_ref(),
                "localhost".as_ref(),
            ]);
            certs
        });
        let client_port = free_port();
        let mut etcd = Etcd {
            dir,
            binary,
            client_port,
            peer_port: free_port(),
            health_port: if secured { free_port() } else { client_port },
            certs,
            child: None,
        };
        // A free port is only free until someone else binds it: the tests start their
        // etcds in parallel, and a port handed out here can be taken before etcd binds
        // it. Then etcd exits at once saying so, and it is started again on new ports.
        for _ in 0..4 {
            match etcd.try_spawn() {
                Ok(()) => return Some(etcd),
                Err(log) if log.contains("address already in use") => {
                    let _ = std::fs::remove_dir_all(etcd.dir.path().join("data"));
                    etcd.client_port = free_port();
                    etcd.peer_port = free_port();
                    etcd.health_port = if etcd.certs.is_some() {
                        free_port()
                    } else {
                        etcd.client_port
                    };
                }
                Err(log) => panic!("etcd exited:\n{log}"),
            }
        }
        etcd.spawn();
        Some(etcd)
    }

    /// The client URL (`https://` when secured).
    pub fn url(&self) -> String {
        let scheme = if self.certs.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// SIGKILL, and wait for the process to end.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same data directory and ports.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    fn spawn(&mut self) {
        if let Err(log) = self.try_spawn() {
            panic!("etcd exited:\n{log}");
        }
    }

    /// Starts the process and waits until it is healthy; `Err` with its log's tail when
    /// it exited first.
    fn try_spawn(&mut self) -> Result<(), String> {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("etcd.log"))
            .expect("etcd's log file");
        let mut command = Command::new(&self.binary);
        if let Some(certs) = &self.certs {
            command
                .arg("--client-cert-auth")
                .arg(format!(
                    "--trusted-ca-file={}",
                    certs.join("ca.pem").display()
                ))
                .arg(format!("--cert-file={}", certs.join("etcd.pem").display()))
                .arg(format!("--key-file={}", certs.join("etcd.key").display()))
                .arg(format!(
                    "--listen-metrics-urls=http://127.0.0.1:{}",
                    self.health_port
                ));
        }
        let child = command
            .arg("--name=test")
            .arg(format!(
                "--data-dir={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!("--listen-client-urls={}", self.url()))
            .arg(format!("--advertise-client-urls={}", self.url()))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=test={peer}"))
            .arg("--log-level=warn")
            .env_remove("ETCD_NAME")
            .env_remove("ETCD_DATA_DIR")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.binary.display()));
        self.child = Some(child);
        self.wait_healthy()
    }

    fn wait_healthy(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if self.healthy() {
                return Ok(());
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(format!("{status}:\n{}", self.log_tail()));
            }
            if Instant::now() > deadline {
                panic!("etcd not healthy after 20 s:\n{}", self.log_tail());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `GET /health` answers `"health":"true"` once it has a leader.
    fn healthy(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.health_port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
        let request = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
        if stream.write_all(request.as_bytes()).is_err() {
            return false;
        }
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer.contains("\"health\":\"true\"")
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `start` retries on: etcd on a port somebody else holds exits at once, and
    /// its log says the address is in use.
    #[test]
    fn a_taken_port_is_reported_as_in_use() {
        let Some(binary) = binary() else { return };
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let client_port = free_port();
        let mut etcd = Etcd {
            dir: tempfile::tempdir().unwrap(),
            binary,
            client_port,
            peer_port: taken.local_addr().unwrap().port(),
            health_port: client_port,
            certs: None,
            child: None,
        };
        let log = etcd.try_spawn().expect_err("the peer port is taken");
        assert!(log.contains("address already in use"), "{log}");
        drop(taken);
        etcd.peer_port = free_port();
        etcd.try_spawn().expect("etcd on free ports");
        assert!(etcd.healthy());
    }
}
