//! Target `decode_rules`: the decoder under the receiver's `DecodeRules`; see `checks::decode_rules`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../checks/mod.rs"]
mod checks;

fuzz_target!(|data: &[u8]| checks::decode_rules(data));
