//! The client's credential: who it says it is, and the secret that proves it. Kept in a
//! key file of this format (written by the `keygen` tool, mode 0600):
//!
//! ```text
//! rdmactor-key v1
//! identity alice
//! ed25519 <base64 of the 32-byte private seed>
//! ```
//!
//! or `psk <base64 of the 32-byte shared secret>` in place of the `ed25519` line. `#`
//! lines and blank lines are skipped. The first line names the format, so that a file
//! of another kind (an OpenSSH key, an authorized keys file) is refused, not misread.

use std::path::Path;

use base64::Engine;
use ed25519_dalek::SigningKey;
use zeroize::Zeroizing;

use super::keys::{key_bytes, valid_identity};
use super::proof::{self, Proof, NONCE_LEN};

/// The first line of a key file.
pub const KEY_FILE_HEADER: &str = "rdmactor-key v1";

/// The secret of a [`Credential`].
#[derive(Clone)]
#[non_exhaustive]
pub enum Secret {
    /// An Ed25519 private key (the server holds its public half).
    Ed25519(SigningKey),
    /// A 32-byte secret the server holds too.
    Psk(Zeroizing<[u8; 32]>),
}

/// An identity and the secret that proves it, for
/// [`Client::with_identity`](crate::runtime::Client::with_identity).
#[derive(Clone)]
pub struct Credential {
    identity: String,
    secret: Secret,
}

impl std::fmt::Debug for Credential {
    /// Never prints the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.secret {
            Secret::Ed25519(_) => "ed25519",
            Secret::Psk(_) => "psk",
        };
        f.debug_struct("Credential")
            .field("identity", &self.identity)
            .field("kind", &kind)
            .finish()
    }
}

/// Why a credential could not be made or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CredentialError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The reason.
        source: std::io::Error,
    },
    /// The file is not a key file of this format.
    #[error("line {line}: {why}")]
    Parse {
        /// 1-based line number (0: the file as a whole).
        line: usize,
        /// What is wrong.
        why: String,
    },
    /// The identity is not 1 to 64 letters, digits or `._@-`.
    #[error("invalid identity {0:?}")]
    Identity(String),
    /// The OS gave no random bytes.
    #[error("no random bytes from the OS: {0}")]
    Random(String),
}

/// 32 bytes from the OS's random source (for new keys and the server's nonces).
pub(crate) fn random32() -> Result<[u8; 32], CredentialError> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| CredentialError::Random(e.to_string()))?;
    Ok(b)
}

impl Credential {
    /// `identity` proved with `secret`.
    pub fn new(identity: &str, secret: Secret) -> Result<Credential, CredentialError> {
        if !valid_identity(identity) {
            return Err(CredentialError::Identity(identity.to_owned()));
        }
        Ok(Credential {
            identity: identity.to_owned(),
            secret,
        })
    }

    /// A new Ed25519 key pair for `identity`, from the OS's random source.
    pub fn generate_ed25519(identity: &str) -> Result<Credential, CredentialError> {
        let seed = Zeroizing::new(random32()?);
        Credential::new(identity, Secret::Ed25519(SigningKey::from_bytes(&seed)))
    }

    /// A new random pre-shared key for `identity`.
    pub fn generate_psk(identity: &str) -> Result<Credential, CredentialError> {
        Credential::new(identity, Secret::Psk(Zeroizing::new(random32()?)))
    }

    /// Reads a key file.
    pub fn load(path: impl AsRef<Path>) -> Result<Credential, CredentialError> {
        let path = path.as_ref();
        // A private key or a shared secret: the text is wiped once parsed.
        let text = Zeroizing::new(std::fs::read_to_string(path).map_err(|source| {
            CredentialError::Io {
                path: path.to_owned(),
                source,
            }
        })?);
        Credential::parse(&text)
    }

