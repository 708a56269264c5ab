//! A remote region (address, length, rkey) in 24 bytes, as the tests' own services hand
//! a grant to their clients: three little-endian `u64`s.

use rdmactor::verbs::RemoteRegion;

/// `r` as 24 bytes.
pub fn encode(r: RemoteRegion) -> Vec<u8> {
    [
        r.addr.to_le_bytes(),
        r.len.to_le_bytes(),
        u64::from(r.rkey).to_le_bytes(),
    ]
    .concat()
}

/// The region `encode` wrote into `b` (at least 24 bytes).
pub fn decode(b: &[u8]) -> RemoteRegion {
    let word = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    RemoteRegion {
        addr: word(0),
        len: word(1),
        rkey: word(2) as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_survives_the_round_trip() {
        let r = RemoteRegion {
            addr: 0x7f00_dead_beef,
            len: 1 << 33,
            rkey: 0xabcd_0123,
        };
        assert_eq!(decode(&encode(r)), r);
    }
}
