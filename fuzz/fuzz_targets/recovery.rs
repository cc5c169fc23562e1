//! Target `recovery`: arbitrary bytes as a store file, opened by `LogStore::open`; see `checks::recovery`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../checks/mod.rs"]
mod checks;

fuzz_target!(|data: &[u8]| checks::recovery(data));
