//! `--cluster NAME --etcd URL[,URL..]`: the tools' way into a cluster of servers
//! registered in etcd (the `rdmactor-cluster` crate). Without `--cluster` a tool touches
//! no etcd at all.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use rdmactor::runtime::{Client, ClientConnection, Session};
use rdmactor_cluster::files::{
    CatalogRecorder, ClusterFiles, Collector, RdmaFiles, RepairPlanner, RepairReport, Staging,
};
use rdmactor_cluster::{
    ClusterClient, ClusterSession, EtcdConfig, EtcdDirectory, EtcdTls, EtcdUser, Idempotent as _,
    Placement, Registrar, RegistrationConfig,
};
use rdmactor_services::echo::{EchoRequest, EchoResponse};
use rdmactor_services::members;

/// The flags, flattened into a tool's own.
#[derive(clap::Args, Debug, Clone)]
pub struct ClusterArgs {
    /// The cluster to register in (server) or to find servers in (clients), by name.
    #[arg(long, requires = "etcd", value_name = "NAME")]
    pub cluster: Option<String>,
    /// etcd's client URLs, comma-separated (`http://10.0.0.1:2379,http://10.0.0.2:2379`).
    #[arg(long, requires = "cluster", value_name = "URL[,URL..]")]
    pub etcd: Option<String>,
    /// With `https://` endpoints: the CA certificate (PEM) etcd's certificate must chain
    /// to. See docs/operations.md, "A closed control plane".
    #[arg(long, requires = "etcd", value_name = "FILE")]
    pub etcd_ca: Option<PathBuf>,
    /// This process's client certificate for etcd (PEM; its common name is the etcd
    /// user: rdmactor-server for servers, rdmactor-client for read-only tools).
    #[arg(long, requires_all = ["etcd_ca", "etcd_key"], value_name = "FILE")]
    pub etcd_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, requires = "etcd_cert", value_name = "FILE")]
    pub etcd_key: Option<PathBuf>,
    /// An etcd user, where etcd takes passwords (with --etcd-password-file).
    #[arg(long, requires_all = ["etcd", "etcd_password_file"], value_name = "NAME")]
    pub etcd_user: Option<String>,
    /// The file whose first line is --etcd-user's password (kept out of the command
    /// line and the environment).
    #[arg(long, requires = "etcd_user", value_name = "FILE")]
    pub etcd_password_file: Option<PathBuf>,
}

impl ClusterArgs {
    /// The cluster's name and how to reach etcd, if `--cluster` was given.
    pub fn etcd(&self) -> Result<Option<(String, EtcdConfig)>> {
        let (Some(cluster), Some(etcd)) = (&self.cluster, &self.etcd) else {
            return Ok(None);
        };
        let mut config = EtcdConfig::parse(etcd).with_context(|| format!("--etcd {etcd:?}"))?;
        if let Some(ca) = &self.etcd_ca {
            let mut tls = EtcdTls::from_ca(ca).context("--etcd-ca")?;
            if let (Some(cert), Some(key)) = (&self.etcd_cert, &self.etcd_key) {
                tls = tls
                    .with_client_cert(cert, key)
                    .context("--etcd-cert/--etcd-key")?;
            }
            config = config.with_tls(tls);
        }
        if let (Some(user), Some(password)) = (&self.etcd_user, &self.etcd_password_file) {
            config = config.with_user(
                EtcdUser::with_password_file(user, password).context("--etcd-password-file")?,
            );
        }
        Ok(Some((cluster.clone(), config)))
    }
}

