//! What rdmactor peers say in rdma_cm private data: the connect request names the service
//! and the client's receive queue; the accept answers with the server's; a reject says
//! why in words the client can show.
//!
//! Private data is tiny (56 bytes in a connect request, 148 in a reject over RoCE/IB)
//! and arrives zero-padded, so the layout is fixed and hand-encoded. A request that does
//! not start with the magic is from a plain rdma_cm client (rping, rdma_client, ...):
//! those reach the listener's default service.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use crate::verbs::{MAX_ACCEPT_PRIVATE_DATA, MAX_CONNECT_PRIVATE_DATA, MAX_REJECT_PRIVATE_DATA};

/// First bytes of every rdmactor private data.
pub const MAGIC: [u8; 4] = *b"rAcT";
/// Protocol version carried in the hello; a mismatch is rejected.
///
/// 2: the hello and the welcome carry `max_credits` (receives shared between
/// connections lend busy ones more than their initial share).
pub const PROTOCOL_VERSION: u8 = 2;
/// Longest service name that fits in a connect request.
pub const MAX_SERVICE_NAME: usize = MAX_CONNECT_PRIVATE_DATA - HELLO_FIXED;

/// Bytes of a hello before the service name.
const HELLO_FIXED: usize = 14;
/// Bytes of a welcome.
const WELCOME_LEN: usize = 14;
/// Flag in a welcome's byte 5 (zero before authentication existed): a 32-byte nonce
/// follows the fixed part, and the service wants a proof of identity over it.
const WELCOME_NONCE: u8 = 1;
/// Bytes of the nonce.
const NONCE_LEN: usize = 32;

/// The client's connect request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Protocol version the client speaks.
    pub version: u8,
    /// Service asked for.
    pub service: String,
    /// Receives the client guarantees this connection (the server's initial send
    /// credits).
    pub recv_depth: u16,
    /// Size of each of those receive buffers.
    pub recv_size: u32,
    /// Most credits the client may grant (more than `recv_depth` when its receives are
    /// shared and it lends busy connections more).
    pub max_credits: u16,
}

/// The server's accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Welcome {
    /// Receives the server guarantees this connection (the client's initial send
    /// credits).
    pub recv_depth: u16,
    /// Size of each of those receive buffers.
    pub recv_size: u32,
    /// Most credits the server may grant.
    pub max_credits: u16,
    /// A fresh nonce, when the service is authenticated-only: the client proves its
    /// identity over it in its first message (see `runtime::auth`). An optional trailing
    /// field flagged in the byte older welcomes kept zero, so the version is unchanged:
    /// a welcome without it decodes as before.
    pub nonce: Option<[u8; NONCE_LEN]>,
}

impl Hello {
    /// The credits the client advertised.
    pub fn advert(&self) -> crate::proto::credits::Advert {
        advert(self.recv_depth, self.max_credits)
    }
}

impl Welcome {
    /// The credits the server advertised.
    pub fn advert(&self) -> crate::proto::credits::Advert {
        advert(self.recv_depth, self.max_credits)
    }
}

fn advert(initial: u16, max: u16) -> crate::proto::credits::Advert {
    crate::proto::credits::Advert {
        initial: initial.into(),
        max: max.into(),
    }
}

/// Why the server refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RejectCode {
    /// No service of that name is registered.
    UnknownService = 1,
    /// The client speaks another protocol version.
    VersionMismatch = 2,
    /// The connection limit is reached.
    ServerFull = 3,
    /// The connect private data could not be parsed.
    BadHello = 4,
    /// The server is shutting down.
    ShuttingDown = 5,
    /// The server could not set the connection up (resources).
    Internal = 6,
    /// The peer address has too many unproven authentications (failed lately, or in
    /// flight); it may try again once its tokens refill (about one a second).
    Throttled = 7,
}

/// A reject with its reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    /// Machine-readable reason.
    pub code: RejectCode,
    /// Human-readable detail.
    pub message: String,
}

impl std::fmt::Display for Reject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

/// A malformed hello.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HelloError {
    /// The service name does not fit in a connect request.
    #[error("service name of {0} bytes is longer than {MAX_SERVICE_NAME}")]
    NameTooLong(usize),
    /// The bytes end before the fields they announce.
    #[error("private data truncated")]
    Truncated,
    /// The name is not UTF-8.
    #[error("service name is not UTF-8")]
    NameNotUtf8,
}

fn starts_with_magic(data: &[u8]) -> bool {
    data.len() >= 5 && data[..4] == MAGIC
}

