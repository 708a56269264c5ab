//! `--key FILE`: the credential a client tool proves its identity with, on services of a
//! server with authorized keys (see `keygen`, and docs/operations.md, "Who is
//! connecting").

use std::path::PathBuf;

use anyhow::{bail, Context as _, Result};
use rdmactor::runtime::{Client, Credential, Keys, Server, ServerBuilder};

/// `--key FILE`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Key {
    /// Prove this identity to authenticated-only services: a key file written by
    /// `keygen` (`rdmactor-key v1`, the identity, an Ed25519 seed or a PSK).
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
}

impl Key {
    /// `client` with the credential, when one was given.
    pub fn apply(&self, client: Client) -> Result<Client> {
        let Some(path) = &self.key else {
            return Ok(client);
        };
        let credential =
            Credential::load(path).with_context(|| format!("--key {}", path.display()))?;
        Ok(client.with_identity(credential))
    }
}

/// Services for stock rdma-core tools (rping, `ibv_*_pingpong`), which cannot
/// authenticate: anonymous on a server with keys too.
pub const STOCK_TOOL_SERVICES: [&str; 5] =
    ["raw-echo", "rping", "stock-rc", "stock-ud", "stock-srq"];

/// `server --authorized-keys FILE --anonymous SERVICE...`: `builder` with the keys, and
/// the stock-tool services and `anonymous` open to anonymous clients.
pub fn keyed(
    mut builder: ServerBuilder,
    keys: Option<&std::path::Path>,
    anonymous: &[String],
) -> Result<ServerBuilder> {
    let Some(path) = keys else {
        if !anonymous.is_empty() {
            bail!("--anonymous needs --authorized-keys: without keys every service is anonymous");
        }
        return Ok(builder);
    };
    let keys = Keys::load(path).with_context(|| format!("--authorized-keys {}", path.display()))?;
    builder = builder.authorized_keys(keys);
    let stock = STOCK_TOOL_SERVICES.iter().copied();
    for name in stock.chain(anonymous.iter().map(String::as_str)) {
        builder = builder.anonymous(name);
    }
    Ok(builder)
}

/// Reloads the authorized keys on every SIGHUP; a file that does not parse leaves the
/// old keys in force, and says why. Runs until the process ends.
pub async fn reload_on_sighup(server: &Server) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = signal(SignalKind::hangup()).context("listening for SIGHUP")?;
    while hup.recv().await.is_some() {
        match server.reload_keys().await {
            Ok(closed) => {
                println!("authorized keys reloaded: {closed} connections of removed keys closed")
            }
            Err(e) => eprintln!("authorized keys not reloaded (the old ones stay): {e}"),
        }
    }
    Ok(())
}
