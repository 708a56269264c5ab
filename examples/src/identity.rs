//! `--key FILE`: the credential a client tool proves its identity with, on services of a
//! server with authorized keys (see `keygen`, and docs/operations.md, "Who is
//! connecting").

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use rdmactor::runtime::{Client, Credential};

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
