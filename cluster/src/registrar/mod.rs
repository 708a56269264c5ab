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
//!   spread per node, back to 250 ms once a session has registered), reports [`RegistrationState::Retrying`], and sets the gauge
//!   `rdmactor_cluster_registered{cluster,node}` to 0 (1 while registered).
//! - **Load** ([`Registrar::set_load`]) is written at most once per `load_interval`
//!   (default 2 s), and only when it changed. A report etcd does not answer within a
//!   renewal period (TTL/3) is made again at the next tick: a slow member delays the
//!   load others see, not the keepalives, and does not end the session.
//! - **Shutdown** ([`Registrar::withdraw`]): the records are marked draining (watchers
//!   see it, clients stop picking the node), then the lease is revoked, which deletes
//!   every key at once. The caller drains its connections after that. Dropping a
//!   [`Registrar`] without withdrawing stops the keepalive only: the keys stay until the
//!   lease expires, as after a crash.

use tokio::sync::{mpsc, oneshot, watch};

use crate::etcd::EtcdConfig;
use crate::record::Load;
use crate::{Error, Result};

mod config;
mod state;
mod task;

pub use config::RegistrationConfig;
pub use state::RegistrationState;
use task::{Command, Task};

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
        let task = tokio::spawn(Task::new(etcd, config, load_rx, state_tx, commands_rx).run());
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
