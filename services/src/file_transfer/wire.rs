//! The messages of the file-transfer protocol and the plain data they carry. Every
//! control message is one [`Msg`], postcard-encoded, travelling as one framed message;
//! chunk data never travels in a message (it is RDMA-written into the granted window).
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use std::fmt;

use serde::{Deserialize, Serialize};

use super::error::{Result, TransferError};

/// Largest encoded control message accepted by [`Msg::decode`]. Names are at most 255
/// bytes and every other field is small, so anything longer is not a valid message.
pub const MAX_MSG_LEN: usize = 64 * 1024;

/// The largest number of chunks in a transfer: chunk indices are 32-bit immediates.
pub const MAX_CHUNKS: u64 = 1 << 32;

/// Most slots a sender accepts in a grant. Each slot is a chunk in flight whose state the
/// sender keeps and whose bytes it stages; receivers grant 8 by default. Without a cap a
/// Fetch granting 64 Mi one-byte slots made the server allocate about a gigabyte of slot
/// state and register a 64 MiB staging buffer.
pub const MAX_GRANT_SLOTS: u32 = 1024;

/// Smallest slot a sender accepts, unless the whole file is smaller: one-byte chunks
/// would cost the sender a WRITE and an acknowledgement per byte.
pub const MIN_GRANT_SLOT_LEN: u32 = 4096;

/// Length of every digest, for both algorithms.
pub const DIGEST_LEN: usize = 32;

/// The hash the sender picked for a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HashAlg {
    /// SHA-256; its hex form is what `sha256sum` prints.
    Sha256,
    /// BLAKE3 with the default 32-byte output; its hex form is what `b3sum` prints.
    Blake3,
}

impl HashAlg {
    /// Lower-case name, as the command-line tools spell it.
    pub fn name(self) -> &'static str {
        match self {
            HashAlg::Sha256 => "sha256",
            HashAlg::Blake3 => "blake3",
        }
    }
}

impl fmt::Display for HashAlg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A digest and the algorithm that produced it. Displays as lower-case hex.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Digest {
    /// The algorithm.
    pub alg: HashAlg,
    /// The raw digest.
    pub bytes: [u8; DIGEST_LEN],
}

impl Digest {
    /// The digest as lower-case hex (64 characters).
    pub fn to_hex(&self) -> String {
        hex::encode(self.bytes)
    }

    /// Parses 64 hex characters (either case).
    pub fn from_hex(alg: HashAlg, s: &str) -> Result<Digest> {
        let mut bytes = [0u8; DIGEST_LEN];
        hex::decode_to_slice(s, &mut bytes)
            .map_err(|e| TransferError::Invalid(format!("bad {alg} digest {s:?}: {e}")))?;
        Ok(Digest { alg, bytes })
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.alg, self.to_hex())
    }
}

/// A region the receiver registered for the sender to RDMA WRITE into: the plain
/// fields of an `rdmactor::verbs::RemoteRegion`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RemoteWindow {
    /// Virtual address of the first byte in the receiver's registration.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// The receiver's rkey (REMOTE_WRITE only).
    pub rkey: u32,
}

impl RemoteWindow {
    /// The `len` bytes at `offset`, or `None` if they are not all inside the window.
    pub fn slice(&self, offset: u64, len: u64) -> Option<RemoteWindow> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        Some(RemoteWindow {
            addr: self.addr.checked_add(offset)?,
            len,
            rkey: self.rkey,
        })
    }
}

/// The receiver's window for one transfer: `slots` slots of `slot_len` bytes, back to
/// back in one registration (`region.len == slots * slot_len`). Chunk `i` holds file
/// bytes `[i * slot_len, min((i + 1) * slot_len, len))` and goes to slot `i % slots`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowGrant {
    /// The registered window.
    pub region: RemoteWindow,
    /// Number of slots, at least 1.
    pub slots: u32,
    /// Bytes per slot (and per chunk, except the last), at least 1.
    pub slot_len: u32,
}

