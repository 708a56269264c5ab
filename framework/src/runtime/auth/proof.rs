//! What a client proves at connect, and how the server checks it: pure functions, no
//! I/O and no clock, so that every way a proof can be wrong is tested natively.
//!
//! The server's accept carries a fresh 32-byte nonce (`Welcome::nonce`). The client
//! answers with a [`Proof`] as its connection's first message, under [`AUTH_TAG`]: an
//! Ed25519 signature, or an HMAC-SHA-256 under a pre-shared key, over the
//! [`transcript`]. The transcript is domain-separated and binds the nonce (so a captured
//! proof is worth nothing on another connection), the service (so a proof for one
//! service does not open another) and the identity claimed. No secret crosses the wire.

use ed25519_dalek::{Signature, Signer, SigningKey};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use super::keys::{AuthorizedKey, KeySet, MAX_IDENTITY};

/// The request tag a proof travels under, and its answer. Reserved: a client's own tag
/// allocator never hands it out.
pub const AUTH_TAG: u32 = u32::MAX;
/// Bytes of the server's nonce.
pub const NONCE_LEN: usize = 32;
/// Largest encoded proof the server reads: an Ed25519 proof of the longest identity is
/// about 135 bytes; anything past this bound is refused unread. Until the proof is good,
/// it is the largest message the connection reads at all: a larger first message offered
/// by rendezvous is refused at the offer, before any memory is taken for it, and only a
/// proved connection has the service's own limit.
pub const MAX_PROOF: usize = 256;

/// What every signed or MACed message starts with, so that a signature made for
/// rdmactor's connect can never be taken for one over anything else.
const DOMAIN: &[u8] = b"rdmactor-auth-v1\0";

type HmacSha256 = Hmac<Sha256>;

/// A client's proof of its identity, postcard-encoded as its first message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proof {
    /// The identity claimed (at most [`MAX_IDENTITY`] bytes).
    pub identity: String,
    /// The signature or MAC over the transcript: `"rdmactor-auth-v1\0" || nonce ||
    /// service || 0 || identity`.
    pub kind: ProofKind,
}

/// How the proof was made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ProofKind {
    /// An Ed25519 signature (64 bytes) by the identity's private key.
    Ed25519 {
        /// The signature's bytes.
        signature: Vec<u8>,
    },
    /// An HMAC-SHA-256 (32 bytes) under the identity's pre-shared key.
    Psk {
        /// The MAC's bytes.
        mac: Vec<u8>,
    },
}

/// The server's answer to a good proof, under [`AUTH_TAG`]. A bad proof is answered by
/// closing the connection with the reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Authenticated {
    /// The identity the server now knows the connection by.
    pub identity: String,
}

/// Why a connection was refused at the door. Its `Display` is what the client reads
/// after "authentication refused: ".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthRefusal {
    /// The service is authenticated-only and the client proved nothing (its first
    /// message was not a proof, or it said it has no credential).
    #[error("service needs authentication")]
    NeedsAuthentication,
    /// The proof could not be read: truncated, oversized, or a field out of bounds.
    #[error("malformed proof: {0}")]
    Malformed(String),
    /// No key of that identity is authorized.
    #[error("unknown identity")]
    UnknownIdentity,
    /// The identity is known, and the signature or MAC is not one of its keys' over
    /// this connection's transcript (a wrong key, or a proof replayed from another
    /// connection).
    #[error("bad proof")]
    BadProof,
    /// No proof came within the server's authentication timeout.
    #[error("no proof within {0:?}")]
    TimedOut(std::time::Duration),
    /// The proof is good, and its identity already holds the server's per-identity
    /// connection cap (`ServerBuilder::max_connections_per_peer`).
    #[error("identity already holds {max} connections, the most one identity may")]
    TooManyConnections {
        /// The cap.
        max: usize,
    },
}

impl AuthRefusal {
    /// The reason as a metric label: fixed, few values.
    pub fn label(&self) -> &'static str {
        match self {
            AuthRefusal::NeedsAuthentication => "needs_authentication",
            AuthRefusal::Malformed(_) => "malformed_proof",
            AuthRefusal::UnknownIdentity => "unknown_identity",
            AuthRefusal::BadProof => "bad_proof",
            AuthRefusal::TimedOut(_) => "timeout",
            AuthRefusal::TooManyConnections { .. } => "too_many_connections",
        }
    }
}

/// The message a proof signs: `DOMAIN || nonce || service || 0 || identity`. The zero
/// ends the service name (which holds no zero byte), so no two (service, identity)
/// pairs share a transcript.
pub fn transcript(nonce: &[u8; NONCE_LEN], service: &str, identity: &str) -> Vec<u8> {
    let mut m = Vec::with_capacity(DOMAIN.len() + NONCE_LEN + service.len() + 1 + identity.len());
    m.extend_from_slice(DOMAIN);
    m.extend_from_slice(nonce);
    m.extend_from_slice(service.as_bytes());
    m.push(0);
    m.extend_from_slice(identity.as_bytes());
    m
}

