//! A server's [`Recorder`]: each copy its `files` service verified goes into the
//! catalog, by the server, before its client hears GOOD (see [`Catalog::add_copy`]).
//!
//! Why a thread of its own: the files service calls a recorder on its blocking pool,
//! which has no tokio runtime to drive etcd's gRPC calls, and the server's actix
//! threads must not wait on etcd. One thread with a current-thread runtime takes the
//! copies in turn; every call to etcd is bounded by the config's request timeout, so a
//! client waits at most about that long for its verdict when etcd is away.

use std::sync::{Arc, OnceLock};

use rdmactor_services::file_transfer::{Recorder, StoredCopy};
use tokio::sync::{mpsc, oneshot};

use super::catalog::{AddedCopy, Catalog, Removed};
use super::FileRecord;
use crate::etcd::EtcdConfig;
use crate::{Error, Result};

/// What the recorder's thread is asked to do.
#[derive(Debug)]
enum Job {
    /// Record a stored copy.
    Record(StoredCopy),
    /// Forget a file its owner deletes.
    Forget { name: String, owner: Option<String> },
    /// May this overwrite take the name?
    Admit(StoredCopy),
}

type Request = (Job, oneshot::Sender<std::result::Result<(), String>>);

/// Records the copies of one node of a cluster (see the module docs).
#[derive(Debug)]
pub struct CatalogRecorder {
    /// Known once the server listens (its id may be its address).
    node: Arc<OnceLock<String>>,
    requests: mpsc::UnboundedSender<Request>,
}

impl CatalogRecorder {
    /// Records a node's copies in `cluster`'s catalog, reached through `etcd` (with a
    /// server's credentials: the catalog is closed to clients). Starts its thread. The
    /// node is named by [`set_node`](Self::set_node) once the server knows its id;
    /// copies stored before that are refused.
    ///
    /// # Errors
    ///
    /// A bad cluster name; no endpoint; the thread or its runtime cannot start.
    pub fn start(etcd: EtcdConfig, cluster: &str) -> Result<CatalogRecorder> {
        let catalog = Catalog::new(etcd, cluster)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Recorder(format!("its runtime: {e}")))?;
        // Unbounded, because the files service bounds it: one copy per upload it
        // admitted (`max_uploads`) waits here at most.
        let (tx, mut rx) = mpsc::unbounded_channel::<Request>();
        let node = Arc::new(OnceLock::<String>::new());
        let me = Arc::clone(&node);
        std::thread::Builder::new()
            .name("rdmactor-recorder".into())
            .spawn(move || {
                runtime.block_on(async {
                    // Waiting here keeps the runtime turning: etcd-client's connection
                    // tasks (HTTP/2 pings) run between copies.
                    while let Some((job, answer)) = rx.recv().await {
                        let done = match (me.get(), job) {
                            (Some(me), Job::Record(copy)) => record(&catalog, me, &copy).await,
                            (Some(_), Job::Forget { name, owner }) => {
                                forget(&catalog, &name, owner.as_deref()).await
                            }
                            (Some(_), Job::Admit(copy)) => admit(&catalog, &copy).await,
                            (None, _) => Err("this server is not in its cluster yet".to_owned()),
                        };
                        let _ = answer.send(done);
                    }
                });
            })
            .map_err(|e| Error::Recorder(format!("its thread: {e}")))?;
        Ok(CatalogRecorder { node, requests: tx })
    }

    /// Names the node whose copies this records (once; a second name is ignored, and
    /// `false` says so).
    pub fn set_node(&self, node: &str) -> bool {
        self.node.set(node.to_owned()).is_ok()
    }

    /// The node whose copies this records, once named.
    pub fn node(&self) -> Option<&str> {
        self.node.get().map(String::as_str)
    }
}

impl Recorder for CatalogRecorder {
    /// A recorded file's replicas must all hold the recorded bytes, so an overwrite
    /// takes the name only when the record is its owner's (the record then moves to
    /// the new bytes as each copy lands, [`Catalog::add_version`]), and is refused
    /// before the rename otherwise: a replica is never replaced by bytes its record
    /// will not take.
    fn admit(&self, copy: &StoredCopy) -> std::result::Result<(), String> {
        if !copy.overwrite {
            return Ok(());
        }
        self.ask(Job::Admit(copy.clone()))
    }

