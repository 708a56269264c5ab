//! ft: sends files to, and fetches files from, a server's `files` service.
//!
//! ```sh
//! ft --addr 192.0.2.1:7471 send --hash blake3 --id alice big.iso notes.txt
//! ft --addr 192.0.2.1:7471 fetch --out /tmp/got big.iso
//! ```
//! Files go one after another over one connection, each with a progress bar (bytes,
//! rate, ETA) on stderr. Each verdict is printed on stdout (`GOOD NAME ALG:DIGEST`,
//! `BAD NAME: why`, `REJECTED NAME: why`, `ERROR NAME: why`), and each transfer that
//! reached a verdict prints `RESULT kind=file bytes=N secs=S mb_per_s=X`, timed from
//! the offer to the verdict (hashing the file before the offer is not counted), for
//! scripts/bench. The exit status is 0 only if every file was GOOD.
//!
//! With `--cluster NAME --etcd URL[,URL..]` instead of `--addr`, files go to a cluster
//! (`rdmactor_cluster::files`): `send` puts each on `--replicas` nodes (2) chosen by
//! rendezvous hashing and records it in etcd (`GOOD NAME sha256:DIGEST nodes=a,b`),
//! `fetch` reads it from a live replica and checks the recorded digest
//! (`GOOD NAME sha256:DIGEST from=a`), and `repair` copies files whose node has been
//! gone longer than `--grace-secs` to another (`REPAIRED NAME gone=a from=b to=c`).
//! SHA-256 only, no `--id` there; `send --overwrite` replaces one's own file's bytes
//! (the record moves to them, `ClusterFiles::overwrite`).
//! `delete` removes files (`DELETED NAME`): on one server, those this client may
//! replace (its identity's, or its connection's own); with `--cluster`, every
//! reachable replica and the record, the owner's alone (`DELETED NAME nodes=a,b`, and
//! `LEFT NAME node=c: why` for a copy left on a node that was not reached).
//! `--cluster` and `repair` come with the tools' `cluster` feature (on by default).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use rdmactor::runtime::{Client, ClientConnection, NodeConfig};
#[cfg(feature = "cluster")]
use rdmactor_cluster::files::{ClusterFiles, RdmaFiles, RepairPlanner, Staging};
#[cfg(feature = "cluster")]
use rdmactor_examples::cluster::{self, ClusterArgs};
use rdmactor_examples::{logs, transport};
use rdmactor_services::file_transfer::{
    delete_file, fetch_file, send_file, Auth, ClientError, Digest, FetchOptions, HashAlg, Outcome,
    Progress, SendOptions,
};

#[derive(Clone, Copy, ValueEnum)]
enum Hash {
    Sha256,
    Blake3,
}

impl From<Hash> for HashAlg {
    fn from(h: Hash) -> HashAlg {
        match h {
            Hash::Sha256 => HashAlg::Sha256,
            Hash::Blake3 => HashAlg::Blake3,
        }
    }
}

#[derive(Parser)]
#[command(about = "Send files to, or fetch files from, an rdmactor server's files service")]
struct Args {
    /// Server address (or --cluster and --etcd).
    #[arg(long)]
    #[cfg_attr(feature = "cluster", arg(required_unless_present = "cluster"))]
    #[cfg_attr(not(feature = "cluster"), arg(required = true))]
    addr: Option<SocketAddr>,
    #[cfg(feature = "cluster")]
    #[command(flatten)]
    cluster: ClusterArgs,
    /// With --cluster: replicas per file.
    #[cfg(feature = "cluster")]
    #[arg(long, requires = "cluster", default_value_t = 2)]
    replicas: usize,
    /// Service name on the server.
    #[arg(long, default_value = "files")]
    service: String,
    #[command(subcommand)]
    cmd: Cmd,
    #[command(flatten)]
    transport: transport::TransportFlags,
    #[command(flatten)]
    key: rdmactor_examples::identity::Key,
}

