//! The deterministic payload bytes.

/// `len` deterministic pseudo-random bytes for `seed` (xorshift64), so that payloads,
/// files and inputs are not all one byte, a chunk landing at the wrong offset shows, and
/// a failure is reproducible.
///
/// The seed is spread by the golden-ratio multiplier first, so that nearby seeds (0 and 1,
/// a loop counter) start far apart and give different bytes.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::pattern;

    #[test]
    fn same_seed_same_bytes() {
        assert_eq!(pattern(1000, 42), pattern(1000, 42));
        // A shorter pattern is a prefix of a longer one with the same seed.
        assert_eq!(pattern(10, 42)[..], pattern(1000, 42)[..10]);
    }

    #[test]
    fn nearby_seeds_differ() {
        let first: Vec<Vec<u8>> = (0..64).map(|s| pattern(64, s)).collect();
        for (i, a) in first.iter().enumerate() {
            for b in &first[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn not_one_repeated_byte() {
        let bytes = pattern(4096, 0);
        let mut seen = [false; 256];
        for b in &bytes {
            seen[usize::from(*b)] = true;
        }
        assert!(seen.iter().filter(|s| **s).count() > 200);
    }

    /// The definition is pinned, so that changing it is a decision: a failure report
    /// names a payload by its length and seed. (Seed 1 gives the bytes the lambda tests
    /// used before this crate, `xorshift64` from the golden-ratio constant.)
    #[test]
    fn pinned() {
        assert_eq!(
            pattern(8, 1),
            [0xad, 0x76, 0x36, 0x74, 0xec, 0x79, 0xcf, 0xea]
        );
    }
}