impl Hello {
    /// Encodes for `rdma_connect`.
    pub fn encode(&self) -> Result<Vec<u8>, HelloError> {
        if self.service.len() > MAX_SERVICE_NAME {
            return Err(HelloError::NameTooLong(self.service.len()));
        }
        let name_len = u8::try_from(self.service.len())
            .map_err(|_| HelloError::NameTooLong(self.service.len()))?;
        let mut v = Vec::with_capacity(HELLO_FIXED.saturating_add(self.service.len()));
        v.extend_from_slice(&MAGIC);
        v.push(self.version);
        v.push(name_len);
        v.extend_from_slice(&self.recv_depth.to_le_bytes());
        v.extend_from_slice(&self.recv_size.to_le_bytes());
        v.extend_from_slice(&self.max_credits.to_le_bytes());
        v.extend_from_slice(self.service.as_bytes());
        debug_assert!(v.len() <= MAX_CONNECT_PRIVATE_DATA);
        Ok(v)
    }

    /// Decodes a connect request's private data. `Ok(None)` means it is not from an
    /// rdmactor client (no magic), so the listener's default service applies.
    pub fn decode(data: &[u8]) -> Result<Option<Hello>, HelloError> {
        if !starts_with_magic(data) {
            return Ok(None);
        }
        if data.len() < HELLO_FIXED {
            return Err(HelloError::Truncated);
        }
        let name_len = data[5] as usize;
        // The length byte can say up to 255, and private data from elsewhere than
        // rdma_cm (loopback, a test's bytes) can be that long: a name that no connect
        // request could carry is refused as `encode` refuses it.
        if name_len > MAX_SERVICE_NAME {
            return Err(HelloError::NameTooLong(name_len));
        }
        let name = data
            .get(HELLO_FIXED..)
            .and_then(|rest| rest.get(..name_len))
            .ok_or(HelloError::Truncated)?;
        Ok(Some(Hello {
            version: data[4],
            service: std::str::from_utf8(name)
                .map_err(|_| HelloError::NameNotUtf8)?
                .to_owned(),
            recv_depth: u16::from_le_bytes([data[6], data[7]]),
            recv_size: u32::from_le_bytes(data[8..12].try_into().expect("4 bytes")),
            max_credits: u16::from_le_bytes([data[12], data[13]]),
        }))
    }
}

impl Welcome {
    /// Encodes for `rdma_accept`.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(WELCOME_LEN + NONCE_LEN);
        v.extend_from_slice(&MAGIC);
        v.push(PROTOCOL_VERSION);
        v.push(if self.nonce.is_some() {
            WELCOME_NONCE
        } else {
            0
        });
        v.extend_from_slice(&self.recv_depth.to_le_bytes());
        v.extend_from_slice(&self.recv_size.to_le_bytes());
        v.extend_from_slice(&self.max_credits.to_le_bytes());
        if let Some(nonce) = &self.nonce {
            v.extend_from_slice(nonce);
        }
        debug_assert!(v.len() <= MAX_ACCEPT_PRIVATE_DATA);
        v
    }

    /// Decodes the accept's private data (seen in the client's ESTABLISHED event). A
    /// welcome whose flag announces a nonce the data does not hold is no welcome.
    pub fn decode(data: &[u8]) -> Option<Welcome> {
        if !starts_with_magic(data) || data.len() < WELCOME_LEN {
            return None;
        }
        let nonce = if data[5] & WELCOME_NONCE != 0 {
            let bytes = data.get(WELCOME_LEN..WELCOME_LEN + NONCE_LEN)?;
            Some(bytes.try_into().expect("32 bytes"))
        } else {
            None
        };
        Some(Welcome {
            nonce,
            recv_depth: u16::from_le_bytes([data[6], data[7]]),
            recv_size: u32::from_le_bytes(data[8..12].try_into().expect("4 bytes")),
            max_credits: u16::from_le_bytes([data[12], data[13]]),
        })
    }
}

impl RejectCode {
    fn from_u8(v: u8) -> RejectCode {
        match v {
            1 => RejectCode::UnknownService,
            2 => RejectCode::VersionMismatch,
            3 => RejectCode::ServerFull,
            4 => RejectCode::BadHello,
            5 => RejectCode::ShuttingDown,
            7 => RejectCode::Throttled,
            _ => RejectCode::Internal,
        }
    }
}

impl Reject {
    /// A reject with `code` and `message`.
    pub fn new(code: RejectCode, message: impl Into<String>) -> Reject {
        Reject {
            code,
            message: message.into(),
        }
    }