/// The server's flags: [`ClusterArgs`], and how the server is listed.
#[derive(clap::Args, Debug, Clone)]
pub struct ServerClusterArgs {
    /// `--cluster` and `--etcd`.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// With --cluster: the address clients are told to connect to (default: the first
    /// --listen address, unless it is a wildcard).
    #[arg(long, requires = "cluster", value_name = "ADDR:PORT")]
    pub advertise: Option<SocketAddr>,
    /// With --cluster: this server's id in the cluster, unique and the same across
    /// restarts (default: the advertised address).
    #[arg(long, requires = "cluster", value_name = "ID")]
    pub node_id: Option<String>,
    /// With --cluster: the lease's time to live, in seconds: how long a server that died
    /// without withdrawing stays listed at most.
    #[arg(long, requires = "cluster", default_value_t = 5)]
    pub lease_ttl_secs: u64,
    /// With --cluster and --files-dir: restore the replica count of files whose node has
    /// been gone this long (seconds). Every server repairing runs its own planner and
    /// copies onto itself the files rendezvous hashing assigns it, under the file's etcd
    /// lock. Off unless given.
    #[arg(long, requires = "cluster", value_name = "SECS")]
    pub repair_after_secs: Option<u64>,
    /// Seconds between repair rounds.
    #[arg(long, requires = "repair_after_secs", default_value_t = 2)]
    pub repair_every_secs: u64,
    /// With --repair-after-secs: R, the replicas a file should have (`ft --replicas`).
    /// A record that names fewer nodes, every one listed, for the grace period (an
    /// upload that verified fewer: each server records its own copy) gets a copy
    /// added, onto the next node in the name's order.
    #[arg(long, requires = "repair_after_secs", default_value_t = 2)]
    pub replicas: usize,
    /// With --repair-after-secs: ask each file's listed replicas what they hold once
    /// in this many seconds (the server a repair of the file would go to asks, at most
    /// 32 files a round), and replace at once those without the recorded bytes. 0: no
    /// scrub.
    #[arg(long, requires = "repair_after_secs", default_value_t = 3600)]
    pub scrub_every_secs: u64,
    /// With --repair-after-secs: remove from --files-dir the files no record lists for
    /// this node (left by an upload that reached too few nodes, or other bytes under a
    /// name recorded elsewhere) once seen so for this many seconds, looking once a
    /// minute. Off unless given: files uploaded to this server outside the cluster
    /// would be removed too.
    #[arg(long, requires = "repair_after_secs", value_name = "SECS")]
    pub clean_up_after_secs: Option<u64>,
    /// With --repair-after-secs: the key this server's repairs prove to the other
    /// servers (a `keygen` file), whose `files` services name its identity with
    /// --files-replicator. Without it, repairs connect anonymously and need
    /// --files-public-fetch on every server.
    #[arg(long, requires = "repair_after_secs", value_name = "FILE")]
    pub repair_key: Option<std::path::PathBuf>,
}

/// Files a server's scrub asks about per repair round, at most.
const SCRUB_PER_ROUND: usize = 32;

/// The services a server registers with --cluster: those reached through rdma_cm by
/// name (the stock-* services serve the out-of-band ports only), and `files` when it
/// serves files.
const CLUSTER_SERVICES: [&str; 8] = [
    "echo", "discard", "raw-echo", "pingpong", "rping", "lambda", "read", "ingest",
];

/// The services a server registers, and answers `members` questions about.
fn cluster_services(files: bool) -> Vec<&'static str> {
    let mut services = CLUSTER_SERVICES.to_vec();
    if files {
        services.push("files");
    }
    services
}

impl ServerClusterArgs {
    /// With --cluster: the `members` service's view of the registry (a watch per
    /// service this server registers, started when a client first asks about it), so
    /// that clients bootstrap from this server's address without reaching etcd
    /// themselves. Inside the server's actix System.
    pub fn directory(&self, files: bool) -> Result<Option<EtcdDirectory>> {
        let Some((cluster, etcd)) = self.cluster.etcd()? else {
            return Ok(None);
        };
        Ok(Some(EtcdDirectory::new(
            etcd,
            &cluster,
            cluster_services(files),
        )))
    }

    /// With --cluster: starts registering the server's services, listening on
    /// `listening`. In the background: etcd being down is logged and retried, never
    /// fatal, so that a server keeps serving whatever happens to the registry.
    pub fn start_registrar(
        &self,
        listening: &[SocketAddr],
        files: bool,
    ) -> Result<Option<Registrar>> {
        let Some((cluster, etcd)) = self.cluster.etcd()? else {
            return Ok(None);
        };
        let (addr, node) = self.node(listening)?;
        let mut config = RegistrationConfig::new(&cluster, &node, addr, cluster_services(files));
        config.ttl = Duration::from_secs(self.lease_ttl_secs.max(1));
        println!(
            "cluster: registering node {node} ({addr}) in {cluster} via {}",
            etcd.endpoints.join(",")
        );
        Registrar::start(etcd, config)
            .map(Some)
            .context("--cluster")
    }

    /// With --cluster: the catalog recorder that the `files` service gives each copy it
    /// stores before its GOOD, so that servers, not clients, write the catalog. Named
    /// with [`name_recorder`](Self::name_recorder) once the server listens.
    pub fn recorder(&self) -> Result<Option<Arc<CatalogRecorder>>> {
        let Some((cluster, etcd)) = self.cluster.etcd()? else {
            return Ok(None);
        };
        let recorder = CatalogRecorder::start(etcd, &cluster).context("--cluster")?;
        Ok(Some(Arc::new(recorder)))
    }

