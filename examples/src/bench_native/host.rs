//! A server in an actix System of its own, on a thread of its own: as a server process
//! would be, but on the same loopback fabric as the bench's clients. Its CM actor runs
//! on that thread, its pollers on the threads it starts; the threads that appear while
//! it starts are the server's ([`cpu::Threads`]), whose CPU time is the server's.

use std::net::SocketAddr;

use anyhow::{anyhow, Context as _, Result};
use rdmactor::runtime::{KeySet, Keys, NodeConfig, Server};
use rdmactor::transport::loopback::{Fabric, Loopback};
use rdmactor_services::echo::{Discard, Echo};

use super::cpu;

/// Connections a bench server accepts.
pub const MAX_CONNECTIONS: usize = 20_000;

/// A running server of `echo` and `discard`.
pub struct Host {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its threads: the System's, the pollers, the CM event reader.
    pub threads: cpu::Threads,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Host {
    /// Starts a server on a new device `name` of `fabric`, listening on `addr`. No other
    /// thread may start meanwhile (the bench starts its servers before its clients, or
    /// while they are idle), or it would be counted as the server's.
    pub fn start(
        fabric: &Fabric,
        name: &str,
        addr: SocketAddr,
        config: NodeConfig,
    ) -> Result<Host> {
        Host::start_keyed(fabric, name, addr, config, None)
    }

    /// [`start`](Self::start), authenticating clients with `keys` when given (then
    /// `echo` and `discard` are authenticated-only).
    pub fn start_keyed(
        fabric: &Fabric,
        name: &str,
        addr: SocketAddr,
        config: NodeConfig,
        keys: Option<KeySet>,
    ) -> Result<Host> {
        let before = cpu::tids().context("listing the process's threads")?;
        let device = fabric.device(name);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<SocketAddr, String>>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("srv-{name}"))
            .spawn(move || {
                actix::System::new().block_on(async move {
                    let mut builder = Server::over(Loopback)
                        .domain(device)
                        .config(config)
                        .listen(addr, None)
                        .service("echo", Echo)
                        .service("discard", Discard)
                        // Every client of the bench is one peer; the idle-heap figure
                        // holds 10,000 connections.
                        .max_connections(MAX_CONNECTIONS)
                        .max_connections_per_peer(0);
                    if let Some(keys) = keys {
                        builder = builder.authorized_keys(Keys::from_set(keys));
                    }
                    let started = builder.start();
                    let server = match started {
                        Ok(server) => server,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e.to_string()));
                            return;
                        }
                    };
                    // An answer from the CM actor: it has started, and with it the
                    // thread that reads its events.
                    let _ = server.stats().await;
                    let _ = ready_tx.send(Ok(server.local_addrs()[0]));
                    let _ = stop_rx.await;
                    server.shutdown().await;
                })
            })
            .context("starting the server's thread")?;
        let addr = ready_rx
            .recv()
            .map_err(|_| anyhow!("the server {name} thread ended before it served"))?
            .map_err(|e| anyhow!("server {name}: {e}"))?;
        let after = cpu::tids().context("listing the process's threads")?;
        Ok(Host {
            addr,
            threads: cpu::Threads::new_since(&before, &after),
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// Shuts the server down and waits for its thread.
    pub fn stop(mut self) {
        self.shut();
    }

    fn shut(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.shut();
    }
}
