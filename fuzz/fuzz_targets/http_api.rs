//! libFuzzer entry point of the `http_api` target (see `herald_fuzz::http_api`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| herald_fuzz::http_api(data));
