#!/usr/bin/env bash
# The client libraries' benchmark, one command: the TypeScript library (in Node) and the Rust
# library, each against one embedded Herald node (the release build, dev mode, SQLite in a
# temporary dir), on this machine: sends/s with every send awaited (one at a time, then 16
# and 256 in flight) and receive throughput (handled and acked in order), with the default
# limits and with the per-connection limits off; then the browser bundle sizes (min+gzip).
# Prints the machine first, so the figures can be quoted with it.
#
#   scripts/client-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
target=${CARGO_TARGET_DIR:-target}
herald=$(realpath -m "$target/release/herald")

say "machine"
{
    echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -n 1), $(nproc) cores online"
    echo "memory: $(free -g | awk '/^Mem:/ { print $2 }') GiB; load now: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "node $(node --version), $(rustc --version)"
} >&2

say "building herald (release) and the Rust library's bench"
cargo build --release --locked -p herald-host --bin herald >&2
cargo build --release --locked -p herald-client --example bench >&2

say "TypeScript library (clients/typescript, npm run bench)"
npm_ci clients/typescript
(cd clients/typescript && npm run --silent generate && HERALD_BIN=$herald npm run --silent bench)

say "Rust library (clients/rust/examples/bench.rs)"
HERALD_BIN=$herald "$target/release/examples/bench"

say "the web chat page's bundle (herald-client with protobuf, and the page)"
build_web_page
