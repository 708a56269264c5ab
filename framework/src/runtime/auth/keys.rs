//! The server's authorized keys: a file of `IDENTITY KIND BASE64` lines, like OpenSSH's
//! `authorized_keys`, loaded at start and again on reload (SIGHUP in the server binary).
//!
//! ```text
//! # who          kind     key
//! alice          ed25519  <base64 of the 32-byte public key>
//! batch-jobs     psk      <base64 of a 32-byte shared secret>
//! ```
//!
//! `#` starts a comment line; blank lines are skipped; anything after the key is a
//! comment too (as in OpenSSH). An identity may hold several keys: a rotation adds the
//! new key beside the old, moves the clients, then removes the old one. A line that does
//! not parse fails the whole load with its line number: a file half understood would
//! silently lock someone out, or let someone in.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use base64::Engine;
use ed25519_dalek::VerifyingKey;
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

/// Longest identity name, in bytes.
pub const MAX_IDENTITY: usize = 64;

/// One authorized key of an identity.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AuthorizedKey {
    /// An Ed25519 public key: the client holds the private half.
    Ed25519(VerifyingKey),
    /// A 32-byte secret both sides hold, wiped from memory when dropped (a reload
    /// drops the old set).
    Psk(Zeroizing<[u8; 32]>),
}

impl std::fmt::Debug for AuthorizedKey {
    /// Never prints a secret: the kind and the fingerprint only.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            AuthorizedKey::Ed25519(_) => "ed25519",
            AuthorizedKey::Psk(_) => "psk",
        };
        write!(f, "{kind}:{}", hex8(&self.fingerprint()))
    }
}

fn hex8(b: &[u8; 32]) -> String {
    b[..8].iter().map(|x| format!("{x:02x}")).collect()
}

impl AuthorizedKey {
    /// SHA-256 of the kind and the key: names the key a connection was proved with
    /// (a PSK's fingerprint is a hash, never the secret).
    pub fn fingerprint(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        match self {
            AuthorizedKey::Ed25519(k) => {
                h.update(b"ed25519\0");
                h.update(k.as_bytes());
            }
            AuthorizedKey::Psk(s) => {
                h.update(b"psk\0");
                h.update(s.as_slice());
            }
        }
        h.finalize().into()
    }
}

/// Why an authorized keys file was not loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeysError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The reason.
        source: std::io::Error,
    },
    /// A line does not parse.
    #[error("line {line}: {why}")]
    Parse {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        why: String,
    },
    /// The keys were given in memory, so there is no file to reload from.
    #[error("these keys have no file to reload from")]
    NoFile,
    /// The server has no keys (it was started without), or is gone.
    #[error("the server does not authenticate, or is gone")]
    NotAuthenticating,
}

/// The authorized keys at one moment, by identity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeySet {
    by_identity: HashMap<String, Vec<AuthorizedKey>>,
}

/// Whether `name` is a valid identity: 1 to [`MAX_IDENTITY`] bytes of letters, digits
/// and `._@-` (printable in logs, no separators of the file's format).
pub fn valid_identity(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_IDENTITY
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._@-".contains(&b))
}

/// Decodes standard base64 into exactly 32 bytes; the bytes may be a secret, so no
/// copy of them outlives its use unwiped.
pub(crate) fn key_bytes(b64: &str) -> Result<Zeroizing<[u8; 32]>, String> {
    let bytes = Zeroizing::new(
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| format!("bad base64: {e}"))?,
    );
    let mut key = Zeroizing::new([0u8; 32]);
    if bytes.len() != key.len() {
        return Err(format!("key of {} bytes, not 32", bytes.len()));
    }
    key.copy_from_slice(&bytes);
    Ok(key)
}

impl KeySet {
    /// Parses an authorized keys file's text.
    pub fn parse(text: &str) -> Result<KeySet, KeysError> {
        let mut set = KeySet::default();
        for (n, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let err = |why: String| KeysError::Parse { line: n + 1, why };
            let mut fields = line.split_whitespace();
            let (Some(identity), Some(kind), Some(b64)) =
                (fields.next(), fields.next(), fields.next())
            else {
                return Err(err("want IDENTITY KIND BASE64-KEY".into()));
            };
            if !valid_identity(identity) {
                return Err(err(format!(
                    "identity {identity:?}: 1 to {MAX_IDENTITY} letters, digits or ._@-"
                )));
            }
            if kind != "ed25519" && kind != "psk" {
                return Err(err(format!("unknown key kind {kind:?} (ed25519 or psk)")));
            }
            let bytes = key_bytes(b64).map_err(err)?;
            let key = match kind {
                "ed25519" => AuthorizedKey::Ed25519(
                    VerifyingKey::from_bytes(&bytes)
                        .map_err(|e| err(format!("not an Ed25519 public key: {e}")))?,
                ),
                "psk" => AuthorizedKey::Psk(bytes),
                other => return Err(err(format!("unknown key kind {other:?} (ed25519 or psk)"))),
            };
            let keys = set.by_identity.entry(identity.to_owned()).or_default();
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        Ok(set)
    }

    /// The keys of `identity`.
    pub fn get(&self, identity: &str) -> Option<&[AuthorizedKey]> {
        self.by_identity.get(identity).map(Vec::as_slice)
    }

    /// Whether `identity` still holds the key of `fingerprint`.
    pub fn holds(&self, identity: &str, fingerprint: &[u8; 32]) -> bool {
        self.get(identity)
            .is_some_and(|keys| keys.iter().any(|k| &k.fingerprint() == fingerprint))
    }

    /// Identities with at least one key.
    pub fn len(&self) -> usize {
        self.by_identity.len()
    }

    /// Whether no identity has a key.
    pub fn is_empty(&self) -> bool {
        self.by_identity.is_empty()
    }
}

/// The server's authorized keys, swapped whole on reload: a check in progress keeps the
/// set it started with (an `Arc`), the next one sees the new set. Shared by the CM actor
/// and every connection waiting for its proof.
#[derive(Debug)]
pub struct Keys {
    path: Option<PathBuf>,
    set: RwLock<Arc<KeySet>>,
}

impl Keys {
    /// Loads the file at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Keys, KeysError> {
        let path = path.as_ref().to_owned();
        let set = read(&path)?;
        Ok(Keys {
            path: Some(path),
            set: RwLock::new(Arc::new(set)),
        })
    }