impl WindowGrant {
    /// Number of chunks a file of `len` bytes is cut into with this slot size.
    pub fn chunks(&self, len: u64) -> u64 {
        chunk_count(len, self.slot_len)
    }
}

/// Number of chunks of `slot_len` bytes (the last one shorter) covering `len` bytes.
pub(crate) fn chunk_count(len: u64, slot_len: u32) -> u64 {
    len.div_ceil(u64::from(slot_len.max(1)))
}

/// Length of chunk `index` of a `len`-byte file cut into `slot_len`-byte chunks.
pub(crate) fn chunk_len(len: u64, slot_len: u32, index: u64) -> u32 {
    // A chunk that would start past u64::MAX starts past any file: it is empty.
    let start = index.saturating_mul(u64::from(slot_len));
    // Never more than slot_len, so it fits in u32.
    u32::try_from(len.saturating_sub(start).min(u64::from(slot_len))).unwrap_or(slot_len)
}

/// What the sender proposes to transfer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileOffer {
    /// Plain file name: no directories (see [`validate_name`](super::validate_name)).
    pub name: String,
    /// Exact length in bytes.
    pub len: u64,
    /// Digest of the whole file; its algorithm is the one the receiver must use.
    pub digest: Digest,
    /// Replace an existing file of that name (atomically). Without it an existing file
    /// makes the receiver reject the offer.
    pub overwrite: bool,
}

/// A secret key the operator configured for an ID. Its `Debug` form hides the value so
/// that logging a message never leaks it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretKey(pub String);

impl SecretKey {
    /// The key itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretKey(..)")
    }
}

impl From<&str> for SecretKey {
    fn from(s: &str) -> SecretKey {
        SecretKey(s.to_owned())
    }
}

impl From<String> for SecretKey {
    fn from(s: String) -> SecretKey {
        SecretKey(s)
    }
}

/// Why an offer (or a fetch) was refused. The transfer ends; the connection does not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RejectReason {
    /// The name is not a plain file name.
    BadName {
        /// What is wrong with it.
        reason: String,
    },
    /// The file is larger than the receiver accepts.
    TooLarge {
        /// The largest length accepted.
        max: u64,
    },
    /// A file of that name exists and the offer did not ask to overwrite it.
    Exists,
    /// No file of that name can be served (fetch only).
    NotFound,
    /// The receiver cannot store (or the server cannot read) the file.
    Unavailable {
        /// What failed.
        reason: String,
    },
    /// The receiver's file system has not enough free space for the file: checked
    /// (and the space reserved) when the offer arrives, or met while writing.
    NoSpace {
        /// Bytes the file needs.
        needed: u64,
        /// Bytes the receiver had free for it (0 when a write ran out mid-transfer).
        available: u64,
    },
    /// This client already uses its share of the receiver: too many uploads at once,
    /// or too many bytes reserved and not yet stored.
    Quota {
        /// Which limit, in words (`"uploads at once"`, `"bytes reserved"`).
        what: String,
        /// The limit.
        limit: u64,
        /// What this client would use with the refused transfer.
        would_use: u64,
    },
    /// The server is shutting down and takes no more transfers.
    ShuttingDown,
    /// The transfer waited on the peer (a chunk, an acknowledgement, an answer) for
    /// this long and heard nothing: it was ended, and what it held (window, staging,
    /// quota share, reserved disk) was freed.
    Stalled {
        /// The limit, in seconds.
        secs: u64,
    },
    /// The server as a whole is at a limit shared by every client (each may be within
    /// its own share): nothing was staged; ask again once others are done.
    ServerFull {
        /// Which limit, in words (`"uploads at once on this server"`).
        what: String,
        /// The limit.
        limit: u64,
    },
    /// The connection may not do this, whatever the file: only an identity the
    /// service names as a replicator may offer a copy for another owner
    /// ([`Msg::OfferFor`]).
    Forbidden {
        /// What was asked, in words.
        what: String,
    },
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RejectReason::BadName { reason } => write!(f, "bad file name: {reason}"),
            RejectReason::TooLarge { max } => write!(f, "file larger than {max} bytes"),
            RejectReason::Exists => f.write_str("file exists"),
            RejectReason::NotFound => f.write_str("no such file"),
            RejectReason::Unavailable { reason } => write!(f, "unavailable: {reason}"),
            RejectReason::NoSpace { needed, available } if *available > 0 => write!(
                f,
                "no space left on the receiver's disk: the file needs {needed} bytes, {available} are free"
            ),
            RejectReason::NoSpace { needed, .. } => write!(
                f,
                "no space left on the receiver's disk for the file of {needed} bytes"
            ),
            RejectReason::Quota {
                what,
                limit,
                would_use,
            } => write!(
                f,
                "quota exceeded: {would_use} {what} for this client, the limit is {limit}"
            ),
            RejectReason::ShuttingDown => f.write_str("the server is shutting down"),
            RejectReason::Stalled { secs } => write!(
                f,
                "stalled: nothing from the peer for {secs} s while the transfer waited on it"
            ),
            RejectReason::ServerFull { what, limit } => write!(
                f,
                "the server is full: {limit} {what} (every client's), try again later"
            ),
            RejectReason::Forbidden { what } => write!(f, "forbidden: {what}"),
        }
    }
}

