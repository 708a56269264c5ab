//! A server's side: its services registered under one lease, kept alive, its load
//! reported, withdrawn at shutdown.
//!
//! How etcd-based systems do it, and what was chosen here:
//! - **One lease per node**, TTL a few seconds (default 5), renewed every TTL/3 over
//!   etcd's keepalive stream. Every key of the node is attached to it: a node that dies
//!   (SIGKILL, power, a partition from etcd's majority) disappears from the registry
//!   when its lease expires, without anyone deleting anything.
//! - **Fencing by lease, in transactions.** Registering is one transaction: *if every
//!   key is absent* (`create_revision == 0`) *put them all under the new lease*. A key
//!   held by any other lease means another holder of the node id (a second server
//!   misconfigured with the same id, or this server's previous lease not yet expired);
//!   the registrar then says so ([`Error::NodeIdTaken`]) and retries, and takes over
//!   only once that lease is gone. Every later write (a load report, draining) is *if
//!   each key's lease is still ours, put*: once the lease is lost, nothing written
//!   under it can resurrect a key, and a lost lease is never reused; re-registration
//!   takes a fresh lease and the create-if-absent transaction again.
//! - **Resuming.** After etcd restarts (or a short outage), the registrar first checks,
//!   in one transaction, whether every key is still held by its lease (etcd keeps
//!   leases across a restart and renews them when a leader is elected); if so it goes on
//!   with it and watchers see no gap. Otherwise it revokes what is left and starts
//!   afresh.
//! - **etcd unreachable**: the server goes on serving. The registrar logs each failure
//!   (`tracing` at WARN), retries with exponential backoff (250 ms doubling to 5 s,
//!   spread per node), reports [`RegistrationState::Retrying`], and sets the gauge
//!   `rdmactor_cluster_registered{cluster,node}` to 0 (1 while registered).
//! - **Load** ([`Registrar::set_load`]) is written at most once per `load_interval`
//!   (default 2 s), and only when it changed.
//! - **Shutdown** ([`Registrar::withdraw`]): the records are marked draining (watchers
//!   see it, clients stop picking the node), then the lease is revoked, which deletes
//!   every key at once. The caller drains its connections after that. Dropping a
//!   [`Registrar`] without withdrawing stops the keepalive only: the keys stay until the
//!   lease expires, as after a crash.

use std::net::SocketAddr;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, MissedTickBehavior};

use crate::etcd::{EtcdConfig, Members};
use crate::record::{check_name, node_key, Load, NodeRecord};
use crate::{Error, Result, METRIC_FAILURES, METRIC_REGISTERED};

/// What a node registers, and how.
#[derive(Debug, Clone)]
pub struct RegistrationConfig {
    /// The cluster's name (the key's second part).
    pub cluster: String,
    /// This node's id: unique in the cluster, the same across restarts (the tools use
    /// the advertised address).
    pub node: String,
    /// Where clients connect.
    pub addr: SocketAddr,
    /// The services registered (one key each).
    pub services: Vec<String>,
    /// The version written into the records.
    pub version: String,
    /// The lease's time to live: how long a dead node stays listed at most. etcd rounds
    /// it up to its minimum (about 2 s with default election timings).
    pub ttl: Duration,
    /// Load reports are written at most this often.
    pub load_interval: Duration,
    /// The first retry's delay; each failure in a row doubles it up to `retry_max`.
    pub retry_min: Duration,
    /// The longest delay between retries.
    pub retry_max: Duration,
}

