#!/usr/bin/env bash
# The reconnect storm (ARCHITECTURE.md §3, reconnect grace): builds release binaries, then
# twice starts a fresh embedded Herald (dev mode, a temporary data dir) — with the default
# reconnect grace period, then with it off — and runs herald-reconnect against it: N devices,
# each in C conversations read to the end, drop at once, get one message each while away,
# and all reconnect at once.
#
#   scripts/reconnect-bench.sh [herald-reconnect flags, e.g. --users 1000 --conversations 80]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

say "building release binaries"
cargo build --release --locked --bin herald --bin herald-reconnect >&2
say "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(lscpu | sed -n 's/^Model name: *//p'); the clients on the same box"
port=${HERALD_LOADTEST_PORT:-7098}
data=""
trap 'stop_herald; [ -z "$data" ] || rm -rf "$data"' EXIT
for grace in 30000 0; do
    data=$(mktemp -d)
    start_herald "$port" "$data" "HERALD_GATEWAY__RECONNECT_GRACE_MS=$grace"
    label="grace ${grace} ms"
    [ "$grace" = 0 ] && label="grace off"
    target/release/herald-reconnect --url "ws://127.0.0.1:$port/v1/ws" --label "$label" "$@"
    stop_herald
    rm -rf "$data"
    data=""
done
