//! What travels: typed requests, the unsolicited credit message, the immediate that
//! names a written slot, and a record's checksum trailer.

use rdmactor::verbs::RemoteRegion;
use serde::{Deserialize, Serialize};

use super::IngestError;

/// A client's request (postcard, request/response).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum IngestRequest {
    /// Grant me a ring: answered with [`IngestResponse::Ring`], once per connection.
    Open,
    /// Answer once every record written before this request was processed, returning all
    /// slots held: [`IngestResponse::Flushed`].
    Flush,
}

/// The server's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum IngestResponse {
    /// The ring this connection writes into; every slot starts out granted.
    Ring(RingInfo),
    /// Records processed on this connection so far.
    Flushed {
        /// The count.
        records: u64,
    },
    /// The request cannot be served.
    Refused(String),
}

/// A connection's ring: `slots` slots of `slot_len` bytes, back to back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingInfo {
    /// The registration (REMOTE_WRITE only), `slots * slot_len` bytes.
    pub remote: RemoteRegion,
    /// Number of slots.
    pub slots: u32,
    /// Bytes per slot (a record plus its [`CHECKSUM_LEN`]-byte trailer).
    pub slot_len: u32,
}

impl RingInfo {
    /// Where slot `slot` starts in the registration.
    pub fn slot_offset(&self, slot: u32) -> u64 {
        // Two u32s: the product fits u64.
        u64::from(slot).saturating_mul(u64::from(self.slot_len))
    }
}

/// Slots the server returns to the client (one-way message, tag 0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credits {
    /// The slots, now free for the client to write again.
    pub slots: Vec<u32>,
}

/// How a slot index and a length share the 32-bit immediate of a WRITE_WITH_IMM: the
/// length in the low `len_bits` bits (enough for `slot_len` itself), the slot above.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImmCodec {
    len_bits: u32,
}

impl ImmCodec {
    /// The codec for a ring of `slots` slots of `slot_len` bytes.
    ///
    /// # Errors
    /// [`IngestError::BadRing`] when there are no slots, a slot cannot hold a checksum,
    /// or slot and length do not fit in 32 bits together.
    pub fn new(slots: u32, slot_len: u32) -> Result<ImmCodec, IngestError> {
        let bad = |why: &str| IngestError::BadRing(format!("{slots} x {slot_len} B: {why}"));
        if slots == 0 {
            return Err(bad("no slots"));
        }
        if (slot_len as usize) < CHECKSUM_LEN {
            return Err(bad("a slot must hold the 8-byte checksum"));
        }
        // `leading_zeros` of a u32 is at most 32, and `len_bits` at most 32 too.
        let len_bits = u32::BITS.saturating_sub(slot_len.leading_zeros());
        let slot_bits = u32::BITS.saturating_sub(len_bits);
        if slot_bits < u32::BITS && u64::from(slots) > 1u64 << slot_bits {
            return Err(bad(&format!(
                "{slot_bits} bits left for the slot index in the immediate"
            )));
        }
        Ok(ImmCodec { len_bits })
    }

    /// The immediate for `len` bytes written into `slot`.
    pub fn encode(&self, slot: u32, len: u32) -> u32 {
        debug_assert!(u64::from(len) < 1u64 << self.len_bits);
        // The codec left `32 - len_bits` bits for the slot: the immediate is its low
        // 32 bits by design.
        #[allow(clippy::cast_possible_truncation)]
        let imm = ((u64::from(slot) << self.len_bits) | u64::from(len)) as u32;
        imm
    }

    /// `(slot, len)` from an immediate.
    pub fn decode(&self, imm: u32) -> (u32, u32) {
        let imm = u64::from(imm);
        // `len_bits` is 4..=32: both halves fit u32 (and `1 << len_bits` is at least 16).
        let mask = (1u64 << self.len_bits).saturating_sub(1);
        (
            u32::try_from(imm >> self.len_bits).unwrap_or(0),
            u32::try_from(imm & mask).unwrap_or(u32::MAX),
        )
    }
}

/// Bytes of the checksum trailer after each record.
pub const CHECKSUM_LEN: usize = 8;

/// The record's checksum: a 64-bit multiply-rotate hash over 8-byte words with a final
/// avalanche, little-endian.
///
/// It catches records that were cut short, overwritten or mixed up, which is its job;
/// it is not cryptographic, and needs not be: a client can only write into its own ring,
/// so a forged checksum harms nobody but the forger. Scalar on purpose: a SIMD hash
/// (BLAKE3) costs 160 us per KiB under the emulated CPU of the test VM, this one 2 us.
pub fn checksum(payload: &[u8]) -> [u8; CHECKSUM_LEN] {
    const K1: u64 = 0x9e37_79b9_7f4a_7c15;
    const K2: u64 = 0xc2b2_ae3d_27d4_eb4f;
    let mut h = (payload.len() as u64).wrapping_mul(K2) ^ K1;
    let mut words = payload.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        h = (h ^ w.wrapping_mul(K2)).rotate_left(31).wrapping_mul(K1);
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    h = (h ^ u64::from_le_bytes(tail).wrapping_mul(K2))
        .rotate_left(31)
        .wrapping_mul(K1);
    // fmix64 from MurmurHash3: every input bit affects every output bit.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h.to_le_bytes()
}

/// `payload` followed by its checksum: what the client writes into a slot.
pub fn seal(payload: &[u8]) -> Vec<u8> {
    // A payload already in memory: its length plus 8 does not overflow.
    let mut out = Vec::with_capacity(payload.len().saturating_add(CHECKSUM_LEN));
    out.extend_from_slice(payload);
    out.extend_from_slice(&checksum(payload));
    out
}

/// The payload of a sealed record, if its checksum holds (`None` when it does not, or
/// the bytes are too short to carry one).
pub fn unseal(sealed: &[u8]) -> Option<&[u8]> {
    let split = sealed.len().checked_sub(CHECKSUM_LEN)?;
    let (payload, sum) = sealed.split_at(split);
    (checksum(payload) == sum).then_some(payload)
}
