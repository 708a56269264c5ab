//! The framed wire format of rdmactor's typed messages.
//!
//! Every SEND between two rdmactor peers starts with a 16-byte header. Credits ride in
//! every header, so flow-control updates cost nothing while traffic flows both ways.
//!
//! ```text
//! 0      1      2             4                 8                12               16
//! +------+------+-------------+-----------------+----------------+----------------+
//! | ver  | kind | reserved    | credits granted | length         | tag            |
//! +------+------+-------------+-----------------+----------------+----------------+
//! ```
//!
//! All integers are little-endian. `Data` is followed by `length` payload bytes.
//! `RendezvousOffer` is followed by a 16-byte [`RendezvousOffer`] body and announces a
//! message of `length` bytes the receiver fetches with an RDMA READ; `RendezvousDone`
//! (tag = the offer's region key) tells the sender it may revoke that region. In Data and
//! RendezvousOffer frames, `tag` correlates requests and responses.
//!
//! `Refuse` (tag = the offer's region key) answers an offer the receiver will not take,
//! with a [`REFUSAL_LEN`]-byte body naming why ([`crate::proto::budget::BudgetError`]):
//! the sender releases the region and tells whoever sent the message, and the connection
//! goes on. `Close` carries `length` bytes of UTF-8 text (at most [`CLOSE_REASON_MAX`]):
//! the sender is ending the connection for that reason, so the peer can say why instead
//! of seeing only a disconnect or a flushed work request.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

/// Wire format version; a peer with another version is rejected at connect time.
pub const VERSION: u8 = 1;
/// Header size in bytes.
pub const HEADER_LEN: usize = 16;
/// Size of the body that follows a `RendezvousOffer` header.
pub const OFFER_LEN: usize = 16;
/// Size of the body that follows a `Refuse` header.
pub const REFUSAL_LEN: usize = 17;
/// Longest reason a `Close` frame carries (longer ones are cut at a character boundary).
pub const CLOSE_REASON_MAX: usize = 512;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// A whole message inline after the header.
    Data = 1,
    /// Only a credit grant (sent when credits are owed and no data flows back).
    Credit = 2,
    /// A large message: fetch it with an RDMA READ from the offered region.
    RendezvousOffer = 3,
    /// The receiver fetched a rendezvous message; the sender revokes the region.
    RendezvousDone = 4,
    /// The receiver will not take a rendezvous offer (too large, over its budget).
    Refuse = 5,
    /// The sender is closing the connection; the body says why.
    Close = 6,
}

impl FrameKind {
    fn from_u8(v: u8) -> Option<FrameKind> {
        Some(match v {
            1 => FrameKind::Data,
            2 => FrameKind::Credit,
            3 => FrameKind::RendezvousOffer,
            4 => FrameKind::RendezvousDone,
            5 => FrameKind::Refuse,
            6 => FrameKind::Close,
            _ => return None,
        })
    }
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What follows.
    pub kind: FrameKind,
    /// Receive credits the sender returns to us.
    pub credits: u32,
    /// Payload length (Data) or total message length (RendezvousOffer).
    pub len: u32,
    /// Request/response correlation (Data) or transfer id (rendezvous).
    pub tag: u32,
}

/// Where a rendezvous message waits for the receiver's RDMA READ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RendezvousOffer {
    /// Address in the sender's registration.
    pub addr: u64,
    /// rkey granting REMOTE_READ for this transfer only.
    pub rkey: u32,
    /// The sender's name for the region, echoed in `RendezvousDone`'s tag.
    pub key: u32,
}

/// Why bytes from the wire are not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// Fewer bytes than a header.
    #[error("message of {0} bytes is shorter than the {HEADER_LEN}-byte header")]
    Truncated(usize),
    /// Another wire version.
    #[error("wire version {0}, expected {VERSION}")]
    Version(u8),
    /// Unknown kind byte.
    #[error("unknown frame kind {0}")]
    Kind(u8),
    /// The header's length disagrees with the bytes received.
    #[error("header says {header} payload bytes, {actual} arrived")]
    Length {
        /// Length in the header.
        header: u32,
        /// Bytes actually present.
        actual: usize,
    },
}

impl Header {
    /// Writes the header into the first `HEADER_LEN` bytes of `out`.
    pub fn encode(&self, out: &mut [u8]) {
        out[0] = VERSION;
        out[1] = self.kind as u8;
        out[2..4].copy_from_slice(&[0, 0]);
        out[4..8].copy_from_slice(&self.credits.to_le_bytes());
        out[8..12].copy_from_slice(&self.len.to_le_bytes());
        out[12..16].copy_from_slice(&self.tag.to_le_bytes());
    }

