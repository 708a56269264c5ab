//! Seeded, bounded randomized sequences against the connection core, for tests and for
//! the cargo-fuzz target `connection` in `fuzz/`: a peer that sends whatever it likes
//! (frames of any kind, credits it never had, lengths that lie, mutated copies of real
//! frames), interleaved with honest traffic both ways and with closes. The core's only
//! allowed reactions are deliveries and a close with a reason; a panic is a finding, and
//! so is a resource not given back once the cores are gone.
//!
//! Not part of the API (hidden from the docs): the entry points fuzzers and tests share.

#[doc(hidden)]
pub use crate::runtime::{
    adversarial, fuzz_connection, fuzz_connection_outcome, replay_frames, Checked, Outcome,
    EXPOSED_LEN, EXPOSED_RKEY,
};

/// A byte source for a generator: a seeded splitmix64 in tests, the fuzzer's input in
/// `fuzz/` (zeros once it runs out).
pub trait Entropy {
    /// The next 64 random bits.
    fn next_u64(&mut self) -> u64;

    /// A value below `n` (`n > 0`).
    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True one time in `n`.
    fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

/// splitmix64: deterministic, no dependency.
#[derive(Debug, Clone)]
pub struct SplitMix(pub u64);

impl Entropy for SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// The fuzzer's bytes as entropy.
#[derive(Debug)]
pub struct Bytes<'a>(pub &'a [u8]);

impl Entropy for Bytes<'_> {
    fn next_u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        let n = self.0.len().min(8);
        b[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        u64::from_le_bytes(b)
    }
}
