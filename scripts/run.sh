#!/usr/bin/env bash
# Runs Herald in embedded mode on this machine: SQLite under ./herald-data, in-memory state,
# dev mode on http://127.0.0.1:7070 (the web chat page at /), with the first-party plugins
# built and loaded.
#
#   scripts/run.sh [extra `herald serve` flags]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

data_dir=${HERALD_DATA_DIR:-herald-data}
build_plugins release
install_plugins "$data_dir/plugins"
build_web_page
say "building herald"
cargo build --release --locked -p herald-host --bin herald >&2
say "starting herald (embedded mode, dev) on http://127.0.0.1:7070 — Ctrl-C stops it"
exec target/release/herald serve --dev --data-dir "$data_dir" "$@"
