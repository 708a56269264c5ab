//! The demo's server: every service behind one CM actor, the `read` service's live
//! region and the thread that keeps it changing, and the one identity it knows
//! (`demo-user`, whose key it makes at start) for its authenticated-only `whoami`.

use std::io::Write as _;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context as _, Result};
use rdmactor::runtime::{
    Credential, Identity, Keys, NodeConfig, RequestCx, RequestHandler, Server,
};
#[cfg(feature = "cluster")]
use rdmactor_cluster::{Registrar, RegistrationConfig};
use rdmactor_services::echo::Echo;
use rdmactor_services::file_transfer::{Config as FilesConfig, FileTransfer};
use rdmactor_services::ingest::{IngestConfig, IngestService, Record};
use rdmactor_services::lambda::{
    checksum_native, LambdaConfig, LambdaService, NativeLambdas, Sandbox,
};
use rdmactor_services::read::layout::FIRST_VERSION;
use rdmactor_services::read::{ReadRegions, ReadService, RegionWriter};
use rdmactor_services::rping::Rping;

use crate::Args;

/// The services `demo --serve --cluster` registers (rping has a port of its own, which
/// `demo --cluster` takes from `--rping-port`).
#[cfg(feature = "cluster")]
const DEMO_SERVICES: [&str; 5] = ["echo", "files", "read", "lambda", "ingest"];

/// Every service the demo served before it authenticated, open to anonymous clients on
/// purpose: its steps, `demo --server` clients on another host and the cluster's clients
/// reach them without a key, as they always did. Only `whoami` asks for one.
const ANONYMOUS: [&str; 6] = ["echo", "rping", "files", "read", "lambda", "ingest"];

/// The one identity in the demo server's authorized keys.
pub const DEMO_USER: &str = "demo-user";

/// The ID whose secret the demo's upload earns: the `files` service releases a secret
/// only to the connection whose GOOD upload created the file of that name.
pub const ID: &str = "report.bin";
/// The secret the operator configured for [`ID`].
pub const SECRET: &str = "the-cake-is-a-lie";
/// The live region: `WORDS` little-endian u64 words, all equal to `version / 2`.
pub const WORDS: usize = 512;

/// The demo's server: every service behind one CM actor, and the thread that keeps the
/// `read` service's live region changing.
pub struct DemoServer {
    server: Server,
    updater: Updater,
    /// `demo --serve --cluster`: the server's registration in etcd.
    #[cfg(feature = "cluster")]
    registrar: Option<Registrar>,
    /// Where the `files` service stores uploads.
    pub store: PathBuf,
    /// `demo-user`'s credential: the only key `whoami` takes.
    pub user: Credential,
}

impl DemoServer {
    /// `public_fetch`: any client may fetch any stored file (a client on another host
    /// fetches its upload back on a new connection to compare it). `work` gets the
    /// server's authorized keys file and `demo-user`'s key file.
    pub async fn start(
        args: &Args,
        config: NodeConfig,
        work: &Path,
        store: PathBuf,
        public_fetch: bool,
    ) -> Result<Self> {
        std::fs::create_dir_all(&store).with_context(|| format!("creating {}", store.display()))?;
        let (user, keys) = make_keys(work)?;
        let regions = ReadRegions::new();
        let live = regions.add_buffer_with_copies(
            "live",
            (FIRST_VERSION / 2).to_le_bytes().repeat(WORDS),
            64,
        )?;
        let addr = SocketAddr::new(args.ip, args.port);
        let rping_addr = SocketAddr::new(args.ip, args.rping_port);
        let files = FilesConfig::new(&store)
            .with_secret(ID, SECRET)
            .with_public_fetch(public_fetch);
        let server = Server::builder()
            .config(config)
            .listen(addr, None)
            .listen(rping_addr, Some("rping"))
            .max_connections(1024)
            // Every client of the demo runs on one host (two in --serve mode): no cap per
            // address, or its 100 echo clients would pass the default of 64.
            .max_connections_per_peer(0)
            .service("echo", Echo)
            .service("rping", Rping::default())
            .service("files", FileTransfer::new(files)?)
            .service("read", ReadService::new(regions.clone()))
            .service("lambda", lambda_service())
            .service(
                "ingest",
                IngestService::new(IngestConfig::default(), Arc::new(|_: Record| {})),
            )
            .handler("whoami", WhoAmI)
            .authorized_keys(
                Keys::load(&keys).with_context(|| format!("loading {}", keys.display()))?,
            );
        let server = ANONYMOUS
            .iter()
            .fold(server, |server, name| server.anonymous(name))
            .start()
            .context("starting the server (is there an RDMA device? run scripts/demo)")?;
        // Register the read regions now, on this thread, not on the poller at first lookup.
        let pd = server
            .protection_domain()
            .await
            .context("the RDMA device went right after start")?;
        regions.register_all(&pd)?;
        drop(pd);
        println!(
            "server: echo, files, read, lambda, ingest, whoami ({DEMO_USER} only) on {addr}; \
             rping on {rping_addr} (pid {})",
            std::process::id()
        );
        if args.serve {
            // For the clients on another host: their identity step needs this key.
            println!(
                "server: {DEMO_USER}'s key is {} (for `demo --server {} --key FILE` elsewhere)",
                work.join(KEY_FILE).display(),
                args.ip
            );
        }
        let updater = Updater::start(live);
        #[cfg(feature = "cluster")]
        let registrar = match args.cluster.etcd()? {
            Some((cluster, etcd)) if args.serve => {
                let node = addr.to_string();
                let config = RegistrationConfig::new(&cluster, &node, addr, DEMO_SERVICES);
                println!("cluster: registering node {node} in {cluster}");
                Some(Registrar::start(etcd, config).context("--cluster")?)
            }
            _ => None,
        };
        Ok(DemoServer {
            server,
            updater,
            #[cfg(feature = "cluster")]
            registrar,
            store,
            user,
        })
    }

