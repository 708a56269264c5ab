//! For the package's own tests only (`rdmactor._testing`): a server of echo, files,
//! read and members on the loopback transport, inside the Python process, and contexts whose
//! clients use that transport. The loopback fabric is in-process, so a pytest run
//! reaches a real rdmactor server through the real client without an RDMA device,
//! as the C library's tests do; over verbs, tests/verbs/python_client.rs runs the
//! package against the `server` binary.
//!
//! Servers started here run until the process ends: a test process makes a few.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use pyo3::exceptions::{PyKeyError, PyRuntimeError};
use pyo3::prelude::*;
use rdmactor::runtime::{Client, NodeConfig, Server};
use rdmactor::transport::loopback::Loopback;
use rdmactor_c::api;
use rdmactor_c::runtime::Context as CContext;
use rdmactor_services::echo::{Discard, Echo};
use rdmactor_services::file_transfer::{Config, FileTransfer};
use rdmactor_services::members::{Member, MembersService, StaticDirectory};
use rdmactor_services::read::{ReadRegions, ReadService};
use tokio::sync::{mpsc, oneshot};

use crate::errors::to_py;
use crate::Context;

/// The static region every test server serves as `greeting`.
const GREETING: &[u8] = b"bytes of a region, read with one-sided READs";
/// `ticker`: this many 8-byte words, all equal to the update count, rewritten every
/// `TICK`: a torn read would show two different words.
const TICKER_WORDS: usize = 512;
const TICK: Duration = Duration::from_millis(2);

/// Loopback addresses are names on the in-process fabric (no packets leave it); each
/// server gets its own port.
static NEXT_PORT: AtomicU16 = AtomicU16::new(7450);

/// Each test server's question line, by address: a question is answered with the
/// count of connections it has open, from its own thread.
type Questions = mpsc::UnboundedSender<oneshot::Sender<usize>>;
static SERVERS: Mutex<Option<HashMap<SocketAddr, Questions>>> = Mutex::new(None);

/// Starts echo, discard, files (storing into `files_dir`) and read (`greeting`, static, and
/// `ticker`, updated every 2 ms) on the loopback fabric; returns the address.
#[pyfunction]
fn serve_loopback(py: Python<'_>, files_dir: PathBuf) -> PyResult<String> {
    let port = NEXT_PORT.fetch_add(1, Ordering::Relaxed);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    py.detach(move || start(addr, files_dir))
        .map_err(PyRuntimeError::new_err)?;
    Ok(addr.to_string())
}

/// How many connections the test server at `addr` has open now, as it counts them
/// (`Server::stats`): what a test waits on to see connections closed.
#[pyfunction]
fn server_connections(py: Python<'_>, addr: &str) -> PyResult<usize> {
    let addr: SocketAddr = addr
        .parse()
        .map_err(|e| PyKeyError::new_err(format!("{addr:?}: {e}")))?;
    let line = SERVERS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(|m| m.get(&addr).cloned())
        .ok_or_else(|| PyKeyError::new_err(format!("no test server at {addr}")))?;
    let (tx, rx) = oneshot::channel();
    line.send(tx)
        .map_err(|_| PyRuntimeError::new_err("the test server's thread ended"))?;
    py.detach(move || rx.blocking_recv())
        .map_err(|_| PyRuntimeError::new_err("the test server did not answer"))
}

fn start(addr: SocketAddr, dir: PathBuf) -> Result<(), String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (ask, mut questions) = mpsc::unbounded_channel::<oneshot::Sender<usize>>();
    SERVERS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(addr, ask);
    std::thread::Builder::new()
        .name("rdmactor-test-server".into())
        .spawn(move || {
            actix::System::new().block_on(async move {
                let regions = ReadRegions::<Loopback>::default();
                let started = (|| {
                    regions
                        .add_static("greeting", GREETING.to_vec())
                        .map_err(|e| e.to_string())?;
                    let ticker = regions
                        .add_buffer("ticker", vec![0; TICKER_WORDS * 8])
                        .map_err(|e| e.to_string())?;
                    let files = FileTransfer::new(Config::new(dir)).map_err(|e| e.to_string())?;
                    // Every test client is one peer: the asyncio test opens 100
                    // connections at once, past the default per-peer limit of 64.
                    let server = Server::over(Loopback)
                        .max_connections_per_peer(1024)
                        .listen(addr, None)
                        .service("echo", Echo)
                        .service("discard", Discard)
                        .service("files", files)
                        .service("read", ReadService::new(regions))
                        .handler("members", MembersService::new(DIRECTORY.clone()))
                        .start()
                        .map_err(|e| e.to_string())?;
                    Ok::<_, String>((server, ticker))
                })();
                let (server, ticker) = match started {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                std::thread::spawn(move || loop {
                    ticker.update(|n, buf| {
                        for word in buf.chunks_exact_mut(8) {
                            word.copy_from_slice(&n.to_le_bytes());
                        }
                    });
                    std::thread::sleep(TICK);
                });
                let _ = tx.send(Ok(()));
                // The line's sender stays in SERVERS: this runs until the process ends.
                while let Some(answer) = questions.recv().await {
                    let _ = answer.send(server.stats().await.connections);
                }
                drop(server);
            })
        })
        .map_err(|e| format!("spawning the test server's thread: {e}"))?;
    rx.recv()
        .unwrap_or_else(|_| Err("the test server's thread ended before it started".into()))
}

/// What every test server's `members` service answers: one list for all of them, as
/// a cluster's servers would agree on it.
static DIRECTORY: std::sync::LazyLock<StaticDirectory> =
    std::sync::LazyLock::new(StaticDirectory::new);

/// Sets the members every test server lists for `service`: `(node, "IP:PORT")` pairs,
/// in the order a client should try them (an address no test server listens on stands
/// for a node whose host died).
#[pyfunction]
fn set_members(service: &str, members: Vec<(String, String)>) -> PyResult<()> {
    let list = members
        .into_iter()
        .map(|(node, addr)| {
            let addr = addr
                .parse()
                .map_err(|e| PyKeyError::new_err(format!("{addr:?}: {e}")))?;
            Ok(Member {
                node,
                addr,
                connections: 0,
            })
        })
        .collect::<PyResult<Vec<_>>>()?;
    DIRECTORY.set(service, list);
    Ok(())
}

/// A context whose clients use the loopback transport: it reaches servers made by
/// `serve_loopback` in this process, and nothing else.
#[pyfunction]
fn loopback_context(py: Python<'_>) -> PyResult<Context> {
    let id = py
        .detach(|| {
            CContext::start(NodeConfig::default(), |c| Client::over(Loopback, c))
                .map(api::ctx_insert)
        })
        .map_err(to_py)?;
    Ok(Context { id })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(serve_loopback, m)?)?;
    m.add_function(wrap_pyfunction!(loopback_context, m)?)?;
    m.add_function(wrap_pyfunction!(server_connections, m)?)?;
    m.add_function(wrap_pyfunction!(set_members, m)?)?;
    Ok(())
}