    /// Parses a key file's text.
    pub fn parse(text: &str) -> Result<Credential, CredentialError> {
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(n, l)| (n + 1, l.trim()))
            .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
        let err = |line, why: &str| CredentialError::Parse {
            line,
            why: why.to_owned(),
        };
        match lines.next() {
            Some((_, KEY_FILE_HEADER)) => {}
            Some((n, _)) => {
                return Err(err(
                    n,
                    "not an rdmactor key file (want \"rdmactor-key v1\")",
                ))
            }
            None => return Err(err(0, "empty key file")),
        }
        let (mut identity, mut secret) = (None, None);
        for (n, line) in lines {
            let mut f = line.split_whitespace();
            let (Some(word), Some(value), None) = (f.next(), f.next(), f.next()) else {
                return Err(err(n, "want two fields"));
            };
            match word {
                "identity" if identity.is_none() => identity = Some(value.to_owned()),
                "ed25519" | "psk" if secret.is_none() => {
                    let bytes = key_bytes(value).map_err(|why| err(n, &why))?;
                    secret = Some(if word == "psk" {
                        Secret::Psk(bytes)
                    } else {
                        Secret::Ed25519(SigningKey::from_bytes(&bytes))
                    });
                }
                "identity" | "ed25519" | "psk" => return Err(err(n, "repeated field")),
                other => return Err(err(n, &format!("unknown field {other:?}"))),
            }
        }
        let identity = identity.ok_or_else(|| err(0, "no identity line"))?;
        let secret = secret.ok_or_else(|| err(0, "no ed25519 or psk line"))?;
        Credential::new(&identity, secret)
    }

    /// The identity this credential proves.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The key file's text (holds the secret: write it readable by its owner only).
    pub fn to_key_file(&self) -> String {
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let secret = match &self.secret {
            Secret::Ed25519(k) => format!("ed25519 {}", b64(k.as_bytes())),
            Secret::Psk(s) => format!("psk {}", b64(s.as_slice())),
        };
        format!("{KEY_FILE_HEADER}\nidentity {}\n{secret}\n", self.identity)
    }

    /// The server's authorized keys line for this credential (for a PSK it holds the
    /// secret itself, as the server must).
    pub fn authorized_line(&self) -> String {
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        match &self.secret {
            Secret::Ed25519(k) => format!(
                "{} ed25519 {}",
                self.identity,
                b64(k.verifying_key().as_bytes())
            ),
            Secret::Psk(s) => format!("{} psk {}", self.identity, b64(s.as_slice())),
        }
    }

    /// The proof for a connection whose server sent `nonce`, to `service`.
    pub fn prove(&self, nonce: &[u8; NONCE_LEN], service: &str) -> Proof {
        match &self.secret {
            Secret::Ed25519(k) => proof::sign(k, &self.identity, nonce, service),
            Secret::Psk(s) => proof::mac(s, &self.identity, nonce, service),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::auth::keys::KeySet;

    #[test]
    fn a_generated_key_round_trips_and_proves_to_its_line() {
        for cred in [
            Credential::generate_ed25519("alice").unwrap(),
            Credential::generate_psk("jobs").unwrap(),
        ] {
            let again = Credential::parse(&cred.to_key_file()).unwrap();
            assert_eq!(again.identity(), cred.identity());
            let set = KeySet::parse(&cred.authorized_line()).unwrap();
            let nonce = [3; NONCE_LEN];
            let p = again.prove(&nonce, "kv");
            assert!(proof::verify(&p, &set, &nonce, "kv").is_ok());
            assert!(!format!("{again:?}").contains(&cred.to_key_file()[30..]));
        }
    }

    #[test]
    fn bad_key_files_are_named() {
        let good = Credential::generate_ed25519("alice").unwrap().to_key_file();
        for (text, want) in [
            ("", "empty"),
            ("ssh-ed25519 AAAA\n", "not an rdmactor key file"),
            ("rdmactor-key v1\nidentity a\n", "no ed25519 or psk"),
            ("rdmactor-key v1\ned25519 AAAA\n", "key of 3 bytes"),
            ("rdmactor-key v1\nidentity a b\n", "two fields"),
            ("rdmactor-key v1\ncolour blue\n", "unknown field"),
        ] {
            let e = Credential::parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let twice = format!("{good}identity bob\n");
        assert!(Credential::parse(&twice)
            .unwrap_err()
            .to_string()
            .contains("repeated"));
        let bad_name = good.replace("identity alice", "identity a/b");
        assert!(matches!(
            Credential::parse(&bad_name),
            Err(CredentialError::Identity(_))
        ));
    }
}
