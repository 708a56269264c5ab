//! A client's side: the live nodes of one service, kept current by a watch.
//!
//! The usual pattern for etcd: read the prefix, then watch it from the revision after
//! the read, so that no change falls between the two. When the watch fails (etcd
//! restarted, unreachable, or compacted past the revision asked for), the watcher
//! reads the prefix again and watches from there: a re-sync replaces the list whole.
//! While etcd is unreachable the last list stays ([`Membership::is_synced`] is false):
//! a stale entry costs a failed connect and a pick of another node, an empty list
//! would cost every connect.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{EventType, GetOptions, WatchOptions};
use tokio::sync::watch;

use crate::etcd::{EtcdConfig, Members};
use crate::record::{check_name, service_prefix};
use crate::table::{Entry, MemberTable};
use crate::{Error, NodeInfo, Result};

/// The nodes serving one service of a cluster, watched. Cheap to clone; the watch
/// stops when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct Membership {
    state: Arc<State>,
    _task: Arc<AbortOnDrop>,
}

#[derive(Debug)]
struct State {
    cluster: String,
    service: String,
    table: Mutex<MemberTable>,
    synced: AtomicBool,
    /// Bumped on every change of the table or of `synced`.
    changes: watch::Sender<u64>,
}

#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Membership {
    /// Starts watching `service` in `cluster`; returns at once (the first read runs in
    /// the background: see [`wait_for`](Self::wait_for)). Must be called inside a tokio
    /// runtime.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`], [`Error::NoEndpoints`]. etcd being down is no error: the
    /// watcher retries.
    pub fn watch(etcd: EtcdConfig, cluster: &str, service: &str) -> Result<Membership> {
        check_name("cluster", cluster)?;
        check_name("service", service)?;
        if etcd.endpoints.is_empty() {
            return Err(Error::NoEndpoints);
        }
        let state = Arc::new(State {
            cluster: cluster.to_owned(),
            service: service.to_owned(),
            table: Mutex::new(MemberTable::new(service_prefix(cluster, service))),
            synced: AtomicBool::new(false),
            changes: watch::channel(0).0,
        });
        let task = tokio::spawn(run(etcd, state.clone()));
        Ok(Membership {
            state,
            _task: Arc::new(AbortOnDrop(task)),
        })
    }

    /// The cluster watched.
    pub fn cluster(&self) -> &str {
        &self.state.cluster
    }

    /// The service watched.
    pub fn service(&self) -> &str {
        &self.state.service
    }

    /// Every node listed, draining ones included, by id.
    pub fn nodes(&self) -> Vec<NodeInfo> {
        self.state.table.lock().expect("table lock").nodes()
    }

    /// The nodes listed and not draining, by id.
    pub fn live(&self) -> Vec<NodeInfo> {
        let mut nodes = self.nodes();
        nodes.retain(|n| !n.record.draining);
        nodes
    }

    /// The etcd revision the list is complete up to (0 before the first read).
    pub fn revision(&self) -> i64 {
        self.state.table.lock().expect("table lock").revision()
    }

    /// Whether the list is current: read, and watched since. False before the first
    /// read and while etcd is unreachable (the last list is kept meanwhile).
    pub fn is_synced(&self) -> bool {
        self.state.synced.load(Ordering::Acquire)
    }

    /// A counter bumped on every change (of the list, or of [`is_synced`](Self::is_synced)),
    /// to wait on.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.state.changes.subscribe()
    }

    /// Waits until the list (every node, draining ones included) satisfies `pred`, at
    /// most `timeout`; returns that list, or `None` on timeout.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        mut pred: impl FnMut(&[NodeInfo]) -> bool,
    ) -> Option<Vec<NodeInfo>> {
        let mut changes = self.changes();
        let wait = async {
            loop {
                changes.borrow_and_update();
                let nodes = self.nodes();
                if pred(&nodes) {
                    return nodes;
                }
                if changes.changed().await.is_err() {
                    // The task is gone (it never ends while a clone lives): wait out.
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.ok()
    }
}

impl State {
    fn bump(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn set_synced(&self, synced: bool) {
        if self.synced.swap(synced, Ordering::AcqRel) != synced {
            self.bump();
        }
    }
}

async fn run(etcd: EtcdConfig, state: Arc<State>) {
    let mut client = None;
    let mut failures: u32 = 0;
    loop {
        let error = sync_and_watch(&etcd, &state, &mut client, &mut failures).await;
        state.set_synced(false);
        failures = failures.saturating_add(1);
        let delay = Duration::from_millis(250)
            .saturating_mul(1 << failures.saturating_sub(1).min(5))
            .min(Duration::from_secs(5));
        tracing::warn!(
            cluster = %state.cluster,
            service = %state.service,
            %error,
            retry_in = ?delay,
            "cluster: registry watch interrupted; keeping the last list"
        );
        tokio::time::sleep(delay).await;
    }
}

/// Reads the prefix, then applies the watch's events until it fails. Both go to the
/// current member, which a failure of its own leaves for the next: a read that cannot
/// be answered there (no leader: linearizable reads need the quorum) is made on the next
/// member at once, and a watch that the member ends (it lost its leader: the watch
/// requires one) or that breaks moves the re-sync to the next member.
async fn sync_and_watch(
    etcd: &EtcdConfig,
    state: &State,
    client: &mut Option<Members>,
    failures: &mut u32,
) -> Error {
    let members = match client {
        Some(c) => c.clone(),
        None => match etcd.connect().await {
            Ok(c) => {
                *client = Some(c.clone());
                c
            }
            Err(err) => return err,
        },
    };
    let prefix = service_prefix(&state.cluster, &state.service);
    let read = match members
        .idempotent("get", |mut c| {
            let prefix = prefix.clone();
            async move { c.get(prefix, Some(GetOptions::new().with_prefix())).await }
        })
        .await
    {
        Ok(read) => read,
        Err(err) => return err,
    };
    let revision = read.header().map_or(0, |h| h.revision());
    let (at, mut stream) = match members
        .idempotent_at("watch", |mut c| {
            let prefix = prefix.clone();
            async move {
                c.watch(
                    prefix,
                    Some(
                        WatchOptions::new()
                            .with_prefix()
                            .with_start_revision(revision + 1),
                    ),
                )
                .await
            }
        })
        .await
    {
        Ok(stream) => stream,
        Err(err) => return err,
    };
    let error = watch(state, &mut stream, revision, &read, failures).await;
    members.leave(at, &error);
    error
}

/// Applies the read, then the watch's events until it fails.
async fn watch(
    state: &State,
    stream: &mut etcd_client::WatchStream,
    revision: i64,
    read: &etcd_client::GetResponse,
    failures: &mut u32,
) -> Error {
    {
        let mut table = state.table.lock().expect("table lock");
        table.handle_snapshot(
            revision,
            read.kvs().iter().filter_map(|kv| {
                Some(Entry {
                    key: kv.key_str().ok()?,
                    value: kv.value(),
                    lease: kv.lease(),
                    mod_revision: kv.mod_revision(),
                })
            }),
        );
    }
    state.synced.store(true, Ordering::Release);
    state.bump();
    *failures = 0;
    tracing::debug!(service = %state.service, revision, "cluster: registry read; watching");
    loop {
        let answer = match stream.message().await {
            Ok(Some(answer)) => answer,
            Ok(None) => {
                return Error::Etcd {
                    op: "watch",
                    source: Box::new(etcd_client::Error::WatchError("the stream ended".into())),
                }
            }
            Err(source) => {
                return Error::Etcd {
                    op: "watch",
                    source: Box::new(source),
                }
            }
        };
        if answer.canceled() {
            let why = if answer.compact_revision() > 0 {
                format!(
                    "compacted to revision {} (re-reading)",
                    answer.compact_revision()
                )
            } else {
                format!("cancelled: {}", answer.cancel_reason())
            };
            return Error::Etcd {
                op: "watch",
                source: Box::new(etcd_client::Error::WatchError(why)),
            };
        }
        let mut changed = false;
        {
            let mut table = state.table.lock().expect("table lock");
            for event in answer.events() {
                let Some(kv) = event.kv() else { continue };
                let Ok(key) = kv.key_str() else { continue };
                changed |= match event.event_type() {
                    EventType::Put => table.handle_put(Entry {
                        key,
                        value: kv.value(),
                        lease: kv.lease(),
                        mod_revision: kv.mod_revision(),
                    }),
                    EventType::Delete => table.handle_delete(key, kv.mod_revision()),
                };
            }
        }
        if changed {
            state.bump();
        }
    }
}
