//! The fuzzer's bytes become a sequence of wire messages, chunk arrivals and completions
//! for the file-transfer `Sender`, `Receiver` and `Server` state machines (the same
//! driver as the seeded test in `services/src/file_transfer/fuzz.rs`). Any panic is a
//! finding: a peer must never be able to panic the poller thread.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdmactor_services::file_transfer::fuzz::{run_sequence, Bytes};

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("a temporary directory");
    run_sequence(&mut Bytes(data), dir.path(), 64);
});