    /// Parses a whole received message: the header, checked against the bytes that
    /// follow it, and the body (payload for Data, offer for RendezvousOffer).
    pub fn decode(msg: &[u8]) -> Result<(Header, &[u8]), FrameError> {
        if msg.len() < HEADER_LEN {
            return Err(FrameError::Truncated(msg.len()));
        }
        if msg[0] != VERSION {
            return Err(FrameError::Version(msg[0]));
        }
        let kind = FrameKind::from_u8(msg[1]).ok_or(FrameError::Kind(msg[1]))?;
        let word = |at: usize| u32::from_le_bytes(msg[at..][..4].try_into().expect("4 bytes"));
        let header = Header {
            kind,
            credits: word(4),
            len: word(8),
            tag: word(12),
        };
        let body = &msg[HEADER_LEN..];
        let expected = match kind {
            FrameKind::Data => header.len as usize,
            FrameKind::RendezvousOffer => OFFER_LEN,
            FrameKind::Refuse => REFUSAL_LEN,
            FrameKind::Close => header.len as usize,
            FrameKind::Credit | FrameKind::RendezvousDone => 0,
        };
        // A reason longer than allowed is malformed whatever follows it.
        let too_long = kind == FrameKind::Close && expected > CLOSE_REASON_MAX;
        if body.len() != expected || too_long {
            return Err(FrameError::Length {
                // From the header's own u32, or a constant: it fits.
                header: u32::try_from(expected).unwrap_or(u32::MAX),
                actual: body.len(),
            });
        }
        Ok((header, body))
    }
}

impl RendezvousOffer {
    /// Writes the offer body into the first `OFFER_LEN` bytes of `out`.
    pub fn encode(&self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.addr.to_le_bytes());
        out[8..12].copy_from_slice(&self.rkey.to_le_bytes());
        out[12..16].copy_from_slice(&self.key.to_le_bytes());
    }

    /// Parses an offer body (already length-checked by [`Header::decode`]).
    pub fn decode(body: &[u8]) -> RendezvousOffer {
        RendezvousOffer {
            addr: u64::from_le_bytes(body[0..8].try_into().expect("8 bytes")),
            rkey: u32::from_le_bytes(body[8..12].try_into().expect("4 bytes")),
            key: u32::from_le_bytes(body[12..16].try_into().expect("4 bytes")),
        }
    }
}

/// The text of a `Close` frame's body: `reason` cut to at most [`CLOSE_REASON_MAX`]
/// bytes, at a character boundary.
pub fn close_reason_body(reason: &str) -> &[u8] {
    let mut end = reason.len().min(CLOSE_REASON_MAX);
    while !reason.is_char_boundary(end) {
        // Stops at 0 at the latest: it is always a boundary.
        end = end.saturating_sub(1);
    }
    &reason.as_bytes()[..end]
}

// The tests' own numbers, not a peer's.
#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    #[test]
    fn close_reasons_are_cut_at_a_character_boundary() {
        let long = "é".repeat(CLOSE_REASON_MAX);
        let body = close_reason_body(&long);
        assert!(body.len() <= CLOSE_REASON_MAX && body.len() >= CLOSE_REASON_MAX - 1);
        assert!(std::str::from_utf8(body).is_ok());
        let h = Header {
            kind: FrameKind::Close,
            credits: 0,
            len: body.len() as u32,
            tag: 0,
        };
        let msg = frame(h, body);
        assert_eq!(Header::decode(&msg), Ok((h, body)));
        // A length beyond the maximum is malformed, whatever follows.
        let mut over = frame(Header { len: 4096, ..h }, &[b'x'; 4096]);
        assert!(matches!(
            Header::decode(&over),
            Err(FrameError::Length { .. })
        ));
        over.truncate(HEADER_LEN + CLOSE_REASON_MAX);
        assert!(matches!(
            Header::decode(&over),
            Err(FrameError::Length { .. })
        ));
    }

    fn frame(h: Header, body: &[u8]) -> Vec<u8> {
        let mut v = vec![0; HEADER_LEN];
        h.encode(&mut v);
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn data_round_trips() {
        let h = Header {
            kind: FrameKind::Data,
            credits: 7,
            len: 3,
            tag: 99,
        };
        let msg = frame(h, b"abc");
        assert_eq!(Header::decode(&msg), Ok((h, &b"abc"[..])));
    }

    #[test]
    fn offer_round_trips() {
        let h = Header {
            kind: FrameKind::RendezvousOffer,
            credits: 0,
            len: 1 << 20,
            tag: 5,
        };
        let offer = RendezvousOffer {
            addr: 0xdead_beef_0000,
            rkey: 0x1234,
            key: 3,
        };
        let mut body = [0; OFFER_LEN];
        offer.encode(&mut body);
        let msg = frame(h, &body);
        let (got, body) = Header::decode(&msg).unwrap();
        assert_eq!(got, h);
        assert_eq!(RendezvousOffer::decode(body), offer);
    }

    #[test]
    fn malformed_frames_are_named() {
        assert_eq!(Header::decode(&[1, 1, 0]), Err(FrameError::Truncated(3)));
        let h = Header {
            kind: FrameKind::Data,
            credits: 0,
            len: 10,
            tag: 0,
        };
        let mut msg = frame(h, b"short");
        assert_eq!(
            Header::decode(&msg),
            Err(FrameError::Length {
                header: 10,
                actual: 5
            })
        );
        msg[0] = 9;
        assert_eq!(Header::decode(&msg), Err(FrameError::Version(9)));
        msg[0] = VERSION;
        msg[1] = 77;
        assert_eq!(Header::decode(&msg), Err(FrameError::Kind(77)));
        let credit = frame(
            Header {
                kind: FrameKind::Credit,
                credits: 4,
                len: 0,
                tag: 0,
            },
            b"x",
        );
        assert!(matches!(
            Header::decode(&credit),
            Err(FrameError::Length { .. })
        ));
    }
}