    /// Names `recorder`'s node: this server's id, listening on `listening`.
    pub fn name_recorder(
        &self,
        recorder: &CatalogRecorder,
        listening: &[SocketAddr],
    ) -> Result<()> {
        let (_, node) = self.node(listening)?;
        recorder.set_node(&node);
        Ok(())
    }

    /// The address clients are told, and the node's id.
    fn node(&self, listening: &[SocketAddr]) -> Result<(SocketAddr, String)> {
        let addr = match self.advertise {
            Some(addr) => addr,
            None => *listening
                .iter()
                .find(|a| !a.ip().is_unspecified())
                .context(
                    "--cluster needs --advertise: no --listen address is one clients can reach",
                )?,
        };
        let node = self.node_id.clone().unwrap_or_else(|| addr.to_string());
        Ok((addr, node))
    }

    /// With --repair-after-secs: repair rounds for ever, copying onto this node (a
    /// server listening on `listening`, whose `files` store is `store`, taking files of
    /// at most `max_size` bytes) through `client` (the server's own, on the same
    /// device). Each copy is fetched straight into the store (the files service's
    /// hidden temporary file there, checked against the free space before any byte
    /// moves, named only once verified): nothing is staged outside it. With
    /// --scrub-every-secs, each round first asks a few files' listed replicas what they
    /// hold, and with --clean-up-after-secs a loop of its own, beside the repairs,
    /// removes what no record lists here. Without --repair-after-secs, pending for ever. Every outcome is logged; nothing here ends the server.
    ///
    /// # Errors
    ///
    /// Only what stops repairs from starting: a bad `--etcd`.
    pub async fn repairs(
        &self,
        listening: &[SocketAddr],
        client: &Client,
        store: &Path,
        max_size: u64,
    ) -> Result<()> {
        let (Some(grace), Some((cluster, etcd))) = (self.repair_after_secs, self.cluster.etcd()?)
        else {
            return std::future::pending().await;
        };
        let (_, node) = self.node(listening)?;
        let files = ClusterFiles::new(RdmaFiles::new(client), etcd, &cluster)
            .context("--repair-after-secs")?
            .with_replicas(self.replicas);
        let mut planner =
            RepairPlanner::for_node(Duration::from_secs(grace), &node).with_replicas(self.replicas);
        if self.scrub_every_secs > 0 {
            let every = Duration::from_secs(self.scrub_every_secs);
            planner = planner.with_scrub(every, SCRUB_PER_ROUND);
        }
        let staging = Staging::Store {
            node: &node,
            dir: store,
            max_size,
        };
        let mut collector = self.clean_up_after_secs.map(|secs| {
            Collector::new(&node, Duration::from_secs(secs), Duration::from_secs(60))
                .with_replicas(self.replicas)
        });
        println!("cluster: repairing onto node {node} the files gone from a node for {grace} s");
        // Each round that did something, or took long, says how long: where a wiped
        // store's repair spends its time.
        let took = |started: Instant| started.elapsed().as_secs_f64();
        let every = Duration::from_secs(self.repair_every_secs.max(1));
        // Scrub and repair in one loop (a scrub's findings feed the next repair), the
        // clean-up in another: its rounds ask about and lock every extra copy, minutes
        // under emulation, and a wiped store's repair must not wait behind them (the
        // nemesis of 2026-11-29 saw 160-200 s clean-up rounds between repair rounds).
        let repairs = async {
            loop {
                let started = Instant::now();
                match files.scrub(&mut planner, started).await {
                    Ok(report) => {
                        for (name, node, why) in &report.lost {
                            println!("cluster: LOST {name} node={node}: {why}");
                        }
                        if report.asked > 0 {
                            println!(
                                "cluster: ROUND scrub asked={} lost={} unanswered={} secs={:.1}",
                                report.asked,
                                report.lost.len(),
                                report.unanswered.len(),
                                took(started)
                            );
                        }
                    }
                    Err(e) => tracing::warn!(%e, "cluster: a scrub round failed; trying again"),
                }
                let started = Instant::now();
                match files.repair(&mut planner, started, staging).await {
                    Ok(report) => {
                        print_repairs("cluster: ", &report);
                        if !report.done.is_empty() || !report.failed.is_empty() {
                            println!(
                                "cluster: ROUND repair made={} failed={} secs={:.1}",
                                report.done.len(),
                                report.failed.len(),
                                took(started)
                            );
                        }
                    }
                    Err(e) => tracing::warn!(%e, "cluster: a repair round failed; trying again"),
                }
                tokio::time::sleep(every).await;
            }
        };
        let clean_ups = async {
            let Some(collector) = collector.as_mut() else {
                return std::future::pending().await;
            };
            loop {
                let started = Instant::now();
                match files.clean_up(collector, started, &node, store).await {
                    Ok(report) => {
                        for name in &report.removed {
                            println!("cluster: REMOVED {name}: no record lists it here");
                        }
                        if !report.removed.is_empty() || took(started) > 5.0 {
                            println!(
                                "cluster: ROUND clean-up removed={} secs={:.1}",
                                report.removed.len(),
                                took(started)
                            );
                        }
                    }
                    Err(e) => tracing::warn!(%e, "cluster: a clean-up round failed"),
                }
                tokio::time::sleep(every).await;
            }
        };
        futures::future::join(repairs, clean_ups).await.0
    }
}

