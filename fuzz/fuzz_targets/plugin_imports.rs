//! libFuzzer entry point of the `plugin_imports` target (see `herald_fuzz::plugin_imports`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| herald_fuzz::plugin_imports(data));
