//! The example lambdas in WebAssembly text (`examples/lambdas/`) that the binaries
//! upload; the tests and the services' unit tests read the same files.

/// `lambdas/checksum.wat`: the checksum lambda (128 bytes per iteration from 128-bit SIMD
/// loads), the same function as the services' native `checksum_native`.
pub const CHECKSUM_WAT: &str = include_str!("../lambdas/checksum.wat");