/// Where a client tool's connections go: the fixed `--addr`, or with `--cluster` a node
/// of the service found in the registry (least loaded first, the next on a failed
/// connect or one that did not answer within the dial bound, a node that did not answer
/// tried last from then on: `ClusterClient`'s module docs).
pub enum Dial<'c> {
    /// `--addr`.
    Addr {
        /// The client.
        client: &'c Client,
        /// The server.
        addr: SocketAddr,
    },
    /// `--cluster` and `--etcd` (boxed: a cluster client holds its watches and
    /// suspects, ten times an address).
    Cluster(Box<ClusterClient<&'c Client>>),
    /// `--seeds`: any server the seeds list for the service (their `members`), least
    /// loaded first, each connect within the dial bound; no etcd.
    Seeds {
        /// The client.
        client: &'c Client,
        /// Servers to ask, in order.
        seeds: Vec<SocketAddr>,
        /// One connect's bound.
        dial: Duration,
    },
}

impl<'c> Dial<'c> {
    /// `--addr` if given, else the seeds, else the cluster of `cluster`; exactly one
    /// of them is required.
    pub fn new(
        client: &'c Client,
        addr: Option<SocketAddr>,
        seeds: Option<Vec<SocketAddr>>,
        cluster: &ClusterArgs,
    ) -> Result<Dial<'c>> {
        match (addr, seeds, cluster.etcd()?) {
            (Some(addr), None, None) => Ok(Dial::Addr { client, addr }),
            (None, Some(seeds), None) => Ok(Dial::Seeds {
                client,
                seeds,
                dial: members::DEFAULT_DIAL,
            }),
            (None, None, Some((name, etcd))) => Ok(Dial::Cluster(Box::new(ClusterClient::new(
                client, etcd, name,
            )))),
            (None, None, None) => anyhow::bail!("give --addr, --seeds, or --cluster and --etcd"),
            _ => anyhow::bail!("give one of --addr, --seeds and --cluster"),
        }
    }

    /// With `--cluster`: gives up a connect to one node after `bound` and tries the next
    /// (default `rdmactor_cluster::DEFAULT_DIAL_TIMEOUT`). `--addr` has no next node,
    /// and waits for rdma_cm's own verdict.
    pub fn with_dial_timeout(self, bound: Duration) -> Self {
        match self {
            Dial::Cluster(cluster) => Dial::Cluster(Box::new(cluster.with_dial_timeout(bound))),
            Dial::Seeds { client, seeds, .. } => Dial::Seeds {
                client,
                seeds,
                dial: bound,
            },
            addr => addr,
        }
    }

    /// A connection to `service`.
    pub async fn connect(&self, service: &str) -> Result<ClientConnection> {
        match self {
            Dial::Addr { client, addr } => client
                .connect(*addr, service)
                .await
                .with_context(|| format!("connect to {addr}")),
            Dial::Cluster(cluster) => Ok(cluster
                .connect(service, Placement::LeastLoaded)
                .await?
                .connection),
            Dial::Seeds {
                client,
                seeds,
                dial,
            } => Ok(members::connect_via(*client, seeds, service, *dial)
                .await?
                .connection),
        }
    }

    /// A connection to `service` driven by a session of the caller's, made by `session`
    /// for each node tried (a failed connect consumes its session): through the cluster
    /// it is dialled as [`connect`](Self::connect) is, bounded and past suspect nodes.
    pub async fn connect_session<S: Session>(
        &self,
        service: &str,
        mut session: impl FnMut() -> S,
    ) -> Result<ClientConnection> {
        match self {
            Dial::Addr { client, addr } => client
                .connect_session(*addr, service, session())
                .await
                .with_context(|| format!("connect to {addr}")),
            Dial::Cluster(cluster) => {
                let client = *cluster.connector();
                let dial = |addr| client.connect_session(addr, service, session());
                Ok(cluster
                    .connect_with(service, Placement::LeastLoaded, dial)
                    .await?
                    .connection)
            }
            Dial::Seeds {
                client,
                seeds,
                dial,
            } => {
                let connect = |addr| client.connect_session(addr, service, session());
                Ok(
                    members::connect_via_with(*client, seeds, service, *dial, connect)
                        .await?
                        .connection,
                )
            }
        }
    }
}