/// Why the receiver answered BAD. Nothing was stored under the name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum BadReason {
    /// The received bytes hash to something else than the offered digest.
    Mismatch {
        /// What the receiver computed.
        got: Digest,
    },
    /// The bytes were right but could not be put in place (a file appeared under the
    /// name meanwhile, the disk failed, ...).
    NotStored {
        /// What failed.
        reason: String,
    },
}

impl fmt::Display for BadReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadReason::Mismatch { got } => write!(f, "digest mismatch (received {got})"),
            BadReason::NotStored { reason } => write!(f, "not stored: {reason}"),
        }
    }
}

/// Every control message of the protocol, in both directions. The module docs give
/// the order in which they may appear.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Msg {
    /// Sender → receiver: the file it wants to send.
    Offer(FileOffer),
    /// Client → server: send me this file, hashed with `alg` (download; the server
    /// answers with an [`Msg::Offer`] or a [`Msg::Reject`]).
    Fetch {
        /// Plain file name.
        name: String,
        /// The hash the client wants in the offer.
        alg: HashAlg,
    },
    /// Receiver → sender (or server → client for a fetch): refused.
    Reject {
        /// Why.
        reason: RejectReason,
    },
    /// Receiver → sender: write the file into this window (`None` for an empty file,
    /// which has no chunks).
    Grant {
        /// The window.
        window: Option<WindowGrant>,
    },
    /// Receiver → sender: every chunk below `next` is consumed, so their slots may be
    /// written again. Cumulative; only sent when it frees a slot that a later chunk
    /// needs.
    Ack {
        /// Index of the first chunk not yet consumed.
        next: u32,
    },
    /// Sender → receiver: every chunk was written (it follows the last WRITE on the
    /// same queue pair, so it arrives after it).
    Done,
    /// Receiver → sender: the digest matched and the file is in place.
    Good,
    /// Receiver → sender: not stored.
    Bad {
        /// Why.
        reason: BadReason,
    },
    /// Sender → receiver, after GOOD: who I am.
    Identify {
        /// The sender's ID.
        id: String,
    },
    /// Receiver → sender: the key the operator configured for that ID.
    Secret {
        /// The key.
        key: SecretKey,
    },
    /// Receiver → sender: no key for that ID.
    Refused,
    /// Either side, mid-transfer: this transfer ends now, for `reason` (the receiver
    /// could not write, the sender could not read, ...); the connection stays usable.
    /// From the receiver, the sender stops writing and answers `Done` (unless it already
    /// sent it), after which the receiver revokes its window: chunks already in flight
    /// still land in it. From the sender, no chunk follows (it is sent after the last
    /// WRITE on the same queue pair), so the receiver revokes at once.
    Abort {
        /// Why.
        reason: RejectReason,
    },
    /// Client → server, between transfers: what do you hold under `name`, hashed with
    /// `alg`? Answered with [`Msg::Held`], or with the [`Msg::Reject`] a `Fetch` of the
    /// name would get (the same access rules), without moving the file. A cluster's
    /// repair asks it to tell a replica of the recorded bytes from other bytes under
    /// the same name before it copies anything.
    Stat {
        /// Plain file name.
        name: String,
        /// The hash the client wants.
        alg: HashAlg,
    },
    /// Server → client: the answer to `Stat`.
    Held {
        /// The file's length in bytes.
        len: u64,
        /// Its digest, with the algorithm asked for.
        digest: Digest,
    },
    /// Replicator → server, in place of an [`Msg::Offer`]: a copy of a file `owner`
    /// owns, to be stored as `owner`'s. A cluster's repair sends it, so that a copy
    /// keeps the owner of the file it copies and the owner fetches it from any node.
    /// Only an identity the service names as a replicator may send it (anyone else is
    /// refused [`RejectReason::Forbidden`]), and it never replaces a file: the
    /// offer's `overwrite` is ignored.
    OfferFor {
        /// The copy.
        offer: FileOffer,
        /// Whose file it is (an identity name).
        owner: String,
    },
    /// Client → server, between transfers: remove the file `name`. Allowed where an
    /// overwrite would be (the file's owner, or the connection that stored it when it
    /// has none); answered with [`Msg::Deleted`], or with the [`Msg::Reject`] a fetch
    /// of it would get ([`RejectReason::NotFound`] for another's file). A cluster's
    /// server lets its catalog forget the file first: the record goes before the bytes.
    Delete {
        /// Plain file name.
        name: String,
    },
    /// Server → client: the file named in `Delete` is gone.
    Deleted,
}

