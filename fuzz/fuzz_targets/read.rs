//! libFuzzer over `Target::Read` (see `services/src/fuzz.rs`): any panic, or an
//! allocation a peer's length field sizes by itself, is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdmactor_services::fuzz::Target;

fuzz_target!(|data: &[u8]| Target::Read.run(data));