#[derive(Subcommand)]
enum Cmd {
    /// Upload files (stored under their file names).
    Send {
        /// Digest the server verifies.
        #[arg(long, value_enum, default_value_t = Hash::Sha256)]
        hash: Hash,
        /// Replace files of the same name on the server.
        #[arg(long)]
        overwrite: bool,
        /// Identify as ID after each GOOD and print the secret the server answers.
        #[arg(long)]
        id: Option<String>,
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Download files by name.
    Fetch {
        /// Digest the client verifies.
        #[arg(long, value_enum, default_value_t = Hash::Sha256)]
        hash: Hash,
        /// Replace local files of the same name.
        #[arg(long)]
        overwrite: bool,
        /// Directory to store them in.
        #[arg(long, default_value = ".")]
        out: PathBuf,
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Remove files by name (one's own: see the `files` service's authorization).
    Delete {
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// With --cluster: copy files whose node has been gone longer than the grace
    /// period to another node, under each file's etcd lock.
    #[cfg(feature = "cluster")]
    Repair {
        /// How long a node may be gone before its files are copied elsewhere.
        #[arg(long, default_value_t = 30)]
        grace_secs: u64,
        /// Seconds between rounds.
        #[arg(long, default_value_t = 2)]
        every_secs: u64,
        /// Stop after this many rounds (0: run until killed).
        #[arg(long, default_value_t = 0)]
        rounds: u64,
        /// Where copies are staged: a private directory (mode 0700, a random name) is
        /// made in it for each copy and removed after.
        #[arg(long, default_value = "/tmp")]
        scratch: PathBuf,
    },
}

fn main() -> Result<ExitCode> {
    logs::init("warn");
    let args = Args::parse();
    let all_good = actix::System::new().block_on(run(args))?;
    Ok(if all_good {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// One file's transfer, as the progress callback sees it.
struct Tracker {
    bar: ProgressBar,
    started: Option<Instant>,
    offered: Option<(u64, Digest)>,
}

impl Tracker {
    fn new(name: &str, what: &str) -> Tracker {
        let bar = ProgressBar::new_spinner();
        bar.set_message(format!("{what} {name}"));
        bar.enable_steady_tick(Duration::from_millis(200));
        Tracker {
            bar,
            started: None,
            offered: None,
        }
    }

    fn update(&mut self, p: Progress<'_>) {
        match p {
            Progress::Offer(offer) => {
                self.started = Some(Instant::now());
                self.offered = Some((offer.len, offer.digest));
                self.bar.set_style(
                    ProgressStyle::with_template(
                        "{msg:24!} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
                    )
                    .expect("valid template")
                    .progress_chars("=> "),
                );
                self.bar.set_message(offer.name.clone());
                self.bar.set_length(offer.len);
                self.bar.set_position(0);
                self.bar.reset_eta();
            }
            Progress::Bytes { done, .. } => self.bar.set_position(done),
            _ => {}
        }
    }

    /// Prints the verdict (and the RESULT line); true for GOOD.
    fn report(self, name: &str, res: Result<Outcome, ClientError>) -> bool {
        let secs = self.started.map(|t| t.elapsed().as_secs_f64());
        let (line, good, moved) = match res {
            Ok(Outcome::Delivered { auth }) => {
                let digest = self.offered.map(|(_, d)| format!(" {:?}", d));
                let mut line = format!("GOOD {name}{}", digest.unwrap_or_default());
                match auth {
                    Some(Auth::Secret(key)) => line += &format!("\nSECRET {}", key.expose()),
                    Some(Auth::Refused) => line += "\nREFUSED (unknown ID)",
                    None => {}
                }
                (line, true, true)
            }
            Ok(Outcome::Stored { digest, .. }) => (format!("GOOD {name} {digest:?}"), true, true),
            Ok(Outcome::Bad(reason)) => (format!("BAD {name}: {reason}"), false, true),
            Ok(Outcome::Rejected(reason)) => (format!("REJECTED {name}: {reason}"), false, false),
            Ok(Outcome::Aborted(reason)) => (format!("ABORTED {name}: {reason}"), false, true),
            Ok(Outcome::Held { .. } | Outcome::Deleted) => (
                format!("UNEXPECTED {name}: not a transfer's answer"),
                false,
                false,
            ),
            Err(e) => (format!("ERROR {name}: {e}"), false, false),
        };
        let first = line.lines().next().unwrap_or_default().to_owned();
        if good {
            self.bar.finish_with_message(first);
        } else {
            self.bar.abandon_with_message(first);
        }
        println!("{line}");
        if let (true, Some(secs), Some((bytes, _))) = (moved, secs, self.offered) {
            let mb_per_s = bytes as f64 / 1e6 / secs.max(1e-9);
            println!("RESULT kind=file bytes={bytes} secs={secs:.3} mb_per_s={mb_per_s:.1}");
        }
        good
    }
}

/// The file name `path` is stored under on the server.
fn file_name(path: &Path) -> Result<String> {
    path.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_owned)
        .with_context(|| format!("{} has no UTF-8 file name", path.display()))
}

/// The open connection, or a new one after an error closed the last.
async fn connection(
    client: &Client,
    args: &Args,
    conn: &mut Option<ClientConnection>,
) -> Result<ClientConnection> {
    if let Some(c) = conn {
        return Ok(c.clone());
    }
    let addr = args.addr.context("--addr")?;
    let c = client
        .connect(addr, &args.service)
        .await
        .with_context(|| format!("connecting to {} at {addr}", args.service))?;
    *conn = Some(c.clone());
    Ok(c)
}

async fn run(args: Args) -> Result<bool> {
    let client = Client::start(args.transport.apply(NodeConfig::default()))
        .context("starting the client")?;
    let client = args.key.apply(client)?;
    #[cfg(feature = "cluster")]
    if let Some((cluster, etcd)) = args.cluster.etcd()? {
        let files = ClusterFiles::new(RdmaFiles::new(&client), etcd, &cluster)?
            .with_replicas(args.replicas);
        let all_good = run_cluster(&files, &args.cmd).await;
        drop(files);
        client.shutdown().await;
        return all_good;
    }
    let mut conn = None;
    let mut all_good = true;
    match &args.cmd {
        Cmd::Send {
            hash,
            overwrite,
            id,
            files,
        } => {
            let opts = SendOptions {
                alg: (*hash).into(),
                overwrite: *overwrite,
                identity: id.clone(),
                ..SendOptions::default()
            };
            for path in files {
                let name = file_name(path)?;
                let c = connection(&client, &args, &mut conn).await?;
                let mut t = Tracker::new(&name, "hashing");
                let res = send_file(&c, path, &name, &opts, |p| t.update(p)).await;
                if res.is_err() {
                    conn = None; // closed by send_file
                }
                all_good &= t.report(&name, res);
            }
        }
        Cmd::Fetch {
            hash,
            overwrite,
            out,
            names,
        } => {
            let opts = FetchOptions {
                alg: (*hash).into(),
                overwrite: *overwrite,
                ..FetchOptions::default()
            };
            for name in names {
                let c = connection(&client, &args, &mut conn).await?;
                let mut t = Tracker::new(name, "asking for");
                let res = fetch_file(&c, &client, name, out, &opts, |p| t.update(p)).await;
                if res.is_err() {
                    conn = None;
                }
                all_good &= t.report(name, res);
            }
        }
        Cmd::Delete { names } => {
            for name in names {
                let c = connection(&client, &args, &mut conn).await?;
                let line = match delete_file(&c, name).await {
                    Ok(Outcome::Deleted) => format!("DELETED {name}"),
                    Ok(Outcome::Rejected(reason)) => format!("REJECTED {name}: {reason}"),
                    Ok(other) => format!("UNEXPECTED {name}: {other:?}"),
                    Err(e) => {
                        conn = None; // closed by delete_file
                        format!("ERROR {name}: {e}")
                    }
                };
                all_good &= line.starts_with("DELETED ");
                println!("{line}");
            }
        }
        #[cfg(feature = "cluster")]
        Cmd::Repair { .. } => anyhow::bail!("repair needs --cluster"),
    }
    if let Some(c) = conn {
        c.close().await;
    }
    client.shutdown().await;
    Ok(all_good)
}

/// `--cluster`: each command through the cluster's files; true if every file was GOOD.
#[cfg(feature = "cluster")]
async fn run_cluster(files: &ClusterFiles<RdmaFiles<'_>>, cmd: &Cmd) -> Result<bool> {
    let mut all_good = true;
    match cmd {
        Cmd::Send {
            hash,
            overwrite,
            id,
            files: paths,
        } => {
            anyhow::ensure!(
                matches!(hash, Hash::Sha256) && id.is_none(),
                "with --cluster, send takes no --hash blake3 or --id"
            );
            for path in paths {
                let name = file_name(path)?;
                let put = if *overwrite {
                    files.overwrite(path, &name).await
                } else {
                    files.put(path, &name).await
                };
                match put {
                    Ok(r) => println!(
                        "GOOD {name} {}:{} nodes={}",
                        r.alg,
                        r.digest,
                        r.nodes.join(",")
                    ),
                    Err(e) => {
                        println!("ERROR {name}: {e}");
                        all_good = false;
                    }
                }
            }
        }
        Cmd::Fetch {
            hash,
            overwrite,
            out,
            names,
        } => {
            anyhow::ensure!(
                matches!(hash, Hash::Sha256) && !overwrite,
                "with --cluster, fetch takes no --hash blake3 or --overwrite"
            );
            for name in names {
                match files.get(name, out).await {
                    Ok(f) => {
                        for (node, why) in &f.failed {
                            println!("SKIPPED {name} node={node}: {why}");
                        }
                        println!(
                            "GOOD {name} {}:{} from={}",
                            f.record.alg, f.record.digest, f.node
                        );
                    }
                    Err(e) => {
                        println!("ERROR {name}: {e}");
                        all_good = false;
                    }
                }
            }
        }
        Cmd::Delete { names } => {
            for name in names {
                match files.delete(name).await {
                    Ok(d) => {
                        println!("DELETED {name} nodes={}", d.removed.join(","));
                        for (node, why) in &d.left {
                            println!("LEFT {name} node={node}: {why}");
                        }
                    }
                    Err(e) => {
                        println!("ERROR {name}: {e}");
                        all_good = false;
                    }
                }
            }
        }
        Cmd::Repair {
            grace_secs,
            every_secs,
            rounds,
            scratch,
        } => {
            let mut planner = RepairPlanner::new(Duration::from_secs(*grace_secs))
                .with_replicas(files.replicas());
            let mut round = 0;
            while *rounds == 0 || round < *rounds {
                round += 1;
                match files
                    .repair(&mut planner, Instant::now(), Staging::Through(scratch))
                    .await
                {
                    Ok(report) => cluster::print_repairs("", &report),
                    Err(e) => eprintln!("ft repair: {e} (next round in {every_secs} s)"),
                }
                tokio::time::sleep(Duration::from_secs(*every_secs)).await;
            }
        }
    }
    Ok(all_good)
}
