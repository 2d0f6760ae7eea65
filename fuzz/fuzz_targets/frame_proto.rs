//! libFuzzer entry point of the `frame_proto` target (see `herald_fuzz::frame_proto`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| herald_fuzz::frame_proto(data));