impl RegistrationConfig {
    /// `node` serving `services` at `addr` in `cluster`, with the defaults: TTL 5 s, a
    /// load report at most every 2 s, retries from 250 ms to 5 s, this crate's version.
    pub fn new<S: Into<String>>(
        cluster: impl Into<String>,
        node: impl Into<String>,
        addr: SocketAddr,
        services: impl IntoIterator<Item = S>,
    ) -> RegistrationConfig {
        RegistrationConfig {
            cluster: cluster.into(),
            node: node.into(),
            addr,
            services: services.into_iter().map(Into::into).collect(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            ttl: Duration::from_secs(5),
            load_interval: Duration::from_secs(2),
            retry_min: Duration::from_millis(250),
            retry_max: Duration::from_secs(5),
        }
    }

    /// The names, checked against the key layout.
    fn validate(&self) -> Result<()> {
        check_name("cluster", &self.cluster)?;
        check_name("node", &self.node)?;
        if self.services.is_empty() {
            return Err(Error::InvalidName {
                what: "service",
                name: String::new(),
                why: "list is empty: a node registers at least one service",
            });
        }
        for service in &self.services {
            check_name("service", service)?;
        }
        Ok(())
    }

    fn ttl_secs(&self) -> i64 {
        self.ttl.as_secs().max(1) as i64
    }
}

/// Where a node's registration stands.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RegistrationState {
    /// The first attempt is under way.
    Connecting,
    /// Every service is registered under this lease, kept alive.
    Registered {
        /// The lease.
        lease: i64,
    },
    /// Not registered (etcd unreachable, the lease lost, the node id taken): retrying.
    /// The server goes on serving meanwhile.
    Retrying {
        /// Failures in a row.
        attempt: u32,
        /// The last one.
        error: String,
    },
    /// Marked draining; the lease is being revoked.
    Draining,
    /// Withdrawn: no key of this node is left under its lease.
    Withdrawn,
}

impl RegistrationState {
    /// Whether the node is listed and kept alive now.
    pub fn is_registered(&self) -> bool {
        matches!(self, RegistrationState::Registered { .. })
    }
}

enum Command {
    Withdraw(oneshot::Sender<Result<()>>),
}

/// A node's registration, kept up by a task on the tokio runtime it was started on.
#[derive(Debug)]
pub struct Registrar {
    commands: mpsc::UnboundedSender<Command>,
    load: watch::Sender<Load>,
    state: watch::Receiver<RegistrationState>,
    task: tokio::task::JoinHandle<()>,
}

impl Registrar {
    /// Starts registering: returns at once, the first attempt runs in the background
    /// (see [`state`](Self::state)). Must be called inside a tokio runtime (an actix
    /// `System` is one).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a name that breaks the key layout, or no service;
    /// [`Error::NoEndpoints`]. etcd being down is no error here: the registrar retries.
    pub fn start(etcd: EtcdConfig, config: RegistrationConfig) -> Result<Registrar> {
        config.validate()?;
        if etcd.endpoints.is_empty() {
            return Err(Error::NoEndpoints);
        }
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let (load, load_rx) = watch::channel(Load::default());
        let (state_tx, state) = watch::channel(RegistrationState::Connecting);
        let labels = [
            ("cluster", config.cluster.clone()),
            ("node", config.node.clone()),
        ];
        let task = Task {
            etcd,
            keys: config
                .services
                .iter()
                .map(|s| node_key(&config.cluster, s, &config.node))
                .collect(),
            config,
            members: None,
            at: 0,
            lease: None,
            load: load_rx,
            state: state_tx,
            commands: commands_rx,
            registered: metrics::gauge!(METRIC_REGISTERED, &labels),
            failures: metrics::counter!(METRIC_FAILURES, &labels),
        };
        let task = tokio::spawn(task.run());
        Ok(Registrar {
            commands,
            load,
            state,
            task,
        })
    }

    /// The node's load now; written at the next report (rate-limited).
    pub fn set_load(&self, load: Load) {
        self.load.send_replace(load);
    }

    /// Where the registration stands.
    pub fn state(&self) -> RegistrationState {
        self.state.borrow().clone()
    }

    /// The state, to wait on its changes.
    pub fn states(&self) -> watch::Receiver<RegistrationState> {
        self.state.clone()
    }

