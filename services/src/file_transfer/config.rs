//! Operator settings for the receiving (and serving) side.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::error::{Result, TransferError};
use super::quota::ClientQuota;
use super::recorder::Recorder;
use super::wire::SecretKey;

/// Settings shared by every transfer of a service (wrap it in an `Arc`).
#[derive(Debug, Clone)]
pub struct Config {
    /// Where received files are stored and fetched files are served from.
    pub dir: PathBuf,
    /// Largest file accepted, in bytes.
    pub max_size: u64,
    /// Slots in a granted window (chunks in flight).
    pub slots: u32,
    /// Bytes per slot, which is also the chunk size.
    pub slot_len: u32,
    /// Largest window a peer may grant us when we send (our staging buffer).
    pub max_window: u64,
    /// Secret keys by sender ID. `Identify{id}` gets the key only right after this
    /// connection's GOOD upload of a new, non-empty file named exactly `id` (the
    /// upload proves the ID); every other `Identify` gets `Refused`, whether the ID is
    /// configured or not, so answers do not enumerate IDs.
    pub secrets: HashMap<String, SecretKey>,
    /// Serve a `Fetch` of any regular, non-hidden file in [`dir`](Self::dir). Off by
    /// default: a connection fetches only files it uploaded itself.
    pub public_fetch: bool,
    /// Let an offer with `overwrite` replace any file. Off by default: a connection
    /// replaces only files it uploaded itself (an offer to overwrite anyone else's file
    /// is treated as one without `overwrite`, so an existing file is `Exists`).
    pub overwrite_others: bool,
    /// What one client (by IP address) may hold at once on the receiving side: uploads
    /// admitted and bytes reserved but not yet stored (see [`ClientQuota`]). Offers
    /// beyond it are refused with [`RejectReason::Quota`](super::RejectReason::Quota).
    pub client_quota: ClientQuota,
    /// How long a transfer may wait on its peer (for the grant, a chunk, an
    /// acknowledgement, the verdict) before it is ended with
    /// [`RejectReason::Stalled`](super::RejectReason::Stalled) and everything it holds
    /// is freed: without it, a client that takes a grant and never writes keeps its
    /// window, quota share and reserved disk for as long as its QP lives, and a
    /// paused process's QP lives on (the kernel answers keepalive probes for it).
    /// `None` waits for ever. Time spent on the server's own work (hashing, writing
    /// to disk) does not count.
    pub stall: Option<Duration>,
    /// How many files' digests the service remembers (see
    /// [`DigestCache`](super::DigestCache)), so that fetching a file it stored or
    /// served before does not read it whole again. 0 remembers none: every fetch
    /// hashes its file.
    pub digest_cache: usize,
    /// How many fetches one client (by IP address, over all its connections) may have
    /// being prepared (their file hashed) at once; one more is refused with
    /// [`RejectReason::Quota`](super::RejectReason::Quota). A fetch of a file whose
    /// digest is known needs no preparation and does not count.
    pub fetch_preparations: u32,
    /// How many uploads the service admits at once over every client (each stages a
    /// temporary file with disk reserved by `fallocate`, an open descriptor and a
    /// receiver's window); one more is refused with
    /// [`RejectReason::ServerFull`](super::RejectReason::ServerFull). The per-client
    /// [`client_quota`](Self::client_quota) alone let many addresses stage without
    /// bound (issue 45).
    pub max_uploads: u32,
    /// Told of each verified upload before the client hears GOOD (see [`Recorder`]):
    /// a cluster's servers record their copies in the catalog through it. `None`
    /// records nothing.
    pub recorder: Option<Arc<dyn Recorder>>,
    /// Identities that copy files between servers for their owners: a cluster's
    /// servers, each proving its own key when its repair connects. A replicator
    /// fetches and stats any file, and may offer a copy for another owner
    /// ([`Msg::OfferFor`](super::Msg::OfferFor)), stored as that owner's. So a cluster
    /// needs no [`public_fetch`](Self::public_fetch) for its repair, and a repaired
    /// copy stays its owner's alone. Empty by default.
    pub replicators: HashSet<String>,
}

