//! A context's runtime: one thread running an actix System, where the Rust client
//! lives, fed commands over a channel; and the queue and eventfd its completions go to.
//!
//! C callers are plain threads, and the framework's client needs an actix System for
//! its actors and timers. Each context owns one such thread (not one per process): a
//! context is the unit of shutdown, and freeing it stops everything it started.
//! Calls that only hand a message to a connection and wait for its answer (request,
//! send, read) do not go through this thread when they block: the connection's actor
//! answers the caller's thread directly (`block.rs`), one hop fewer per round trip.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use futures::future::LocalBoxFuture;
use futures::FutureExt as _;
use rdmactor::runtime::{Client, ClientError, Credential, NodeConfig};
use rdmactor::transport::Transport;
use rdmactor_services::members;
use tokio::sync::mpsc;

use crate::link::{Conn, Link};
use crate::status::{Failure, Result, RDMACTOR_BUSY, RDMACTOR_INTERNAL, RDMACTOR_SHUTTING_DOWN};

/// Operations of one context submitted and not yet polled: past this, submits answer
/// BUSY, so a caller that never polls cannot grow the queue without bound.
pub(crate) const MAX_IN_FLIGHT: usize = 65_536;

/// Work for the runtime thread: builds its future there, where the client lives.
type Job = Box<dyn FnOnce(Rc<dyn Engine>) -> LocalBoxFuture<'static, ()> + Send>;

enum Command {
    Run(Job),
    /// Close the connections of context `ctx` (this one's id), shut the clients down,
    /// stop the thread. Done here, on the thread where connects insert their handles,
    /// so that no connect finishing meanwhile escapes the sweep.
    Shutdown {
        ctx: u64,
    },
}

/// The runtime thread's side of a context, behind a trait so that the rest of the
/// library is not generic over the transport.
pub trait Engine {
    /// Connects with the client of `key` (a client per key file: the framework proves
    /// one credential per client).
    fn connect(
        &self,
        addr: SocketAddr,
        service: String,
        key: Option<PathBuf>,
    ) -> LocalBoxFuture<'static, Result<Arc<dyn Link>>>;
    /// Connects to `service` on a server of the cluster that `seeds` know: asks their
    /// `members` service, then the members in order, each connect bounded by `dial`
    /// (`rdmactor_services::members::connect_via`).
    fn connect_via(
        &self,
        seeds: Vec<SocketAddr>,
        service: String,
        key: Option<PathBuf>,
        dial: Duration,
    ) -> LocalBoxFuture<'static, Result<Arc<dyn Link>>>;
    /// True once the context is being freed: a connect that finishes now is closed,
    /// not handed out.
    fn closing(&self) -> bool;
}

struct State<T: Transport> {
    config: NodeConfig,
    start: fn(NodeConfig) -> Result<Client<T>, ClientError>,
    /// The anonymous client (`None`) and one per key file used.
    clients: std::cell::RefCell<HashMap<Option<PathBuf>, Arc<Client<T>>>>,
    closing: Cell<bool>,
}

impl<T: Transport> State<T> {
    fn client(&self, key: Option<PathBuf>) -> Result<Arc<Client<T>>> {
        if let Some(c) = self.clients.borrow().get(&key) {
            return Ok(c.clone());
        }
        let mut client = (self.start)(self.config.clone())?;
        if let Some(path) = &key {
            client = client.with_identity(Credential::load(path)?);
        }
        let client = Arc::new(client);
        self.clients.borrow_mut().insert(key, client.clone());
        Ok(client)
    }

    async fn shutdown(&self) {
        self.closing.set(true);
        let clients: Vec<_> = self.clients.borrow_mut().drain().map(|(_, c)| c).collect();
        for client in clients {
            // A connection handle still held elsewhere keeps its client: then the
            // client goes when that handle does, its actors with this System.
            if let Ok(client) = Arc::try_unwrap(client) {
                client.shutdown().await;
            }
        }
    }
}

impl<T: Transport> Engine for State<T> {
    fn connect(
        &self,
        addr: SocketAddr,
        service: String,
        key: Option<PathBuf>,
    ) -> LocalBoxFuture<'static, Result<Arc<dyn Link>>> {
        let client = self.client(key);
        async move {
            let client = client?;
            let conn = client.connect(addr, &service).await?;
            Ok(Arc::new(Conn::new(conn, client)) as Arc<dyn Link>)
        }
        .boxed_local()
    }

    fn connect_via(
        &self,
        seeds: Vec<SocketAddr>,
        service: String,
        key: Option<PathBuf>,
        dial: Duration,
    ) -> LocalBoxFuture<'static, Result<Arc<dyn Link>>> {
        let client = self.client(key);
        async move {
            let client = client?;
            let got = members::connect_via(&client, &seeds, &service, dial).await?;
            Ok(Arc::new(Conn::new(got.connection, client)) as Arc<dyn Link>)
        }
        .boxed_local()
    }

    fn closing(&self) -> bool {
        self.closing.get()
    }
}

