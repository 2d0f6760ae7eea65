#!/usr/bin/env bash
# The cluster benchmark of issue 13: the cost of the node-to-node hop on one machine.
# Builds release binaries, then runs the same load twice on the local PostgreSQL and Redis,
# each time on a fresh database and a fresh Redis key prefix:
#   1. one node in cluster mode (every send and delivery stays on the node),
#   2. three nodes, users spread over them round-robin, at least half of the pairs across
#      nodes (a send is forwarded to its conversation's owner, a delivery to the recipient's
#      node),
# each at a steady 5,000 msgs/s (send→deliver latency, same-node and cross-node pairs
# apart) and as fast as possible (throughput). Prints the route cache's hit rate under load.
#
#   scripts/cluster-loadtest.sh [extra herald-loadgen flags, e.g. --duration 20s]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
. scripts/services.sh

ensure_postgres
ensure_redis
say "building release binaries"
cargo build --release --locked --bin herald --bin herald-loadgen >&2

admin=${HERALD_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}
redis_url=${HERALD_TEST_REDIS_URL:-redis://127.0.0.1:6379/0}
run_id=$$
pids=()
databases=()
stop_nodes() {
    [ ${#pids[@]} -gt 0 ] && { kill "${pids[@]}" 2>/dev/null || true; wait "${pids[@]}" 2>/dev/null || true; }
    pids=()
}
cleanup() {
    stop_nodes
    for db in "${databases[@]}"; do psql "$admin" -qc "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true; done
    redis-cli -u "$redis_url" --scan --pattern "bench$run_id:*" 2>/dev/null | xargs -r redis-cli -u "$redis_url" del >/dev/null 2>&1 || true
    rm -rf "$work"
}
work=$(mktemp -d)
trap cleanup EXIT

# start_cluster COUNT NAME: COUNT nodes (client ports 7400, 7410, …) on a fresh database.
start_cluster() {
    local count=$1 name=$2 db="herald_bench_${run_id}_$2"
    psql "$admin" -qc "CREATE DATABASE $db" >/dev/null
    databases+=("$db")
    urls=""
    for ((i = 0; i < count; i++)); do
        local port=$((7400 + 10 * i))
        mkdir -p "$work/$name-$i"
        RUST_LOG=warn HERALD_STORAGE__URL="${admin%/*}/$db" HERALD_CLUSTER__REDIS_URL="$redis_url" \
            HERALD_CLUSTER__KEY_PREFIX="bench$run_id:$name:" HERALD_CLUSTER__PEER_LISTEN="127.0.0.1:$((port + 1))" \
            target/release/herald serve --dev --listen "127.0.0.1:$port" --data-dir "$work/$name-$i" &
        pids+=($!)
        urls+="${urls:+,}ws://127.0.0.1:$port/v1/ws"
    done
    for ((i = 0; i < count; i++)); do
        local port=$((7400 + 10 * i)) ready=
        for _ in $(seq 1 300); do
            members=$(curl -sf -H 'authorization: Bearer dev-key' "http://127.0.0.1:$port/admin/cluster" 2>/dev/null \
                | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["members"]))' 2>/dev/null || true)
            [ "$members" = "$count" ] && { ready=1; break; }
            sleep 0.1
        done
        [ -n "$ready" ] || die "node $i of $name did not see $count members"
    done
}

# The route cache's hit rate, summed over the nodes' /metrics.
cache_hit_rate() {
    local count=$1 hits=0 misses=0
    for ((i = 0; i < count; i++)); do
        local metrics
        metrics=$(curl -sf "http://127.0.0.1:$((7400 + 10 * i))/metrics")
        hits=$((hits + $(echo "$metrics" | awk '/^herald_route_cache_hits_total/{s+=$2} END{printf "%d", s}')))
        misses=$((misses + $(echo "$metrics" | awk '/^herald_route_cache_misses_total/{s+=$2} END{printf "%d", s}')))
    done
    python3 -c "h,m=$hits,$misses; print(f'route cache: {h} hits, {m} misses, hit rate {100*h/max(h+m,1):.1f} %')"
}

say "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB; PostgreSQL and Redis and the load generator on the same box"
for nodes in 1 3; do
    start_cluster "$nodes" "n$nodes"
    share=()
    [ "$nodes" -gt 1 ] && share=(--cross-node-share 0.5)
    say "$nodes node(s): 1,000 users at a steady 5,000 msgs/s"
    target/release/herald-loadgen --url "$urls" "${share[@]}" --users 1000 --rate 5000 --duration 10s --quiet "$@"
    cache_hit_rate "$nodes"
    say "$nodes node(s): 1,000 users, as fast as possible"
    target/release/herald-loadgen --url "$urls" "${share[@]}" --users 1000 --duration 10s --quiet "$@"
    stop_nodes
done
