//! Target `decode`: arbitrary bytes through the decoder at every level; see `checks::decode_roundtrip`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../checks/mod.rs"]
mod checks;

fuzz_target!(|data: &[u8]| checks::decode_roundtrip(data));
