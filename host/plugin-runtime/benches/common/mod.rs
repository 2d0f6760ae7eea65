//! What the benchmarks share: the runtime's test guests, built for wasm32-wasip2.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// Builds `tests/guests` into `target/plugin-guests`; returns the folder of the `.wasm` files.
pub fn build_test_guests() -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = crate_dir.join("../../target/plugin-guests");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--release", "--target", "wasm32-wasip2", "--manifest-path"])
        .arg(crate_dir.join("tests/guests/Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .expect("running cargo");
    assert!(status.success(), "building the guest plugins failed");
    target.join("wasm32-wasip2/release")
}
