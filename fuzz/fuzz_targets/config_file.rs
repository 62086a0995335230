//! `icecore_fuzz_targets::config_file` (see there); the main workspace's tests
//! replay its corpus through the same function.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| icecore_fuzz_targets::config_file::run(data));