impl Config {
    /// 8 slots: with 4, the sender waited for acknowledgements often enough to leave
    /// the CPUs idle (measured under Soft-RoCE: 27 MB/s with 4 slots of 1 MiB, 30 MB/s
    /// with 8, little more with 16, against 34 MB/s for `ib_write_bw` at 1 MiB).
    pub const DEFAULT_SLOTS: u32 = 8;
    /// 1 MiB per slot.
    pub const DEFAULT_SLOT_LEN: u32 = 1 << 20;
    /// 1 TiB.
    pub const DEFAULT_MAX_SIZE: u64 = 1 << 40;
    /// 64 MiB.
    pub const DEFAULT_MAX_WINDOW: u64 = 64 << 20;
    /// 60 s: far past any pause a working client makes between chunks (a full window
    /// of 8 MiB moves in well under a second even under Soft-RoCE), short enough that
    /// a stuck client does not hold its share for long.
    pub const DEFAULT_STALL: Duration = Duration::from_secs(60);
    /// 2: a client fetching two new files at once is served; one opening a connection
    /// per file to keep the disk and the blocking pool busy is not.
    pub const DEFAULT_FETCH_PREPARATIONS: u32 = 2;
    /// 256 uploads at once over every client: four clients at their default share of
    /// 64, about 256 open descriptors and windows.
    pub const DEFAULT_MAX_UPLOADS: u32 = 256;

    /// The defaults, storing into `dir`, with no secrets.
    pub fn new(dir: impl Into<PathBuf>) -> Config {
        Config {
            dir: dir.into(),
            max_size: Config::DEFAULT_MAX_SIZE,
            slots: Config::DEFAULT_SLOTS,
            slot_len: Config::DEFAULT_SLOT_LEN,
            max_window: Config::DEFAULT_MAX_WINDOW,
            secrets: HashMap::new(),
            public_fetch: false,
            overwrite_others: false,
            client_quota: ClientQuota::default(),
            stall: Some(Config::DEFAULT_STALL),
            digest_cache: super::DigestCache::DEFAULT_CAPACITY,
            fetch_preparations: Config::DEFAULT_FETCH_PREPARATIONS,
            max_uploads: Config::DEFAULT_MAX_UPLOADS,
            recorder: None,
            replicators: HashSet::new(),
        }
    }

    /// Sets how many digests the service remembers (see
    /// [`digest_cache`](Self::digest_cache)).
    pub fn with_digest_cache(mut self, entries: usize) -> Config {
        self.digest_cache = entries;
        self
    }

    /// Sets how many fetches one client may have prepared at once (see
    /// [`fetch_preparations`](Self::fetch_preparations)).
    pub fn with_fetch_preparations(mut self, limit: u32) -> Config {
        self.fetch_preparations = limit;
        self
    }

    /// Tells `recorder` of each verified upload before its verdict (see [`Recorder`]).
    pub fn with_recorder(mut self, recorder: Arc<dyn Recorder>) -> Config {
        self.recorder = Some(recorder);
        self
    }

    /// Trusts `identity` to copy files for their owners (see
    /// [`replicators`](Self::replicators)).
    pub fn with_replicator(mut self, identity: impl Into<String>) -> Config {
        self.replicators.insert(identity.into());
        self
    }

    /// Sets how many uploads the service admits at once over every client (see
    /// [`max_uploads`](Self::max_uploads)).
    pub fn with_max_uploads(mut self, limit: u32) -> Config {
        self.max_uploads = limit;
        self
    }

    /// Sets how long a transfer may wait on its peer (see [`stall`](Self::stall)).
    pub fn with_stall(mut self, stall: Option<Duration>) -> Config {
        self.stall = stall;
        self
    }

    /// Sets what one client may hold at once (see [`client_quota`](Self::client_quota)).
    pub fn with_client_quota(mut self, uploads: u32, reserved_bytes: u64) -> Config {
        self.client_quota = ClientQuota {
            uploads,
            reserved_bytes,
        };
        self
    }

    /// Serves every regular, non-hidden file to every client (see
    /// [`public_fetch`](Self::public_fetch)).
    pub fn with_public_fetch(mut self, on: bool) -> Config {
        self.public_fetch = on;
        self
    }

