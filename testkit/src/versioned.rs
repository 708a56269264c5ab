//! What the tests of versioned shared regions (the `read` service's seqlock) read back,
//! and how they tell a consistent read from a torn one. The writer fills the region
//! with [`WORDS`] little-endian `u64` words, all equal to `version / 2`, so that every
//! byte says which version it belongs to, wherever a read starts.

/// Words of the region the writer updates.
pub const WORDS: usize = 512;
/// Its length in bytes.
pub const LEN: usize = WORDS * 8;

/// True when `data`, read at byte `offset` of the region, is entirely version `version`.
pub fn consistent(offset: u64, data: &[u8], version: u64) -> bool {
    let word = (version / 2).to_le_bytes();
    data.iter()
        .enumerate()
        .all(|(i, &b)| b == word[(offset as usize + i) % 8])
}

/// True when `data`, read at byte `offset`, could be one version: each byte equals the
/// others at the same position within a word. A read that is not is torn.
pub fn uniform(offset: u64, data: &[u8]) -> bool {
    let mut word: [Option<u8>; 8] = [None; 8];
    data.iter().enumerate().all(|(i, &b)| {
        let at = (offset as usize + i) % 8;
        *word[at].get_or_insert(b) == b
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_version_is_consistent_and_a_mixture_is_torn() {
        let v4: Vec<u8> = (0..3).flat_map(|_| 2u64.to_le_bytes()).collect();
        assert!(consistent(0, &v4, 4) && consistent(0, &v4, 5) && uniform(0, &v4));
        assert!(!consistent(0, &v4, 6));
        // Read from byte 3 on: the same words, shifted.
        assert!(consistent(3, &v4[3..], 4));
        let mut torn = v4.clone();
        torn[8..16].copy_from_slice(&3u64.to_le_bytes());
        assert!(!uniform(0, &torn));
    }
}
