//! The fuzzer's bytes become one sequence against two connection cores joined by
//! loopback QPs: honest messages both ways, and on the same QP whatever a hostile peer
//! can send (any frame kind, lying credits and lengths, mutated real frames), closes and
//! timers. A panic is a finding: an honest message delivered twice, out of order or
//! altered, a pool chunk not back once the cores are gone, or a panic in the core.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdmactor::fuzz::{fuzz_connection, Bytes};

fuzz_target!(|data: &[u8]| {
    fuzz_connection(&mut Bytes(data));
});