    fn record(&self, copy: &StoredCopy) -> std::result::Result<(), String> {
        self.ask(Job::Record(copy.clone()))
    }

    /// The record goes (if it names `owner`, or none) before the server removes its copy;
    /// the client's other replicas are told by the client, and a node that was away
    /// keeps a copy no record names, for its clean-up.
    fn forget(&self, name: &str, owner: Option<&str>) -> std::result::Result<(), String> {
        self.ask(Job::Forget {
            name: name.to_owned(),
            owner: owner.map(str::to_owned),
        })
    }
}

impl CatalogRecorder {
    /// Hands `job` to the recorder's thread and waits for its answer (on the files
    /// service's blocking pool).
    fn ask(&self, job: Job) -> std::result::Result<(), String> {
        let (answer, answered) = oneshot::channel();
        self.requests
            .send((job, answer))
            .map_err(|_| "the recorder's thread has stopped".to_owned())?;
        answered
            .blocking_recv()
            .map_err(|_| "the recorder's thread has stopped".to_owned())?
    }
}

/// Whether the overwrite `copy` may take its name (see [`CatalogRecorder::admit`]).
async fn admit(catalog: &Catalog, copy: &StoredCopy) -> std::result::Result<(), String> {
    let stored = catalog
        .get(&copy.name)
        .await
        .map_err(|e| format!("the catalog: {e}"))?;
    match stored {
        None => Ok(()),
        Some(s) if s.record.owner.is_some() && s.record.owner == copy.owner => Ok(()),
        Some(s) => Err(format!(
            "a cluster's file is overwritten by its owner alone (the cluster records it as {}'s)",
            s.record.owner.as_deref().unwrap_or("nobody")
        )),
    }
}

/// One file out of the catalog; the reason a client is told when it cannot be.
async fn forget(
    catalog: &Catalog,
    name: &str,
    owner: Option<&str>,
) -> std::result::Result<(), String> {
    match catalog.remove(name, owner).await {
        Ok(Removed::Removed) => {
            tracing::info!(%name, "cluster: record removed at its owner's delete");
            Ok(())
        }
        Ok(Removed::Absent) => Ok(()),
        Ok(Removed::NotOwner(record)) => Err(format!(
            "the cluster records the file as {}'s",
            record.owner.as_deref().unwrap_or("nobody")
        )),
        Err(e) => Err(format!("the catalog: {e}")),
    }
}

/// One copy into the catalog; the reason a client is told when it cannot be.
async fn record(
    catalog: &Catalog,
    node: &str,
    copy: &StoredCopy,
) -> std::result::Result<(), String> {
    let record = FileRecord {
        alg: copy.digest.alg.name().to_owned(),
        digest: copy.digest.to_string(),
        size: copy.len,
        nodes: vec![node.to_owned()],
        owner: copy.owner.clone(),
    };
    let added = if copy.replica {
        catalog
            .add_replica(&copy.name, &record, node)
            .await
            .map(|added| added.ok_or(()))
    } else if copy.overwrite {
        catalog.add_version(&copy.name, &record, node).await.map(Ok)
    } else {
        catalog.add_copy(&copy.name, &record, node).await.map(Ok)
    };
    match added {
        Ok(Err(())) => Err("the file is no longer recorded (deleted by its owner?)".into()),
        Ok(Ok(AddedCopy::New | AddedCopy::Added | AddedCopy::Listed | AddedCopy::Replaced)) => {
            tracing::info!(name = %copy.name, node, "cluster: copy recorded");
            Ok(())
        }
        Ok(Ok(AddedCopy::Taken(existing))) => Err(format!(
            "the name is taken in the cluster by other bytes ({} bytes, {} {})",
            existing.size, existing.alg, existing.digest
        )),
        Err(e) => Err(format!("the catalog: {e}")),
    }
}