/// One line per copy of a repair round, `prefix` first: `REPAIRED NAME gone= from= to=`,
/// or `UNREPAIRED NAME gone=: why` (the tests and the wire run read these lines); `gone=-`
/// for a copy added to a record short of R.
pub fn print_repairs(prefix: &str, report: &RepairReport) {
    let gone = |r: &rdmactor_cluster::files::Repair| r.gone.clone().unwrap_or_else(|| "-".into());
    for r in &report.done {
        println!(
            "{prefix}REPAIRED {} gone={} from={} to={}",
            r.name,
            gone(r),
            r.from,
            r.to
        );
    }
    for f in &report.forgotten {
        println!("{prefix}FORGOT {} gone={}", f.name, f.gone);
    }
    for (r, why) in &report.failed {
        println!("{prefix}UNREPAIRED {} gone={}: {why}", r.name, gone(r));
    }
}

/// `client echo` through the cluster: one `ClusterSession` per connection, each echo
/// sent again on another node if its connection is lost (an echo is idempotent), every
/// move printed as `MOVED node N (ADDR): why`; ends with the `RESULT kind=echo` line.
///
/// The first session answers one extra echo as soon as it is connected, before the
/// others connect: `FIRST-ANSWER connected_ms=C answered_ms=A node=N`, in milliseconds
/// since `started` (the program's start). That is a new client's time to its first
/// answer, which the cluster bounds after a server dies (lease TTL + dial bound); the
/// other sessions' connects come after it and are not part of it.
pub async fn echo_sessions(
    cluster: &ClusterClient<&Client>,
    service: &str,
    connections: usize,
    requests: usize,
    forever: bool,
    started: Instant,
) -> Result<()> {
    let mut sessions = Vec::with_capacity(connections);
    for c in 0..connections {
        let mut session = cluster.session(service, Placement::LeastLoaded).await?;
        let node = session.node().map(|n| n.node.clone()).unwrap_or_default();
        if let Some(n) = session.node() {
            println!("session {c} on node {} ({})", n.node, n.record.addr);
        }
        if c == 0 {
            let connected = started.elapsed();
            echo_verified(&mut session, b"first".to_vec()).await?;
            println!(
                "FIRST-ANSWER connected_ms={} answered_ms={} node={node}",
                connected.as_millis(),
                started.elapsed().as_millis()
            );
        }
        sessions.push(session);
    }
    println!("connected {connections}");
    let tasks = sessions
        .iter_mut()
        .enumerate()
        .map(|(c, session)| async move {
            let mut i = 0usize;
            let mut reported = 0;
            while forever || i < requests {
                let size = [16usize, 1000, 9000][(c + i) % 3];
                echo_verified(session, vec![(i % 251) as u8; size]).await?;
                for moved in &session.moves()[reported..] {
                    println!("MOVED {moved}");
                }
                reported = session.moves().len();
                i += 1;
            }
            anyhow::Ok(i)
        });
    let mut total = 0;
    for r in futures::future::join_all(tasks).await {
        total += r?;
    }
    futures::future::join_all(sessions.into_iter().map(|s| s.close())).await;
    println!("RESULT kind=echo connections={connections} requests={total}");
    Ok(())
}

/// One echo of `payload` through `session` (sent again on another node if its
/// connection is lost), its answer checked byte for byte.
async fn echo_verified(session: &mut ClusterSession<'_, &Client>, payload: Vec<u8>) -> Result<()> {
    let req = &EchoRequest { payload };
    let resp: EchoResponse = session
        .request(req.idempotency(), |conn| async move {
            conn.request_typed(req).await
        })
        .await?;
    anyhow::ensure!(resp.payload == req.payload, "echo payload differs");
    Ok(())
}