    /// Marks every record draining, then revokes the lease (every key goes at once),
    /// and stops. Call it before draining the server's connections. Each etcd call
    /// takes at most the configured request timeout; if etcd is unreachable, the
    /// error says so and the lease expires on its own within the TTL.
    pub async fn withdraw(self) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        if self.commands.send(Command::Withdraw(tx)).is_err() {
            return Err(Error::Stopped);
        }
        rx.await.unwrap_or(Err(Error::Stopped))
    }
}

impl Drop for Registrar {
    /// Stops the keepalive without withdrawing: the keys stay until the lease expires,
    /// as after a crash.
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How a session with etcd ended without an error.
enum Outcome {
    Withdrawn,
    /// The [`Registrar`] is gone.
    Abandoned,
}

struct Task {
    etcd: EtcdConfig,
    config: RegistrationConfig,
    keys: Vec<String>,
    members: Option<Members>,
    /// The member the last session went to.
    at: usize,
    /// The lease the keys were last put under, while it may be alive.
    lease: Option<i64>,
    load: watch::Receiver<Load>,
    state: watch::Sender<RegistrationState>,
    commands: mpsc::UnboundedReceiver<Command>,
    registered: metrics::Gauge,
    failures: metrics::Counter,
}

impl Task {
    async fn run(mut self) {
        let mut attempt: u32 = 0;
        loop {
            let error = match self.session().await {
                Ok(Outcome::Withdrawn | Outcome::Abandoned) => return,
                Err(error) => error,
            };
            self.registered.set(0.0);
            self.failures.increment(1);
            if let Some(members) = &self.members {
                members.leave(self.at, &error);
            }
            if matches!(error, Error::LeaseLost { .. }) {
                self.lease = None;
            }
            attempt = attempt.saturating_add(1);
            let delay = self.backoff(attempt);
            tracing::warn!(
                cluster = %self.config.cluster,
                node = %self.config.node,
                attempt,
                retry_in = ?delay,
                %error,
                "cluster: not registered; serving on, retrying"
            );
            self.state.send_replace(RegistrationState::Retrying {
                attempt,
                error: error.to_string(),
            });
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                command = self.commands.recv() => {
                    match command {
                        Some(Command::Withdraw(reply)) => {
                            let _ = reply.send(self.withdraw_unregistered().await);
                        }
                        None => {}
                    }
                    return;
                }
            }
        }
    }

    /// `retry_min` doubled per failure up to `retry_max`, less up to a quarter picked
    /// by the node id: servers that lost etcd together do not all come back at once.
    fn backoff(&self, attempt: u32) -> Duration {
        let doubled = self
            .config
            .retry_min
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
        let delay = doubled.min(self.config.retry_max);
        let spread = crate::pick::rendezvous_weight(&self.config.node, &attempt.to_le_bytes());
        let quarter = delay.as_millis() as u64 / 4;
        delay.saturating_sub(Duration::from_millis(spread % (quarter + 1)))
    }

