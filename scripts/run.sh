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
if [ -d plugins/target/wasm32-wasip2/release ]; then
    mkdir -p "$data_dir/plugins"
    for wasm in plugins/target/wasm32-wasip2/release/*.wasm; do
        [ -e "$wasm" ] || continue
        cp "$wasm" "$data_dir/plugins/"
        # A plugin's manifest (name, hooks, config) sits beside it, when it has one.
        manifest="plugins/$(basename "$wasm" .wasm | tr _ -)/herald-plugin.toml"
        [ -f "$manifest" ] && cp "$manifest" "$data_dir/plugins/$(basename "$wasm" .wasm).toml"
    done
fi
say "building herald"
cargo build --release --locked -p herald-host --bin herald >&2
say "starting herald (embedded mode, dev) on http://127.0.0.1:7070 — Ctrl-C stops it"
exec target/release/herald serve --dev --data-dir "$data_dir" "$@"
