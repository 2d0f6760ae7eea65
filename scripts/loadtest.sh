#!/usr/bin/env bash
# The messaging benchmark of issue 3: builds release binaries, starts a fresh embedded
# Herald (persistence on, dev mode, a temporary data dir), then drives 1,000 connected
# users in pairs through the real WebSocket path with herald-loadgen:
#   1. at a steady 5,000 msgs/s, for send→deliver latency,
#   2. as fast as possible, compared with a trivial relay (no persistence),
#   3. at 5,000 msgs/s again, right after that burst: the latency while SQLite is still
#      checkpointing the burst's write-ahead log (the disk is busier, commits slower).
#
#   scripts/loadtest.sh [extra herald-loadgen flags, e.g. --duration 20s]
#   HERALD_LOADTEST_PLUGINS=1 scripts/loadtest.sh     # the same with all four first-party plugins loaded
#   REPORT=DIR scripts/loadtest.sh                    # also charts and a page per phase: DIR/<phase>/index.html
set -euo pipefail
# A relative REPORT is relative to where the script was started, not to the repository.
[ -z "${REPORT:-}" ] || REPORT=$(realpath -m -- "$REPORT")
cd "$(dirname "$0")/.."
. scripts/lib.sh

say "building release binaries"
# Name the binaries: `--bin` would otherwise filter every package given with `-p`.
cargo build --release --locked --bin herald --bin herald-loadgen --bin herald-relay >&2
data=$(mktemp -d)
if [ "${HERALD_LOADTEST_PLUGINS:-0}" = 1 ]; then
    build_plugins release
    install_plugins "$data/plugins"
    say "first-party plugins loaded: $(ls "$data/plugins" | grep -c wasm)"
fi
port=${HERALD_LOADTEST_PORT:-7099}
trap 'stop_herald; rm -rf "$data"' EXIT
start_herald "$port" "$data"
say "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB; load generator on the same box"
say "1) 1,000 users at a steady 5,000 msgs/s"
report_flags 1-steady-5000
target/release/herald-loadgen --url "ws://127.0.0.1:$port/v1/ws" --users 1000 --rate 5000 --duration 10s --compare-relay --quiet "${report[@]}" "$@"
say "2) 1,000 users, as fast as possible, Herald vs a trivial relay"
report_flags 2-max
target/release/herald-loadgen --url "ws://127.0.0.1:$port/v1/ws" --users 1000 --duration 10s --compare-relay --quiet "${report[@]}" "$@"
say "3) 1,000 users at 5,000 msgs/s right after the burst (SQLite still checkpointing it)"
report_flags 3-after-burst-5000
target/release/herald-loadgen --url "ws://127.0.0.1:$port/v1/ws" --users 1000 --rate 5000 --duration 10s --quiet "${report[@]}" "$@"
[ -z "${REPORT:-}" ] || say "reports: $REPORT/{1-steady-5000,2-max,3-after-burst-5000}/index.html"