    /// Keys given in memory (tests, or a program with its own store): no file, so
    /// [`reload`](Self::reload) fails and [`replace`](Self::replace) swaps them.
    pub fn from_set(set: KeySet) -> Keys {
        Keys {
            path: None,
            set: RwLock::new(Arc::new(set)),
        }
    }

    /// The keys now.
    pub fn current(&self) -> Arc<KeySet> {
        self.set.read().expect("keys lock not poisoned").clone()
    }

    /// Reads the file again and swaps the set in whole; on an error the old set stays
    /// (a typo in the file must not lock everyone out). Returns the new set.
    pub fn reload(&self) -> Result<Arc<KeySet>, KeysError> {
        let path = self.path.as_ref().ok_or(KeysError::NoFile)?;
        let set = Arc::new(read(path)?);
        *self.set.write().expect("keys lock not poisoned") = set.clone();
        Ok(set)
    }

    /// Swaps in `set`.
    pub fn replace(&self, set: KeySet) -> Arc<KeySet> {
        let set = Arc::new(set);
        *self.set.write().expect("keys lock not poisoned") = set.clone();
        set
    }
}

fn read(path: &Path) -> Result<KeySet, KeysError> {
    // The file may hold pre-shared secrets: its text is wiped once parsed.
    let text = Zeroizing::new(
        std::fs::read_to_string(path).map_err(|source| KeysError::Io {
            path: path.to_owned(),
            source,
        })?,
    );
    KeySet::parse(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALICE: &str = "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=";
    const PSK: &str = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=";

    #[test]
    fn parses_keys_comments_and_blank_lines() {
        let text = format!(
            "# the team\n\nalice ed25519 {ALICE} alice@laptop\n  jobs psk {PSK}\nalice psk {PSK}\n"
        );
        let set = KeySet::parse(&text).unwrap();
        assert_eq!(set.len(), 2);
        assert_eq!(
            set.get("alice").unwrap().len(),
            2,
            "two keys for a rotation"
        );
        assert_eq!(
            set.get("jobs").unwrap()[0],
            AuthorizedKey::Psk(Zeroizing::new([1; 32]))
        );
        assert!(set.get("bob").is_none());
        let fp = set.get("alice").unwrap()[0].fingerprint();
        assert!(set.holds("alice", &fp));
        assert!(!set.holds("jobs", &fp));
    }

    #[test]
    fn errors_name_the_line() {
        let cases = [
            ("alice ed25519\n", 1, "want IDENTITY"),
            ("\n# c\nalice rsa AAAA\n", 3, "unknown key kind"),
            ("alice ed25519 !!!\n", 1, "bad base64"),
            ("alice psk AAAA\n", 1, "key of 3 bytes"),
            ("al ice psk AAAA\n", 1, "unknown key kind"),
            ("al/ice psk AAAA\n", 1, "identity"),
        ];
        for (text, line, want) in cases {
            match KeySet::parse(text) {
                Err(KeysError::Parse { line: l, why }) => {
                    assert_eq!(l, line, "{text:?}");
                    assert!(why.contains(want), "{text:?}: {why}");
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
        let long = format!("{} psk {PSK}\n", "a".repeat(MAX_IDENTITY + 1));
        assert!(KeySet::parse(&long).is_err());
    }

    #[test]
    fn reload_swaps_whole_and_keeps_the_old_set_on_error() {
        let dir = std::env::temp_dir().join(format!("rdmactor-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("authorized_keys");
        std::fs::write(&path, format!("alice ed25519 {ALICE}\n")).unwrap();
        let keys = Keys::load(&path).unwrap();
        assert!(keys.current().get("alice").is_some());
        std::fs::write(&path, format!("jobs psk {PSK}\n")).unwrap();
        let new = keys.reload().unwrap();
        assert!(new.get("alice").is_none() && new.get("jobs").is_some());
        std::fs::write(&path, "broken line\n").unwrap();
        assert!(keys.reload().is_err());
        assert!(keys.current().get("jobs").is_some(), "the old set stays");
        assert!(matches!(
            Keys::from_set(KeySet::default()).reload(),
            Err(KeysError::NoFile)
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