/// An Ed25519 proof by `key` for `identity`.
pub fn sign(key: &SigningKey, identity: &str, nonce: &[u8; NONCE_LEN], service: &str) -> Proof {
    let sig = key.sign(&transcript(nonce, service, identity));
    Proof {
        identity: identity.to_owned(),
        kind: ProofKind::Ed25519 {
            signature: sig.to_bytes().to_vec(),
        },
    }
}

/// A pre-shared-key proof under `secret` for `identity`.
pub fn mac(secret: &[u8; 32], identity: &str, nonce: &[u8; NONCE_LEN], service: &str) -> Proof {
    let mut m = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
    m.update(&transcript(nonce, service, identity));
    Proof {
        identity: identity.to_owned(),
        kind: ProofKind::Psk {
            mac: m.finalize().into_bytes().to_vec(),
        },
    }
}

/// Encodes a proof for the wire.
pub fn encode(proof: &Proof) -> Vec<u8> {
    postcard::to_allocvec(proof).expect("a proof always encodes")
}

/// Decodes a proof's bytes, refusing what is oversized, truncated or out of bounds
/// before any key is looked at.
pub fn decode(bytes: &[u8]) -> Result<Proof, AuthRefusal> {
    if bytes.len() > MAX_PROOF {
        return Err(oversized(bytes.len()));
    }
    let (proof, rest): (Proof, &[u8]) =
        postcard::take_from_bytes(bytes).map_err(|e| AuthRefusal::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(AuthRefusal::Malformed(format!(
            "{} bytes after the proof",
            rest.len()
        )));
    }
    if proof.identity.is_empty() || proof.identity.len() > MAX_IDENTITY {
        return Err(AuthRefusal::Malformed(format!(
            "identity of {} bytes (1 to {MAX_IDENTITY})",
            proof.identity.len()
        )));
    }
    let (what, len, want) = match &proof.kind {
        ProofKind::Ed25519 { signature } => ("signature", signature.len(), 64),
        ProofKind::Psk { mac } => ("MAC", mac.len(), 32),
    };
    if len != want {
        return Err(AuthRefusal::Malformed(format!(
            "{what} of {len} bytes, not {want}"
        )));
    }
    Ok(proof)
}

/// The refusal of a proof of `len` bytes, more than [`MAX_PROOF`]: read (it came inline)
/// or refused at its offer, the same reason.
pub fn oversized(len: usize) -> AuthRefusal {
    AuthRefusal::Malformed(format!("{len} bytes, at most {MAX_PROOF}"))
}

/// A proof checked: who the connection is, and which of its keys proved it (the key's
/// fingerprint), so that removing that key can close the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The identity proved.
    pub identity: String,
    /// The fingerprint of the key that proved it ([`AuthorizedKey::fingerprint`]).
    pub fingerprint: [u8; 32],
}

