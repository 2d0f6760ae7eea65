//! libFuzzer entry point of the `token` target (see `herald_fuzz::token`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| herald_fuzz::token(data));