/// One finished operation, waiting to be polled.
pub struct Done {
    pub op: u64,
    pub user_data: u64,
    /// The connection it ran on, or the one a connect made.
    pub conn: u64,
    pub result: Result<Output>,
    /// Where `rdmactor_poll_completions` copies a reply: the caller's buffer given at
    /// submit, as an address and a capacity (dereferenced only there, in `ffi/`).
    pub dest: (usize, usize),
}

#[derive(Debug)]
pub enum Output {
    Nothing,
    Bytes(Vec<u8>),
    /// A region's bytes and their version.
    Region {
        data: Vec<u8>,
        version: u64,
    },
    /// A region longer than the buffer given: the length it needs (nothing was read).
    RegionTooSmall {
        needed: usize,
    },
    /// A file transfer's outcome; `dest` is where its `rdmactor_file_result` goes.
    File(crate::link::Transfer),
}

/// The completion queue and its eventfd, readable exactly while the queue holds
/// something: both change under the queue's lock, so a push cannot slip between a
/// poll's last pop and its reset of the fd.
pub struct Completions {
    queue: Mutex<VecDeque<Done>>,
    fd: OwnedFd,
    in_flight: AtomicUsize,
}

impl Completions {
    fn new() -> Result<Completions> {
        use rustix::event::{eventfd, EventfdFlags};
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| Failure::new(crate::status::RDMACTOR_IO, format!("eventfd: {e}")))?;
        Ok(Completions {
            queue: Mutex::new(VecDeque::new()),
            fd,
            in_flight: AtomicUsize::new(0),
        })
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Counts an operation in, or refuses it past `MAX_IN_FLIGHT` (65,536).
    pub fn admit(&self) -> Result<()> {
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        if before >= MAX_IN_FLIGHT {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(Failure::new(
                RDMACTOR_BUSY,
                format!(
                    "{MAX_IN_FLIGHT} operations in flight on this context: poll completions first"
                ),
            ));
        }
        Ok(())
    }

    /// An admitted operation that was never started (its submit failed after
    /// admission).
    pub fn release(&self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    pub fn push(&self, done: Done) {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        queue.push_back(done);
        if queue.len() == 1 {
            // EAGAIN only at a counter of 2^64 - 2, which one write per empty-to-
            // non-empty edge never reaches.
            let _ = rustix::io::write(self.fd.as_fd(), &1u64.to_ne_bytes());
        }
    }

    /// Up to `max` completions, oldest first.
    pub fn pop(&self, max: usize) -> Vec<Done> {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let n = max.min(queue.len());
        let out: Vec<Done> = queue.drain(..n).collect();
        if queue.is_empty() && n > 0 {
            let mut counter = [0u8; 8];
            let _ = rustix::io::read(self.fd.as_fd(), &mut counter);
        }
        self.in_flight.fetch_sub(out.len(), Ordering::AcqRel);
        out
    }
}

/// What a context handle stands for.
pub struct Context {
    commands: mpsc::UnboundedSender<Command>,
    thread: Mutex<Option<JoinHandle<()>>>,
    pub completions: Arc<Completions>,
    next_op: AtomicU64,
}

impl Context {
    /// Starts a context on verbs (the device rdma_cm routes to, opened on the first
    /// connect).
    pub fn start_verbs() -> Result<Context> {
        Context::start(NodeConfig::default(), Client::start)
    }