/// Checks `proof` against the keys of its identity in `keys`, over this connection's
/// `nonce` and `service`. Every key of the identity of the proof's kind is tried (an
/// identity holds two during a rotation). Ed25519 uses `verify_strict` (no malleable or
/// small-order signatures); the MAC is compared in constant time.
pub fn verify(
    proof: &Proof,
    keys: &KeySet,
    nonce: &[u8; NONCE_LEN],
    service: &str,
) -> Result<Verified, AuthRefusal> {
    let Some(candidates) = keys.get(&proof.identity) else {
        return Err(AuthRefusal::UnknownIdentity);
    };
    let message = transcript(nonce, service, &proof.identity);
    let good = candidates.iter().find(|key| match (key, &proof.kind) {
        (AuthorizedKey::Ed25519(public), ProofKind::Ed25519 { signature }) => {
            let Ok(sig) = Signature::from_slice(signature) else {
                return false;
            };
            public.verify_strict(&message, &sig).is_ok()
        }
        (AuthorizedKey::Psk(secret), ProofKind::Psk { mac }) => {
            let mut m =
                HmacSha256::new_from_slice(secret.as_slice()).expect("HMAC takes any key length");
            m.update(&message);
            m.verify_slice(mac).is_ok()
        }
        _ => false,
    });
    match good {
        Some(key) => Ok(Verified {
            identity: proof.identity.clone(),
            fingerprint: key.fingerprint(),
        }),
        None => Err(AuthRefusal::BadProof),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONCE: [u8; NONCE_LEN] = [7; NONCE_LEN];

    fn keys(text: &str) -> KeySet {
        KeySet::parse(text).unwrap()
    }

    fn pair(seed: u8) -> (SigningKey, String) {
        use base64::Engine;
        let key = SigningKey::from_bytes(&[seed; 32]);
        let public =
            base64::engine::general_purpose::STANDARD.encode(key.verifying_key().as_bytes());
        (key, public)
    }

    #[test]
    fn transcript_is_domain_separated_and_unambiguous() {
        let t = transcript(&NONCE, "kv", "alice");
        assert!(t.starts_with(b"rdmactor-auth-v1\0"));
        assert_eq!(&t[17..49], &NONCE);
        assert_eq!(&t[49..], b"kv\0alice");
        // Moving bytes between service and identity changes the transcript.
        assert_ne!(transcript(&NONCE, "kva", "lice"), t);
    }

    #[test]
    fn a_good_signature_verifies_and_names_its_key() {
        let (key, public) = pair(1);
        let set = keys(&format!("alice ed25519 {public}\n"));
        let proof = decode(&encode(&sign(&key, "alice", &NONCE, "kv"))).unwrap();
        let v = verify(&proof, &set, &NONCE, "kv").unwrap();
        assert_eq!(v.identity, "alice");
        assert_eq!(v.fingerprint, set.get("alice").unwrap()[0].fingerprint());
    }

    #[test]
    fn wrong_key_other_nonce_other_service_and_unknown_identity_are_refused() {
        let (key, public) = pair(1);
        let (other, _) = pair(2);
        let set = keys(&format!("alice ed25519 {public}\n"));
        let by_other = sign(&other, "alice", &NONCE, "kv");
        assert_eq!(
            verify(&by_other, &set, &NONCE, "kv"),
            Err(AuthRefusal::BadProof)
        );
        let good = sign(&key, "alice", &NONCE, "kv");
        assert_eq!(
            verify(&good, &set, &[8; NONCE_LEN], "kv"),
            Err(AuthRefusal::BadProof),
            "a replay on another connection's nonce"
        );
        assert_eq!(
            verify(&good, &set, &NONCE, "files"),
            Err(AuthRefusal::BadProof)
        );
        let bob = sign(&key, "bob", &NONCE, "kv");
        assert_eq!(
            verify(&bob, &set, &NONCE, "kv"),
            Err(AuthRefusal::UnknownIdentity)
        );
    }

    #[test]
    fn psk_proofs_verify_and_a_wrong_secret_does_not() {
        use base64::Engine;
        let secret = [9u8; 32];
        let b64 = base64::engine::general_purpose::STANDARD.encode(secret);
        let set = keys(&format!("svc psk {b64}\n"));
        let good = mac(&secret, "svc", &NONCE, "kv");
        assert!(verify(&good, &set, &NONCE, "kv").is_ok());
        let bad = mac(&[1; 32], "svc", &NONCE, "kv");
        assert_eq!(verify(&bad, &set, &NONCE, "kv"), Err(AuthRefusal::BadProof));
        // A signature for an identity that holds only a PSK proves nothing.
        let (key, _) = pair(1);
        let wrong_kind = sign(&key, "svc", &NONCE, "kv");
        assert_eq!(
            verify(&wrong_kind, &set, &NONCE, "kv"),
            Err(AuthRefusal::BadProof)
        );
    }

    #[test]
    fn malformed_proofs_are_named() {
        let (key, _) = pair(1);
        let wire = encode(&sign(&key, "alice", &NONCE, "kv"));
        let cut = decode(&wire[..wire.len() - 10]).unwrap_err();
        assert!(matches!(cut, AuthRefusal::Malformed(_)), "{cut:?}");
        let mut long = wire.clone();
        long.extend(std::iter::repeat_n(0u8, MAX_PROOF));
        assert_eq!(
            decode(&long),
            Err(AuthRefusal::Malformed(format!(
                "{} bytes, at most {MAX_PROOF}",
                long.len()
            )))
        );
        let mut trailing = wire.clone();
        trailing.push(0);
        assert!(matches!(decode(&trailing), Err(AuthRefusal::Malformed(_))));
        let short_sig = Proof {
            identity: "alice".into(),
            kind: ProofKind::Ed25519 {
                signature: vec![0; 10],
            },
        };
        assert!(matches!(
            decode(&encode(&short_sig)),
            Err(AuthRefusal::Malformed(_))
        ));
        let long_name = Proof {
            identity: "a".repeat(MAX_IDENTITY + 1),
            kind: ProofKind::Psk { mac: vec![0; 32] },
        };
        assert!(matches!(
            decode(&encode(&long_name)),
            Err(AuthRefusal::Malformed(_))
        ));
        assert!(matches!(decode(&[]), Err(AuthRefusal::Malformed(_))));
    }
}