    /// Encodes for `rdma_reject`, cutting the message to what fits.
    pub fn encode(&self) -> Vec<u8> {
        let room = MAX_REJECT_PRIVATE_DATA - 7;
        let mut msg = self.message.as_bytes();
        if msg.len() > room {
            let mut end = room;
            while !self.message.is_char_boundary(end) {
                // Stops at 0 at the latest: it is always a boundary.
                end = end.saturating_sub(1);
            }
            msg = &msg[..end];
        }
        // Cut to `room` above, which is below 256.
        let len = u8::try_from(msg.len()).unwrap_or(u8::MAX);
        let msg = &msg[..usize::from(len)];
        let mut v = Vec::with_capacity(msg.len().saturating_add(7));
        v.extend_from_slice(&MAGIC);
        v.push(PROTOCOL_VERSION);
        v.push(self.code as u8);
        v.push(len);
        v.extend_from_slice(msg);
        v
    }

    /// Decodes a REJECTED event's private data; `None` when it is not from rdmactor.
    pub fn decode(data: &[u8]) -> Option<Reject> {
        if !starts_with_magic(data) || data.len() < 7 {
            return None;
        }
        let len = data[6] as usize;
        let msg = data.get(7..)?.get(..len)?;
        Some(Reject {
            code: RejectCode::from_u8(data[5]),
            message: String::from_utf8_lossy(msg).into_owned(),
        })
    }
}

// The tests' own numbers, not a peer's.
#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_through_padding() {
        let h = Hello {
            version: 1,
            service: "echo".into(),
            recv_depth: 32,
            recv_size: 4096,
            max_credits: 64,
        };
        let mut wire = h.encode().unwrap();
        wire.resize(MAX_CONNECT_PRIVATE_DATA, 0); // the transport pads
        assert_eq!(Hello::decode(&wire), Ok(Some(h)));
    }

    #[test]
    fn plain_clients_have_no_hello() {
        assert_eq!(Hello::decode(&[]), Ok(None));
        assert_eq!(Hello::decode(&[0; 56]), Ok(None));
    }

    #[test]
    fn bad_hellos_are_named() {
        let long = Hello {
            version: 1,
            service: "x".repeat(45),
            recv_depth: 2,
            recv_size: 64,
            max_credits: 2,
        };
        assert_eq!(long.encode(), Err(HelloError::NameTooLong(45)));
        let mut wire = Hello {
            version: 1,
            service: "ab".into(),
            recv_depth: 2,
            recv_size: 64,
            max_credits: 2,
        }
        .encode()
        .unwrap();
        wire[5] = 40; // name length beyond the data
        assert_eq!(Hello::decode(&wire), Err(HelloError::Truncated));
        wire[5] = 2;
        wire[HELLO_FIXED] = 0xff;
        assert_eq!(Hello::decode(&wire), Err(HelloError::NameNotUtf8));
        // A name longer than any connect request carries, in bytes that hold it all
        // (found by the bounded fuzz run: it decoded, and then did not encode).
        let mut long = wire[..HELLO_FIXED].to_vec();
        long[5] = (MAX_SERVICE_NAME + 1) as u8;
        long.extend(std::iter::repeat_n(b'a', MAX_SERVICE_NAME + 1));
        assert_eq!(
            Hello::decode(&long),
            Err(HelloError::NameTooLong(MAX_SERVICE_NAME + 1))
        );
    }

    #[test]
    fn welcome_and_reject_round_trip() {
        let w = Welcome {
            recv_depth: 16,
            recv_size: 8192,
            max_credits: 48,
            nonce: None,
        };
        assert_eq!(Welcome::decode(&w.encode()), Some(w));
        assert_eq!(
            w.encode().len(),
            WELCOME_LEN,
            "the old layout, byte for byte"
        );
        let keyed = Welcome {
            nonce: Some([0xa5; NONCE_LEN]),
            ..w
        };
        let mut wire = keyed.encode();
        wire.resize(MAX_ACCEPT_PRIVATE_DATA, 0); // the transport pads
        assert_eq!(Welcome::decode(&wire), Some(keyed));
        assert_eq!(Welcome::decode(&keyed.encode()[..WELCOME_LEN + 5]), None);
        let r = Reject::new(RejectCode::ServerFull, "limit of 10 connections reached");
        let mut wire = r.encode();
        wire.resize(MAX_REJECT_PRIVATE_DATA, 0);
        assert_eq!(Reject::decode(&wire), Some(r));
        let long = Reject::new(RejectCode::Internal, "é".repeat(200));
        assert!(long.encode().len() <= MAX_REJECT_PRIVATE_DATA);
        assert!(Reject::decode(&long.encode()).is_some());
    }
}