    /// Shuts down (every connection closed, everything released) and says what was served.
    pub async fn stop(self) {
        // Out of the registry first (draining, then gone), so clients stop picking it.
        #[cfg(feature = "cluster")]
        if let Some(registrar) = self.registrar {
            match registrar.withdraw().await {
                Ok(()) => println!("cluster: withdrawn"),
                Err(err) => {
                    eprintln!("cluster: withdraw: {err} (the lease expires within its TTL)")
                }
            }
        }
        let updates = self.updater.stop();
        let stats = self.server.stats().await;
        self.server.shutdown().await;
        println!(
            "server: {} connections accepted, {} rejected, {} closed; the live region was \
             updated {updates} times; shut down cleanly",
            stats.accepted, stats.rejected, stats.closed,
        );
    }
}

/// `demo-user`'s key file in the work directory (for `demo --server .. --key` on another
/// host: copy it there).
const KEY_FILE: &str = "demo-user.key";

/// A fresh Ed25519 key for `demo-user`: its key file (mode 0600, as `keygen` writes one)
/// and the authorized keys file holding its public half, both in `work`. Returns the
/// credential and the authorized keys file's path. A new key every start: no secret of
/// the demo's is ever shipped or reused.
fn make_keys(work: &Path) -> Result<(Credential, PathBuf)> {
    let user = Credential::generate_ed25519(DEMO_USER).context("making demo-user's key")?;
    let key_file = work.join(KEY_FILE);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&key_file)
        .with_context(|| format!("creating {}", key_file.display()))?;
    file.write_all(user.to_key_file().as_bytes())
        .with_context(|| format!("writing {}", key_file.display()))?;
    let keys = work.join("authorized_keys");
    std::fs::write(&keys, format!("{}\n", user.authorized_line()))
        .with_context(|| format!("writing {}", keys.display()))?;
    Ok((user, keys))
}

/// `whoami`: answers with the identity the caller proved. Authenticated-only (not in
/// [`ANONYMOUS`]), so the framework ran the proof before the first call: the handler
/// only reads what the door established, as a service that authorizes by identity
/// would.
struct WhoAmI;

impl RequestHandler for WhoAmI {
    type Req = ();
    type Resp = String;
    type Error = String;

    async fn call(&self, _: (), cx: &RequestCx) -> Result<String, String> {
        match &cx.peer().identity {
            Identity::Key(name) => Ok(name.clone()),
            // Unreachable while whoami is authenticated-only; said, not assumed.
            other => Err(format!("no proved identity ({other})")),
        }
    }
}

/// The `lambda` service, with `checksum` also registered as native Rust.
fn lambda_service() -> LambdaService {
    let natives = NativeLambdas::new();
    natives.register("checksum", Arc::new(|i: &[u8]| Ok(checksum_native(i))));
    LambdaService::new(
        Arc::new(Sandbox::new()),
        Arc::new(natives),
        LambdaConfig::default(),
    )
}

/// The application's side of the live region: a thread updating it in place about every
/// millisecond, as a server publishing state would.
struct Updater {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<u64>,
}

impl Updater {
    fn start(writer: RegionWriter) -> Updater {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut updates = 0;
            while !flag.load(Ordering::Relaxed) {
                writer.update(|version, bytes| {
                    let word = (version / 2).to_le_bytes();
                    for chunk in bytes.chunks_exact_mut(8) {
                        chunk.copy_from_slice(&word);
                    }
                });
                updates += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            updates
        });
        Updater { stop, thread }
    }

    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or(0)
    }
}
