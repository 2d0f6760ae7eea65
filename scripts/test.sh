#!/usr/bin/env bash
# Herald's whole test suite, as CI runs it: starts the local services the tests need,
# builds the plugins, checks lints, and runs every test.
#
#   scripts/test.sh            everything
#   scripts/test.sh -- ARGS    extra arguments for `cargo test` (e.g. a test name filter)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
. scripts/services.sh

ensure_services
ensure_wasm_target
ensure_chromium
build_plugins debug
build_test_guests

say "formatting (rustfmt.toml; \`cargo fmt --all\` fixes it)"
for manifest in Cargo.toml plugins/Cargo.toml host/plugin-runtime/tests/guests/Cargo.toml; do
    cargo fmt --manifest-path "$manifest" --all --check >/dev/null \
        || die "$manifest: code is not formatted; run: cargo fmt --manifest-path $manifest --all"
done

say "clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

if [ -f plugins/Cargo.toml ]; then
    say "plugin unit tests (native, with the SDK's test kit)"
    cargo test --manifest-path plugins/Cargo.toml --locked
fi

say "workspace tests"
[ "${1:-}" = "--" ] && shift
cargo test --workspace --locked "$@"
