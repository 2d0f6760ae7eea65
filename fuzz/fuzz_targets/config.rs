//! libFuzzer entry point of the `config` target (see `herald_fuzz::config`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| herald_fuzz::config(data));