impl Msg {
    /// The message's name, for errors and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Msg::Offer(_) => "Offer",
            Msg::Fetch { .. } => "Fetch",
            Msg::Reject { .. } => "Reject",
            Msg::Grant { .. } => "Grant",
            Msg::Ack { .. } => "Ack",
            Msg::Done => "Done",
            Msg::Good => "Good",
            Msg::Bad { .. } => "Bad",
            Msg::Identify { .. } => "Identify",
            Msg::Secret { .. } => "Secret",
            Msg::Refused => "Refused",
            Msg::Abort { .. } => "Abort",
            Msg::Stat { .. } => "Stat",
            Msg::Held { .. } => "Held",
            Msg::OfferFor { .. } => "OfferFor",
            Msg::Delete { .. } => "Delete",
            Msg::Deleted => "Deleted",
        }
    }

    /// The postcard encoding.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("encoding into a Vec cannot fail")
    }

    /// Decodes one message; the whole buffer must be that message.
    ///
    /// # Errors
    ///
    /// [`TransferError::Malformed`] if the bytes are too long, do not decode, or have
    /// bytes left over.
    pub fn decode(bytes: &[u8]) -> Result<Msg> {
        if bytes.len() > MAX_MSG_LEN {
            return Err(TransferError::Malformed(format!(
                "{} bytes, more than {MAX_MSG_LEN}",
                bytes.len()
            )));
        }
        let (msg, rest) = postcard::take_from_bytes(bytes)
            .map_err(|e| TransferError::Malformed(e.to_string()))?;
        if !rest.is_empty() {
            return Err(TransferError::Malformed(format!(
                "{} trailing bytes",
                rest.len()
            )));
        }
        Ok(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest() -> Digest {
        Digest {
            alg: HashAlg::Blake3,
            bytes: [7; DIGEST_LEN],
        }
    }

    #[test]
    fn every_message_round_trips() {
        let grant = WindowGrant {
            region: RemoteWindow {
                addr: 0xdead_beef_0000,
                len: 4 << 20,
                rkey: 0x1234,
            },
            slots: 4,
            slot_len: 1 << 20,
        };
        let msgs = [
            Msg::Offer(FileOffer {
                name: "a.bin".into(),
                len: u64::MAX,
                digest: digest(),
                overwrite: true,
            }),
            Msg::Fetch {
                name: "a".into(),
                alg: HashAlg::Sha256,
            },
            Msg::Reject {
                reason: RejectReason::TooLarge { max: 5 },
            },
            Msg::Grant {
                window: Some(grant),
            },
            Msg::Grant { window: None },
            Msg::Ack { next: u32::MAX },
            Msg::Done,
            Msg::Good,
            Msg::Bad {
                reason: BadReason::Mismatch { got: digest() },
            },
            Msg::Identify { id: "alice".into() },
            Msg::Secret {
                key: "s3cret".into(),
            },
            Msg::Refused,
            Msg::Abort {
                reason: RejectReason::NoSpace {
                    needed: 1 << 26,
                    available: 1 << 20,
                },
            },
            Msg::Reject {
                reason: RejectReason::Quota {
                    what: "uploads at once".into(),
                    limit: 4,
                    would_use: 5,
                },
            },
            Msg::Reject {
                reason: RejectReason::ShuttingDown,
            },
            Msg::Stat {
                name: "a".into(),
                alg: HashAlg::Blake3,
            },
            Msg::Held {
                len: u64::MAX,
                digest: digest(),
            },
            Msg::OfferFor {
                offer: FileOffer {
                    name: "f".into(),
                    len: 3,
                    digest: digest(),
                    overwrite: false,
                },
                owner: "alice".into(),
            },
            Msg::Reject {
                reason: RejectReason::Forbidden {
                    what: "copies for another owner".into(),
                },
            },
            Msg::Delete { name: "f".into() },
            Msg::Deleted,
        ];
        for m in msgs {
            assert_eq!(Msg::decode(&m.encode()).unwrap(), m);
        }
    }

    #[test]
    fn per_chunk_messages_are_small() {
        assert!(Msg::Ack { next: u32::MAX }.encode().len() <= 6);
        assert_eq!(Msg::Done.encode().len(), 1);
    }

    #[test]
    fn garbage_trailing_bytes_and_oversize_are_malformed() {
        assert!(Msg::decode(&[0xff, 0xff]).is_err());
        let mut b = Msg::Done.encode();
        b.push(0);
        assert!(Msg::decode(&b).is_err());
        assert!(Msg::decode(&vec![0; MAX_MSG_LEN + 1]).is_err());
    }

    #[test]
    fn secrets_do_not_show_in_debug() {
        let m = Msg::Secret {
            key: "hunter2".into(),
        };
        assert!(!format!("{m:?}").contains("hunter2"));
    }

    #[test]
    fn digest_hex_round_trips() {
        let d = digest();
        assert_eq!(Digest::from_hex(d.alg, &d.to_hex()).unwrap(), d);
        assert!(Digest::from_hex(d.alg, "abc").is_err());
    }

    #[test]
    fn window_slices_stay_inside() {
        let w = RemoteWindow {
            addr: 100,
            len: 10,
            rkey: 1,
        };
        assert_eq!(
            w.slice(4, 6),
            Some(RemoteWindow {
                addr: 104,
                len: 6,
                rkey: 1
            })
        );
        assert_eq!(w.slice(4, 7), None);
        assert_eq!(w.slice(u64::MAX, 2), None);
    }

    #[test]
    fn chunk_arithmetic() {
        assert_eq!(chunk_count(0, 4), 0);
        assert_eq!(chunk_count(1, 4), 1);
        assert_eq!(chunk_count(8, 4), 2);
        assert_eq!(chunk_count(9, 4), 3);
        assert_eq!(chunk_len(9, 4, 0), 4);
        assert_eq!(chunk_len(9, 4, 2), 1);
        assert_eq!(chunk_len(8, 4, 1), 4);
    }
}
