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

use super::catalog::{AddedCopy, Catalog};
use super::FileRecord;
use crate::etcd::EtcdConfig;
use crate::{Error, Result};

type Request = (StoredCopy, oneshot::Sender<std::result::Result<(), String>>);

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
                    while let Some((copy, answer)) = rx.recv().await {
                        let recorded = match me.get() {
                            Some(me) => record(&catalog, me, &copy).await,
                            None => Err("this server is not in its cluster yet".to_owned()),
                        };
                        let _ = answer.send(recorded);
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
    /// A recorded file's replicas must all hold the recorded bytes: an upload that
    /// would replace one in place is refused before it takes the name.
    fn admit(&self, copy: &StoredCopy) -> std::result::Result<(), String> {
        if copy.overwrite {
            return Err("a cluster's files are not overwritten in place".into());
        }
        Ok(())
    }

    fn record(&self, copy: &StoredCopy) -> std::result::Result<(), String> {
        let (answer, answered) = oneshot::channel();
        self.requests
            .send((copy.clone(), answer))
            .map_err(|_| "the recorder's thread has stopped".to_owned())?;
        answered
            .blocking_recv()
            .map_err(|_| "the recorder's thread has stopped".to_owned())?
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
    match catalog.add_copy(&copy.name, &record, node).await {
        Ok(AddedCopy::New | AddedCopy::Added | AddedCopy::Listed) => {
            tracing::info!(name = %copy.name, node, "cluster: copy recorded");
            Ok(())
        }
        Ok(AddedCopy::Taken(existing)) => Err(format!(
            "the name is taken in the cluster by other bytes ({} bytes, {} {})",
            existing.size, existing.alg, existing.digest
        )),
        Err(e) => Err(format!("the catalog: {e}")),
    }
}
