//! The signals a long-running example binary stops on.

use anyhow::{bail, Result};

/// Returns at SIGTERM or SIGINT: what a server binary waits for before it shuts down.
pub async fn shutdown_requested() -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => Ok(()),
        _ = int.recv() => Ok(()),
        else => bail!("signal streams closed"),
    }
}