    /// Registers (or resumes) and keeps the lease alive until an error, a withdraw, or
    /// the registrar being dropped.
    async fn session(&mut self) -> Result<Outcome> {
        let members = match &self.members {
            Some(members) => members.clone(),
            None => {
                let members = self.etcd.connect().await?;
                self.members = Some(members.clone());
                members
            }
        };
        // One member for the whole session: the lease's keepalive stream and the writes
        // under it. A session that ends in a failure of the member's (no leader: every
        // call requires one, and etcd ends the keepalive stream of a member that lost
        // it) leaves it, and the next session registers through the next member.
        let (at, mut client) = members.current();
        self.at = at;
        let written = *self.load.borrow_and_update();
        let lease = self.register(&mut client, written).await?;
        self.registered.set(1.0);
        tracing::info!(
            cluster = %self.config.cluster,
            node = %self.config.node,
            lease = format_args!("{lease:x}"),
            services = ?self.config.services,
            "cluster: registered"
        );
        self.state
            .send_replace(RegistrationState::Registered { lease });
        let (mut keeper, mut answers) = self
            .etcd
            .call("lease keepalive", client.lease_keep_alive(lease))
            .await?;
        let ttl = self.config.ttl;
        let mut renew = tokio::time::interval((ttl / 3).max(Duration::from_millis(200)));
        renew.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut report = tokio::time::interval(self.config.load_interval);
        report.set_missed_tick_behavior(MissedTickBehavior::Delay);
        report.reset();
        let mut last_answer = Instant::now();
        let mut written = written;
        loop {
            tokio::select! {
                _ = renew.tick() => {
                    // etcd grants at least the TTL asked for; no answer for that long
                    // means the lease may have expired: start over.
                    if last_answer.elapsed() > ttl {
                        return Err(Error::LeaseLost {
                            lease,
                            why: format!("no keepalive answer for {ttl:?}"),
                        });
                    }
                    keeper.keep_alive().await.map_err(|source| Error::Etcd {
                        op: "lease keepalive",
                        source: Box::new(source),
                    })?;
                }
                answer = answers.message() => match answer {
                    Ok(Some(answer)) if answer.ttl() > 0 => last_answer = Instant::now(),
                    Ok(Some(_)) => {
                        return Err(Error::LeaseLost {
                            lease,
                            why: "etcd says it expired or was revoked".into(),
                        })
                    }
                    Ok(None) => {
                        return Err(Error::Etcd {
                            op: "lease keepalive",
                            source: Box::new(etcd_client::Error::LeaseKeepAliveError(
                                "the stream ended".into(),
                            )),
                        })
                    }
                    Err(source) => {
                        return Err(Error::Etcd {
                            op: "lease keepalive",
                            source: Box::new(source),
                        })
                    }
                },
                _ = report.tick() => {
                    let load = *self.load.borrow_and_update();
                    if load != written {
                        self.write(&mut client, lease, load, false).await?;
                        written = load;
                    }
                }
                command = self.commands.recv() => {
                    let Some(Command::Withdraw(reply)) = command else {
                        return Ok(Outcome::Abandoned);
                    };
                    let load = *self.load.borrow();
                    let result = self.withdraw(&mut client, lease, load).await;
                    let _ = reply.send(result);
                    return Ok(Outcome::Withdrawn);
                }
            }
        }
    }

    fn record(&self, service: &str, load: Load, draining: bool) -> Vec<u8> {
        NodeRecord {
            node: self.config.node.clone(),
            service: service.to_owned(),
            addr: self.config.addr,
            version: self.config.version.clone(),
            draining,
            load,
        }
        .to_json()
    }

    fn puts(&self, lease: i64, load: Load, draining: bool) -> Vec<TxnOp> {
        self.keys
            .iter()
            .zip(&self.config.services)
            .map(|(key, service)| {
                TxnOp::put(
                    key.as_str(),
                    self.record(service, load, draining),
                    Some(PutOptions::new().with_lease(lease)),
                )
            })
            .collect()
    }

    /// Puts every record, if every key is still held by `lease`.
    async fn write(
        &self,
        client: &mut Client,
        lease: i64,
        load: Load,
        draining: bool,
    ) -> Result<()> {
        let held: Vec<Compare> = self
            .keys
            .iter()
            .map(|key| Compare::lease(key.as_str(), CompareOp::Equal, lease))
            .collect();
        let txn = Txn::new()
            .when(held)
            .and_then(self.puts(lease, load, draining));
        let answer = self.etcd.call("update txn", client.txn(txn)).await?;
        if answer.succeeded() {
            Ok(())
        } else {
            Err(Error::LeaseLost {
                lease,
                why: "a key of this node is no longer held by it".into(),
            })
        }
    }

