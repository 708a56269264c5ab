//! The server's `files` flags, and the service they make: apart from the server's
//! other flags because the files service has the most of them.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context as _, Result};
use rdmactor_cluster::files::CatalogRecorder;
use rdmactor_services::file_transfer::{ClientQuota, Config as FilesConfig, FileTransfer};

/// `--files-dir` and the flags that shape the `files` service.
#[derive(clap::Args, Debug, Clone)]
pub struct FilesArgs {
    /// Serve the `files` service (uploads, downloads) from this directory; without it
    /// the service is not offered.
    #[arg(long)]
    pub files_dir: Option<PathBuf>,
    /// Largest file the `files` service accepts, in bytes.
    #[arg(long, default_value_t = FilesConfig::DEFAULT_MAX_SIZE)]
    pub max_file_size: u64,
    /// `ID=KEY`: the secret the `files` service answers to `Identify` with ID after a
    /// GOOD upload of a new, non-empty file named ID. Repeatable. Shows in
    /// /proc/PID/cmdline: prefer --secret-file.
    #[arg(long = "secret", value_name = "ID=KEY")]
    pub secrets: Vec<String>,
    /// A file of `ID=KEY` lines (`#` comments), read like --secret.
    #[arg(long, value_name = "PATH")]
    pub secret_file: Option<PathBuf>,
    /// Let every client fetch every regular, non-hidden file of --files-dir (default:
    /// only files it uploaded on the same connection).
    #[arg(long)]
    pub files_public_fetch: bool,
    /// An identity (from --authorized-keys) trusted to copy files between servers for
    /// their owners: a cluster's servers, each proving its own --repair-key. It
    /// fetches any file and stores copies as their owner's, so a cluster repairs
    /// without --files-public-fetch and a repaired copy stays its owner's alone.
    /// Repeatable.
    #[arg(long = "files-replicator", value_name = "IDENTITY")]
    pub files_replicators: Vec<String>,
    /// Let every client overwrite every file (default: only its own uploads).
    #[arg(long)]
    pub files_overwrite_others: bool,
    /// Slots in the window the `files` service grants an upload (chunks in flight).
    #[arg(long, default_value_t = FilesConfig::DEFAULT_SLOTS)]
    pub file_slots: u32,
    /// Bytes per slot of that window (the chunk size), in KiB.
    #[arg(long, default_value_t = FilesConfig::DEFAULT_SLOT_LEN >> 10)]
    pub file_slot_kib: u32,
    /// Uploads one client host (IP address) may run at once, over all its connections;
    /// more are refused with a quota reason.
    #[arg(long, default_value_t = ClientQuota::default().uploads)]
    pub files_client_uploads: u32,
    /// At shutdown, how long uploads under way may still run (new ones are refused
    /// with "the server is shutting down").
    #[arg(long, default_value_t = 10)]
    pub files_drain_secs: u64,
    /// Bytes one client host may have admitted and not yet stored, in MiB.
    #[arg(long, default_value_t = ClientQuota::default().reserved_bytes >> 20)]
    pub files_client_mib: u64,
    /// A transfer that waits this long on its client (for the grant, a chunk, an
    /// acknowledgement) is ended with a "stalled" reason, and its window, staging,
    /// quota share and reserved disk are freed. 0 waits for ever.
    #[arg(long, default_value_t = FilesConfig::DEFAULT_STALL.as_secs())]
    pub files_stall_secs: u64,
    /// Fetches one client host may have being hashed at once, over all its
    /// connections; more are refused with a quota reason. Fetches of files whose digest
    /// is known (stored or served before, unchanged since) do not count.
    #[arg(long, default_value_t = FilesConfig::DEFAULT_FETCH_PREPARATIONS)]
    pub files_fetch_preparations: u32,
    /// Uploads the `files` service stages at once over every client (temporary file,
    /// disk reserved, window); more are refused with a "server is full" reason. Bounds
    /// what many client hosts, each within --files-client-uploads, hold together.
    #[arg(long, default_value_t = FilesConfig::DEFAULT_MAX_UPLOADS)]
    pub files_max_uploads: u32,
    /// Digests of stored and served files kept in memory, so that fetching them again
    /// does not read them whole. 0 keeps none.
    #[arg(long, default_value_t = rdmactor_services::file_transfer::DigestCache::DEFAULT_CAPACITY)]
    pub files_digest_cache: usize,
}

impl FilesArgs {
    /// The `files` service, if `--files-dir` asks for it.
    pub fn service(&self, recorder: Option<Arc<CatalogRecorder>>) -> Result<Option<FileTransfer>> {
        let Some(dir) = &self.files_dir else {
            if !self.secrets.is_empty() || self.secret_file.is_some() {
                bail!("--secret and --secret-file need --files-dir");
            }
            return Ok(None);
        };
        let slot_len = self
            .file_slot_kib
            .checked_mul(1024)
            .context("--file-slot-kib too large")?;
        if slot_len < rdmactor_services::file_transfer::MIN_GRANT_SLOT_LEN {
            bail!(
                "--file-slot-kib {}: senders refuse slots under {} bytes",
                self.file_slot_kib,
                rdmactor_services::file_transfer::MIN_GRANT_SLOT_LEN
            );
        }
        let mut config = FilesConfig::new(dir)
            .with_max_size(self.max_file_size)
            .with_window(self.file_slots, slot_len)
            .with_client_quota(
                self.files_client_uploads,
                self.files_client_mib
                    .checked_mul(1 << 20)
                    .context("--files-client-mib too large")?,
            );
        for spec in &self.secrets {
            let (id, key) = spec
                .split_once('=')
                .with_context(|| format!("--secret {spec:?} is not ID=KEY"))?;
            config = config.with_secret(id, key);
        }
        if let Some(path) = &self.secret_file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--secret-file {}", path.display()))?;
            for (id, key) in rdmactor_services::file_transfer::parse_secrets(&text)
                .with_context(|| format!("--secret-file {}", path.display()))?
            {
                config = config.with_secret(id, key);
            }
        }
        config = config
            .with_public_fetch(self.files_public_fetch)
            .with_overwrite_others(self.files_overwrite_others)
            .with_fetch_preparations(self.files_fetch_preparations)
            .with_max_uploads(self.files_max_uploads)
            .with_digest_cache(self.files_digest_cache)
            .with_stall(
                Some(std::time::Duration::from_secs(self.files_stall_secs))
                    .filter(|d| !d.is_zero()),
            );
        for who in &self.files_replicators {
            if !rdmactor::runtime::valid_identity(who) {
                bail!("--files-replicator {who:?} is not an identity name");
            }
            config = config.with_replicator(who);
        }
        if let Some(recorder) = recorder {
            config = config.with_recorder(recorder);
        }
        FileTransfer::new(config)
            .map(Some)
            .with_context(|| format!("files service in {}", dir.display()))
    }
}
