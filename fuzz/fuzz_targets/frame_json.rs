//! libFuzzer entry point of the `frame_json` target (see `herald_fuzz::frame_json`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| herald_fuzz::frame_json(data));