    /// Resumes the lease the keys were put under if it still holds them all, or
    /// registers under a fresh lease if no key of this node exists.
    async fn register(&mut self, client: &mut Client, load: Load) -> Result<i64> {
        if let Some(old) = self.lease {
            match self.write(client, old, load, false).await {
                Ok(()) => return Ok(old),
                Err(Error::LeaseLost { .. }) => {
                    // What is left under it goes; a missing lease is no error.
                    if let Err(err) = self
                        .etcd
                        .call("lease revoke", client.lease_revoke(old))
                        .await
                    {
                        tracing::debug!(%err, "cluster: revoking a lost lease");
                    }
                    self.lease = None;
                }
                Err(other) => return Err(other),
            }
        }
        let grant = self
            .etcd
            .call(
                "lease grant",
                client.lease_grant(self.config.ttl_secs(), None),
            )
            .await?;
        let lease = grant.id();
        let absent: Vec<Compare> = self
            .keys
            .iter()
            .map(|key| Compare::create_revision(key.as_str(), CompareOp::Equal, 0))
            .collect();
        let holders: Vec<TxnOp> = self
            .keys
            .iter()
            .map(|key| TxnOp::get(key.as_str(), None))
            .collect();
        let txn = Txn::new()
            .when(absent)
            .and_then(self.puts(lease, load, false))
            .or_else(holders);
        let answer = match self.etcd.call("register txn", client.txn(txn)).await {
            Ok(answer) => answer,
            Err(err) => {
                let _ = self
                    .etcd
                    .call("lease revoke", client.lease_revoke(lease))
                    .await;
                return Err(err);
            }
        };
        if answer.succeeded() {
            self.lease = Some(lease);
            return Ok(lease);
        }
        let _ = self
            .etcd
            .call("lease revoke", client.lease_revoke(lease))
            .await;
        let taken = answer
            .op_responses()
            .into_iter()
            .filter_map(|op| match op {
                TxnOpResponse::Get(get) => get.kvs().first().cloned(),
                _ => None,
            })
            .next();
        Err(match taken {
            Some(kv) => Error::NodeIdTaken {
                node: self.config.node.clone(),
                key: String::from_utf8_lossy(kv.key()).into_owned(),
                lease: kv.lease(),
            },
            // Deleted between the compare and the read: the next attempt will do.
            None => Error::NodeIdTaken {
                node: self.config.node.clone(),
                key: self.keys[0].clone(),
                lease: 0,
            },
        })
    }

    /// Draining, then the lease revoked.
    async fn withdraw(&mut self, client: &mut Client, lease: i64, load: Load) -> Result<()> {
        self.state.send_replace(RegistrationState::Draining);
        let marked = self.write(client, lease, load, true).await;
        if let Err(err) = &marked {
            tracing::warn!(%err, "cluster: marking the node draining");
        }
        let revoked = self
            .etcd
            .call("lease revoke", client.lease_revoke(lease))
            .await
            .map(drop);
        self.finish(revoked.and(marked))
    }

    /// A withdraw while not registered: revokes the last lease if there may be one.
    async fn withdraw_unregistered(&mut self) -> Result<()> {
        self.state.send_replace(RegistrationState::Draining);
        let result = match (self.lease, self.members.clone()) {
            (Some(lease), Some(members)) => members
                .idempotent("lease revoke", |mut client| async move {
                    client.lease_revoke(lease).await
                })
                .await
                .map(drop),
            _ => Ok(()),
        };
        self.finish(result)
    }

    fn finish(&mut self, result: Result<()>) -> Result<()> {
        self.lease = None;
        self.registered.set(0.0);
        match &result {
            Ok(()) => tracing::info!(
                cluster = %self.config.cluster,
                node = %self.config.node,
                "cluster: withdrawn"
            ),
            Err(err) => tracing::warn!(
                cluster = %self.config.cluster,
                node = %self.config.node,
                %err,
                "cluster: withdraw incomplete; the lease expires within its TTL"
            ),
        }
        self.state.send_replace(RegistrationState::Withdrawn);
        result
    }
}
