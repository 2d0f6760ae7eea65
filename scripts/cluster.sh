#!/usr/bin/env bash
# Runs a Herald cluster on this machine: three nodes (dev mode) sharing the local Redis and
# PostgreSQL, with the first-party plugins built and loaded. Ctrl-C stops them all.
#
#   scripts/cluster.sh [--nodes N] [--debug] [extra `herald serve` flags for every node]
#
# Node i (0-based) serves clients on 127.0.0.1:70{7+i}0 (7070, 7080, 7090, …) and links to
# the other nodes on the port after it (7071, 7081, 7091, …). Logs go to
# herald-cluster/node-<i>.log. Environment:
#   HERALD_CLUSTER__REDIS_URL  the Redis (default redis://127.0.0.1:6379/0)
#   HERALD_STORAGE__URL        the shared database (default: database herald_cluster on the
#                              local PostgreSQL, created if missing)
#   HERALD_WORKER_THREADS      each node's threads (default: this machine's cores shared
#                              among the nodes, at least one each, since they share it)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

nodes=3 profile=release
while [ $# -gt 0 ]; do
    case $1 in
        --nodes) nodes=${2:?--nodes takes a count}; shift 2 ;;
        --debug) profile=debug; shift ;;
        *) break ;;
    esac
done
[ "$nodes" -ge 1 ] && [ "$nodes" -le 9 ] || die "--nodes must be 1..9"

redis_url=${HERALD_CLUSTER__REDIS_URL:-redis://127.0.0.1:6379/0}
if [ -z "${HERALD_STORAGE__URL:-}" ]; then
    admin=postgres://postgres@127.0.0.1:5432/test
    psql "$admin" -Atc 'SELECT 1' >/dev/null 2>&1 \
        || die "PostgreSQL is not answering at $admin; start it, or set HERALD_STORAGE__URL to a shared mysql:// or postgres:// database"
    if [ "$(psql "$admin" -Atc "SELECT 1 FROM pg_database WHERE datname = 'herald_cluster'")" != 1 ]; then
        say "creating database herald_cluster on the local PostgreSQL"
        psql "$admin" -qc 'CREATE DATABASE herald_cluster' >&2
    fi
    export HERALD_STORAGE__URL=postgres://postgres@127.0.0.1:5432/herald_cluster
fi
# A single Redis is checked here; a redis+cluster:// URL is checked by the nodes at start.
if [[ $redis_url == redis://* ]] && command -v redis-cli >/dev/null; then
    redis-cli -u "$redis_url" ping >/dev/null 2>&1 \
        || die "Redis is not answering at $redis_url; start it (redis-server) or set HERALD_CLUSTER__REDIS_URL"
fi

build_plugins "$profile"
install_plugins herald-cluster/plugins "$profile"
say "building herald ($profile)"
flag=--release
[ "$profile" = debug ] && flag=
cargo build $flag --locked -p herald-host --bin herald >&2

pids=()
stop_all() {
    trap - INT TERM EXIT
    [ ${#pids[@]} -gt 0 ] || return 0
    say "stopping ${#pids[@]} nodes"
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
}
trap 'stop_all; exit 0' INT TERM
trap stop_all EXIT

share=$(($(nproc) / nodes))
export HERALD_WORKER_THREADS=${HERALD_WORKER_THREADS:-$((share > 0 ? share : 1))}
for ((i = 0; i < nodes; i++)); do
    port=$((7070 + 10 * i))
    mkdir -p "herald-cluster/node-$i"
    HERALD_CLUSTER__REDIS_URL=$redis_url HERALD_CLUSTER__PEER_LISTEN=127.0.0.1:$((port + 1)) \
        "target/$profile/herald" serve --dev --listen "127.0.0.1:$port" \
        --data-dir "herald-cluster/node-$i" --plugins herald-cluster/plugins "$@" \
        >"herald-cluster/node-$i.log" 2>&1 &
    pids+=($!)
done

for ((i = 0; i < nodes; i++)); do
    port=$((7070 + 10 * i))
    for _ in $(seq 1 100); do
        curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
        kill -0 "${pids[$i]}" 2>/dev/null || die "node $i stopped; see herald-cluster/node-$i.log"
        sleep 0.1
    done
    curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 || die "node $i is not ready; see herald-cluster/node-$i.log"
    printf 'node %d  http://127.0.0.1:%d  (ws://127.0.0.1:%d/v1/ws, peers on :%d, log herald-cluster/node-%d.log)\n' \
        "$i" "$port" "$port" "$((port + 1))" "$i"
done
say "cluster of $nodes nodes on $redis_url and ${HERALD_STORAGE__URL%%\?*} — GET /admin/cluster (key dev-key) shows the ring; Ctrl-C stops it"
wait -n "${pids[@]}" || true
die "a node stopped; see herald-cluster/node-*.log"
