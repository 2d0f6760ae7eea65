//! libFuzzer entry point of the `manifest` target (see `herald_fuzz::manifest`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| herald_fuzz::manifest(data));
