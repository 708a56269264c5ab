//! Three etcd members on loopback whose peer traffic runs through proxies that can cut
//! one member off from the other two, while clients still reach all three: a member
//! without quorum, as on the wire when its host is partitioned from the majority (but
//! the client's own path to it stays open, which is the harder case for a client: the
//! member answers, and what it answers is not current).
//!
//! How one member is isolated on one host: each member listens for peers on its own
//! port but advertises a proxy's (`--initial-advertise-peer-urls`, and the same URL in
//! every member's `--initial-cluster`), so every peer connection to a member goes
//! through that member's proxy. A proxy cannot tell a connection's sender by its
//! address (every connection comes from 127.0.0.1), but etcd's peer requests carry the
//! sender's advertised peer URLs in an `X-PeerURLs` header (raft streams and pipeline
//! posts alike), which the proxy reads from the first request of each connection. Cut
//! member k: k's proxy drops every connection, and the other proxies drop those whose
//! sender is k, or cannot be told (a probe's connection, which Go may later reuse for
//! pipeline posts); connections already open are shut down the same way. Streams are
//! dialled by their reader, so dropping every connection k opens and every connection
//! into k stops raft messages both ways.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// No member is cut off.
const NONE: usize = usize::MAX;

/// Three etcd members (0, 1, 2), killed on drop.
pub struct Trio {
    dir: tempfile::TempDir,
    client_ports: [u16; 3],
    proxy_ports: [u16; 3],
    children: Vec<Child>,
    cut: Arc<Cut>,
}

/// A connection let through: to member, from member if known, the two sockets.
type Spliced = (usize, Option<usize>, TcpStream, TcpStream);

/// The proxies' shared state: who is cut off, and the connections open.
struct Cut {
    isolated: AtomicUsize,
    stop: AtomicBool,
    open: Mutex<Vec<Spliced>>,
    proxy_urls: [String; 3],
}

impl Cut {
    /// Whether a connection to member `to` from `from` is to be dropped now.
    fn drops(&self, to: usize, from: Option<usize>) -> bool {
        let k = self.isolated.load(Ordering::Acquire);
        k != NONE && (to == k || from.is_none_or(|f| f == k))
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

impl Trio {
    /// Starts three members with their proxies and waits until all three are healthy
    /// (`None`, said on stderr, without an etcd binary and `RDMACTOR_SKIP_ETCD=1`).
    ///
    /// A free port is only free until someone else binds it (the tests start etcds in
    /// parallel): a member that exits saying its address is in use has the three
    /// started again on new ports, as the single-member fixture does.
    pub fn start() -> Option<Trio> {
        let binary = rdmactor_testkit::etcd::binary()?;
        for _ in 0..4 {
            match Trio::try_start(&binary) {
                Ok(trio) => return Some(trio),
                Err(log) => eprintln!("etcd trio: a port was taken; starting again:\n{log}"),
            }
        }
        panic!("etcd trio: ports taken four times over");
    }

    /// One attempt of [`start`](Self::start): `Err` with the logs if a member could not
    /// bind its ports.
    fn try_start(binary: &std::path::Path) -> Result<Trio, String> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let client_ports = [free_port(), free_port(), free_port()];
        let peer_ports = [free_port(), free_port(), free_port()];
        let listeners: Vec<TcpListener> = (0..3)
            .map(|_| TcpListener::bind("127.0.0.1:0").expect("a proxy port"))
            .collect();
        let proxy_ports: [u16; 3] =
            std::array::from_fn(|i| listeners[i].local_addr().expect("proxy port").port());
        let proxy_urls = proxy_ports.map(|p| format!("http://127.0.0.1:{p}"));
        let cut = Arc::new(Cut {
            isolated: AtomicUsize::new(NONE),
            stop: AtomicBool::new(false),
            open: Mutex::new(Vec::new()),
            proxy_urls: proxy_urls.clone(),
        });
        for (to, listener) in listeners.into_iter().enumerate() {
            let (cut, peer_port) = (cut.clone(), peer_ports[to]);
            std::thread::spawn(move || proxy(listener, to, peer_port, &cut));
        }
        let initial: Vec<String> = (0..3).map(|i| format!("m{i}={}", proxy_urls[i])).collect();
        let mut children = Vec::new();
        for i in 0..3 {
            let client = format!("http://127.0.0.1:{}", client_ports[i]);
            let log = std::fs::File::create(dir.path().join(format!("m{i}.log"))).expect("log");
            let child = Command::new(binary)
                .arg(format!("--name=m{i}"))
                .arg(format!(
                    "--data-dir={}",
                    dir.path().join(format!("m{i}")).display()
                ))
                .arg(format!("--listen-client-urls={client}"))
                .arg(format!("--advertise-client-urls={client}"))
                .arg(format!(
                    "--listen-peer-urls=http://127.0.0.1:{}",
                    peer_ports[i]
                ))
                .arg(format!("--initial-advertise-peer-urls={}", proxy_urls[i]))
                .arg(format!("--initial-cluster={}", initial.join(",")))
                .arg("--initial-cluster-state=new")
                .arg("--initial-cluster-token=rdmactor-trio")
                .arg("--log-level=warn")
                .env_remove("ETCD_NAME")
                .env_remove("ETCD_DATA_DIR")
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
            children.push(child);
        }
        let mut trio = Trio {
            dir,
            client_ports,
            proxy_ports,
            children,
            cut,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !(0..3).all(|i| trio.healthy(i)) {
            let exited = trio
                .children
                .iter_mut()
                .any(|c| c.try_wait().ok().flatten().is_some());
            if exited {
                let logs = trio.logs();
                assert!(
                    logs.contains("address already in use"),
                    "an etcd member of the trio exited:\n{logs}"
                );
                return Err(logs);
            }
            assert!(
                Instant::now() < deadline,
                "etcd trio not healthy after 30 s:\n{}",
                trio.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(trio)
    }

    /// Member `i`'s client URL.
    pub fn url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.client_ports[i])
    }

    /// Member `i`'s advertised peer URL (its proxy).
    pub fn peer_url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.proxy_ports[i])
    }