    /// Lets any client overwrite any file (see
    /// [`overwrite_others`](Self::overwrite_others)).
    pub fn with_overwrite_others(mut self, on: bool) -> Config {
        self.overwrite_others = on;
        self
    }

    /// Sets the window geometry.
    pub fn with_window(mut self, slots: u32, slot_len: u32) -> Config {
        self.slots = slots;
        self.slot_len = slot_len;
        self
    }

    /// Sets the largest file accepted.
    pub fn with_max_size(mut self, max_size: u64) -> Config {
        self.max_size = max_size;
        self
    }

    /// Adds a secret for `id`.
    pub fn with_secret(mut self, id: impl Into<String>, key: impl Into<SecretKey>) -> Config {
        self.secrets.insert(id.into(), key.into());
        self
    }

    /// Checks the geometry: at least one slot of at least one byte, a window no larger
    /// than `max_window` (a peer of the same configuration must accept it) and
    /// addressable in memory.
    ///
    /// # Errors
    ///
    /// [`TransferError::Invalid`] naming the bad value.
    pub fn validate(&self) -> Result<()> {
        if self.slots == 0 || self.slot_len == 0 {
            return Err(TransferError::Invalid(format!(
                "window of {} slots of {} bytes",
                self.slots, self.slot_len
            )));
        }
        let window = u64::from(self.slots) * u64::from(self.slot_len);
        if window > self.max_window || usize::try_from(window).is_err() {
            return Err(TransferError::Invalid(format!(
                "window of {window} bytes, more than the maximum of {}",
                self.max_window
            )));
        }
        if self.fetch_preparations == 0 {
            return Err(TransferError::Invalid(
                "0 fetch preparations per client (no new file could be fetched)".into(),
            ));
        }
        if self.max_uploads == 0 {
            return Err(TransferError::Invalid(
                "0 uploads at once on the server (no file could be received)".into(),
            ));
        }
        if self.stall.is_some_and(|d| d.is_zero()) {
            return Err(TransferError::Invalid(
                "a stall limit of 0 s (use None to wait for ever)".into(),
            ));
        }
        Ok(())
    }
}

/// Parses a secrets file: one `ID=KEY` per line; blank lines and lines starting with
/// `#` are skipped; the key is everything after the first `=` (the line's trailing
/// `\r` removed). A file keeps keys out of `/proc/PID/cmdline`, where `--secret`
/// values show to every local user.
///
/// # Errors
///
/// [`TransferError::Invalid`] naming the line number (never the line: it holds a key).
pub fn parse_secrets(text: &str) -> Result<Vec<(String, SecretKey)>> {
    let mut secrets = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        match line.split_once('=') {
            Some((id, key)) if !id.trim().is_empty() && !key.is_empty() => {
                secrets.push((id.trim().to_owned(), SecretKey::from(key)));
            }
            _ => {
                return Err(TransferError::Invalid(format!(
                    "secrets line {} is not ID=KEY",
                    i + 1
                )))
            }
        }
    }
    Ok(secrets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_files_hold_id_key_lines() {
        let got = parse_secrets("# lab keys\nalice=a=1\r\n\n bob =b\n").unwrap();
        let got: Vec<(&str, &str)> = got.iter().map(|(i, k)| (i.as_str(), k.expose())).collect();
        assert_eq!(got, vec![("alice", "a=1"), ("bob", "b")]);
        let e = parse_secrets("alice=k\nhunter2\n").unwrap_err().to_string();
        assert!(e.contains("line 2") && !e.contains("hunter2"), "{e}");
        assert!(parse_secrets("=k").is_err());
        assert!(parse_secrets("id=").is_err());
    }

    #[test]
    fn defaults_are_valid_and_bad_geometry_is_not() {
        Config::new("/tmp").validate().unwrap();
        assert!(Config::new("/tmp").with_window(0, 1).validate().is_err());
        assert!(Config::new("/tmp").with_window(1, 0).validate().is_err());
        assert!(Config::new("/tmp")
            .with_window(1000, 1 << 20)
            .validate()
            .is_err());
        assert!(Config::new("/tmp")
            .with_fetch_preparations(0)
            .validate()
            .is_err());
    }
}