    /// Starts a context whose clients `start` makes: `Client::start` on verbs, or
    /// `Client::over(Loopback, ..)` in the crate's tests.
    pub fn start<T: Transport>(
        config: NodeConfig,
        start: fn(NodeConfig) -> Result<Client<T>, ClientError>,
    ) -> Result<Context> {
        let completions = Arc::new(Completions::new()?);
        let (commands, mut rx) = mpsc::unbounded_channel::<Command>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
        let thread = std::thread::Builder::new()
            .name("rdmactor-ctx".into())
            .spawn(move || {
                actix::System::new().block_on(async move {
                    let state = Rc::new(State {
                        config,
                        start,
                        clients: Default::default(),
                        closing: Cell::new(false),
                    });
                    // The anonymous client now, so that a device that cannot be
                    // opened fails the context's creation, not its first connect.
                    let _ = ready_tx.send(state.client(None).map(drop));
                    while let Some(command) = rx.recv().await {
                        match command {
                            Command::Run(job) => {
                                let fut = job(state.clone() as Rc<dyn Engine>);
                                actix::spawn(fut);
                            }
                            Command::Shutdown { ctx } => {
                                state.closing.set(true);
                                crate::tables::close_connections_of(ctx).await;
                                break;
                            }
                        }
                    }
                    state.shutdown().await;
                });
            })
            .map_err(|e| {
                Failure::new(
                    RDMACTOR_INTERNAL,
                    format!("spawning the runtime thread: {e}"),
                )
            })?;
        let ready = ready_rx.recv().unwrap_or_else(|_| {
            Err(Failure::new(
                RDMACTOR_INTERNAL,
                "the runtime thread ended before it started",
            ))
        });
        let ctx = Context {
            commands,
            thread: Mutex::new(Some(thread)),
            completions,
            next_op: AtomicU64::new(1),
        };
        if let Err(e) = ready {
            ctx.stop(0);
            return Err(e);
        }
        Ok(ctx)
    }

    pub fn next_op(&self) -> u64 {
        self.next_op.fetch_add(1, Ordering::Relaxed)
    }

    /// Runs `job` on the runtime thread. Its future is caught if it panics (reported as
    /// the runtime thread's failure through whatever the job was to answer).
    pub fn run(
        &self,
        job: impl FnOnce(Rc<dyn Engine>) -> LocalBoxFuture<'static, ()> + Send + 'static,
    ) -> Result<()> {
        let job: Job = Box::new(move |engine| {
            std::panic::AssertUnwindSafe(job(engine))
                .catch_unwind()
                .map(drop)
                .boxed_local()
        });
        self.commands
            .send(Command::Run(job))
            .map_err(|_| Failure::new(RDMACTOR_SHUTTING_DOWN, "the context is shutting down"))
    }

    /// Runs `make`'s future on the runtime thread under `timeout` and waits for its
    /// result on this thread. A panic in it, or a runtime gone, is `INTERNAL` /
    /// `SHUTTING_DOWN`, never a hang.
    pub fn block<R: Send + 'static>(
        &self,
        timeout: Option<Duration>,
        what: &'static str,
        make: impl FnOnce(Rc<dyn Engine>) -> LocalBoxFuture<'static, Result<R>> + Send + 'static,
    ) -> Result<R> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.run(move |engine| {
            let fut = with_timeout(make(engine), timeout, what);
            async move {
                let _ = tx.send(fut.await);
            }
            .boxed_local()
        })?;
        rx.recv().unwrap_or_else(|_| {
            Err(Failure::new(
                RDMACTOR_INTERNAL,
                format!("{what}: the runtime thread dropped the operation (it panicked, or the context was freed)"),
            ))
        })
    }

    /// Stops the runtime thread and waits for it: the connections of context `id`
    /// closed, the clients shut down. Idempotent.
    pub fn stop(&self, id: u64) {
        let _ = self.commands.send(Command::Shutdown { ctx: id });
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(thread) = thread {
            // The thread's own panic was the System's; nothing more to report here.
            let _ = thread.join();
        }
    }

    /// Tells the runtime thread to close the connections of context `id` and stop, and
    /// returns at once: the thread is detached and ends when its shutdown is done.
    pub fn stop_in_background(&self, id: u64) {
        let _ = self.commands.send(Command::Shutdown { ctx: id });
        drop(self.thread.lock().unwrap_or_else(|p| p.into_inner()).take());
    }
}

/// `fut`, or TIMEOUT once `timeout` has passed (`None`: no limit). Dropping the future
/// abandons the operation: a connect is given up and its resources released, a reply
/// that comes later is discarded.
pub async fn with_timeout<R>(
    fut: impl std::future::Future<Output = Result<R>>,
    timeout: Option<Duration>,
    what: &str,
) -> Result<R> {
    match timeout {
        None => fut.await,
        Some(t) => match tokio::time::timeout(t, fut).await {
            Ok(r) => r,
            Err(_) => Err(Failure::new(
                crate::status::RDMACTOR_TIMEOUT,
                format!("{what}: no result within {} ms", t.as_millis()),
            )),
        },
    }
}