    /// Cuts member `k` off from the other two: no raft message between them either way
    /// from now on. Clients reach all three as before.
    pub fn isolate(&self, k: usize) {
        self.cut.isolated.store(k, Ordering::Release);
        let mut open = self.cut.open.lock().unwrap();
        open.retain(|(to, from, a, b)| {
            if self.cut.drops(*to, *from) {
                let _ = a.shutdown(Shutdown::Both);
                let _ = b.shutdown(Shutdown::Both);
                false
            } else {
                true
            }
        });
    }

    /// Lets every member reach every other again.
    pub fn heal(&self) {
        self.cut.isolated.store(NONE, Ordering::Release);
    }

    /// `GET /health` on member `i` answers `"health":"true"` (it has a leader and
    /// answers a linearizable read).
    pub fn healthy(&self, i: usize) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.client_ports[i])) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        if stream
            .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .is_err()
        {
            return false;
        }
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer.contains("\"health\":\"true\"")
    }

    /// The members' log tails.
    pub fn logs(&self) -> String {
        (0..3)
            .map(|i| {
                let log = std::fs::read_to_string(self.dir.path().join(format!("m{i}.log")))
                    .unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                format!(
                    "--- m{i}:\n{}",
                    lines[lines.len().saturating_sub(15)..].join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Trio {
    fn drop(&mut self) {
        self.cut.stop.store(true, Ordering::Release);
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for (_, _, a, b) in self.cut.open.lock().unwrap().drain(..) {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
        // Wake the accept loops so that they see `stop`.
        for port in self.proxy_ports {
            let _ = TcpStream::connect(("127.0.0.1", port));
        }
    }
}

/// Member `to`'s proxy: forwards to its peer port what the cut lets through.
fn proxy(listener: TcpListener, to: usize, peer_port: u16, cut: &Arc<Cut>) {
    for inbound in listener.incoming() {
        if cut.stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(inbound) = inbound else { continue };
        let cut = cut.clone();
        std::thread::spawn(move || forward(inbound, to, peer_port, &cut));
    }
}

/// Reads the first request's head to learn the sender, then splices both ways.
fn forward(mut inbound: TcpStream, to: usize, peer_port: u16, cut: &Cut) {
    let _ = inbound.set_read_timeout(Some(Duration::from_secs(5)));
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
        match inbound.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let _ = inbound.set_read_timeout(None);
    let from = sender(&head, &cut.proxy_urls);
    let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", peer_port)) else {
        return;
    };
    {
        // Decided under the lock `isolate` takes, so that no connection slips past a cut.
        let mut open = cut.open.lock().unwrap();
        if cut.drops(to, from) {
            return;
        }
        if outbound.write_all(&head).is_err() {
            return;
        }
        let (Ok(a), Ok(b)) = (inbound.try_clone(), outbound.try_clone()) else {
            return;
        };
        open.push((to, from, a, b));
    }
    let (Ok(mut in2), Ok(mut out2)) = (inbound.try_clone(), outbound.try_clone()) else {
        return;
    };
    let back = std::thread::spawn(move || {
        let _ = std::io::copy(&mut out2, &mut in2);
        let _ = in2.shutdown(Shutdown::Write);
    });
    let _ = std::io::copy(&mut inbound, &mut outbound);
    let _ = outbound.shutdown(Shutdown::Write);
    let _ = back.join();
}

/// The member whose advertised peer URL the request head's `X-PeerURLs` names.
fn sender(head: &[u8], proxy_urls: &[String; 3]) -> Option<usize> {
    let head = String::from_utf8_lossy(head);
    let value = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("x-peerurls")
            .then(|| value.trim().to_owned())
    })?;
    value
        .split(',')
        .find_map(|url| proxy_urls.iter().position(|p| p == url.trim()))
}
