//! Target `connect`: the CONNECT handshake's decision (`connection::admission::decide`); see `checks::connect`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../checks/mod.rs"]
mod checks;

fuzz_target!(|data: &[u8]| checks::connect(data));
