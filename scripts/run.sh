#!/usr/bin/env bash
# Runs Herald in embedded mode on this machine: SQLite under ./herald-data, in-memory state,
# dev mode on http://127.0.0.1:7070, with the first-party plugins built and loaded.
#
#   scripts/run.sh [extra `herald serve` flags]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

data_dir=${HERALD_DATA_DIR:-herald-data}
build_plugins release
# Install each first-party plugin as <name>.wasm with its manifest beside it as <name>.toml.
mkdir -p "$data_dir/plugins"
for manifest in plugins/*/plugin.toml; do
    [ -e "$manifest" ] || continue
    name=$(basename "$(dirname "$manifest")")
    wasm="plugins/target/wasm32-wasip2/release/$(echo "$name" | tr - _).wasm"
    [ -f "$wasm" ] || die "plugin $name was not built ($wasm missing)"
    cp "$wasm" "$data_dir/plugins/$name.wasm"
    cp "$manifest" "$data_dir/plugins/$name.toml"
done
say "building herald"
cargo build --release --locked -p herald-host --bin herald >&2
say "starting herald (embedded mode, dev) on http://127.0.0.1:7070 — Ctrl-C stops it"
exec target/release/herald serve --dev --data-dir "$data_dir" "$@"
