//! The registrar's task: one session with etcd after another (a lease, the create-if-
//! absent transaction, keepalives and load reports, fenced by the lease), with backoff
//! between them, until the node withdraws or its [`Registrar`](super::Registrar) is
//! dropped. The policy is described in the parent module.

use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, MissedTickBehavior};

use crate::etcd::{EtcdConfig, Members};
use crate::record::{node_key, Load, NodeRecord};
use crate::{Error, Result, METRIC_FAILURES, METRIC_REGISTERED};

use super::config::RegistrationConfig;
use super::state::RegistrationState;

/// What the [`Registrar`](super::Registrar) handle asks of its task.
pub(super) enum Command {
    Withdraw(oneshot::Sender<Result<()>>),
}

/// How a session with etcd ended without an error.
enum Outcome {
    Withdrawn,
    /// The [`Registrar`] is gone.
    Abandoned,
}

pub(super) struct Task {
    etcd: EtcdConfig,
    config: RegistrationConfig,
    keys: Vec<String>,
    members: Option<Members>,
    /// The member the last session went to.
    at: usize,
    /// The lease the keys were last put under, while it may be alive.
    lease: Option<i64>,
    /// Failed sessions since the last one that registered: the backoff's exponent.
    attempt: u32,
    load: watch::Receiver<Load>,
    state: watch::Sender<RegistrationState>,
    commands: mpsc::UnboundedReceiver<Command>,
    registered: metrics::Gauge,
    failures: metrics::Counter,
}

impl Task {
    pub(super) fn new(
        etcd: EtcdConfig,
        config: RegistrationConfig,
        load: watch::Receiver<Load>,
        state: watch::Sender<RegistrationState>,
        commands: mpsc::UnboundedReceiver<Command>,
    ) -> Task {
        let labels = [
            ("cluster", config.cluster.clone()),
            ("node", config.node.clone()),
        ];
        Task {
            etcd,
            keys: config
                .services
                .iter()
                .map(|s| node_key(&config.cluster, s, &config.node))
                .collect(),
            registered: metrics::gauge!(METRIC_REGISTERED, &labels),
            failures: metrics::counter!(METRIC_FAILURES, &labels),
            config,
            members: None,
            at: 0,
            lease: None,
            attempt: 0,
            load,
            state,
            commands,
        }
    }

    pub(super) async fn run(mut self) {
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
            self.attempt = self.attempt.saturating_add(1);
            let attempt = self.attempt;
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
        // Failures "in a row" end here: the next one is retried after `retry_min`, not
        // after the longest delay a past outage reached (which, longer than the TTL,
        // turned every later hiccup into a lapsed lease).
        self.attempt = 0;
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
        let period = (ttl / 3).max(Duration::from_millis(200));
        let mut renew = tokio::time::interval(period);
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
                    if load == written {
                        continue;
                    }
                    // A load report is not worth the lease. One that etcd does not
                    // answer within a renewal period is given up and made again at the
                    // next tick, so the keepalives go on (waiting the whole request
                    // timeout, or ending the session, let a slow member's lease lapse:
                    // bench/notes/2026-11-29-wire-cluster-newcomers.md). Only a key no
                    // longer held by this lease ends the session.
                    match tokio::time::timeout(period, self.write(&mut client, lease, load, false)).await {
                        Ok(Ok(())) => written = load,
                        Ok(Err(lost @ Error::LeaseLost { .. })) => return Err(lost),
                        Ok(Err(error)) => {
                            tracing::debug!(%error, "cluster: load report failed; again at the next tick");
                        }
                        Err(_) => {
                            tracing::debug!(within = ?period, "cluster: load report not answered; again at the next tick");
                        }
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
