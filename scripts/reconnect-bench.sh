#!/usr/bin/env bash
# The reconnect storm (ARCHITECTURE.md §3, reconnect grace): builds release binaries, then
# twice starts a fresh embedded Herald (dev mode, a temporary data dir) — with the default
# reconnect grace period, then with it off — and runs herald-reconnect against it: N devices,
# each in C conversations read to the end, drop at once, get one message each while away,
# and all reconnect at once.
#
#   scripts/reconnect-bench.sh [herald-reconnect flags, e.g. --users 1000 --conversations 80]
#
# In cluster mode the devices come back to another node, as behind a load balancer that
# picks any node: three nodes on the local PostgreSQL and Redis (scripts/cluster-lib.sh),
# the devices set up on node 0 and reconnecting to node 1, which takes their parked
# sessions over from node 0 (grace on) or backfills them in full (grace off).
#
#   scripts/reconnect-bench.sh cluster [herald-reconnect flags]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

if [ "${1:-}" = cluster ]; then
    shift
    . scripts/services.sh
    . scripts/cluster-lib.sh
    cargo build --release --locked --bin herald-reconnect >&2
    say "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(lscpu | sed -n 's/^Model name: *//p'); three nodes and the clients on the same box"
    for grace in 30000 0; do
        start_cluster 3 "grace$grace" "HERALD_GATEWAY__RECONNECT_GRACE_MS=$grace"
        label="3 nodes, back on another node, grace ${grace} ms"
        [ "$grace" = 0 ] && label="3 nodes, back on another node, grace off"
        target/release/herald-reconnect --url ws://127.0.0.1:7400/v1/ws --back-url ws://127.0.0.1:7410/v1/ws \
            --label "$label" "$@"
        stop_nodes
    done
    exit 0
fi

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
