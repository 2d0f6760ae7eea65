# Shared by the cluster benchmarks (cluster-loadtest.sh, cluster-overload-bench.sh): nodes
# of a cluster on this box on the local PostgreSQL and Redis, each run on a fresh database
# and key prefix removed at the end, and the counters of how delivery fell back. Source it
# after lib.sh and services.sh: it makes sure PostgreSQL and Redis are up, builds the release
# binaries, and sets an EXIT trap.

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

# threads_per_node COUNT: this box's cores shared among COUNT nodes, at least one each.
threads_per_node() {
    local share=$(($(nproc) / $1))
    echo $((share > 0 ? share : 1))
}

# start_cluster COUNT NAME [VAR=VALUE …]: COUNT nodes (client ports 7400, 7410, …) on a
# fresh database, each with the settings given (e.g. HERALD_INTAKE__SENDS_PER_NODE=700).
# The shell variable `herald_bin` names another Herald binary to run (an older build, to
# compare in one session).
start_cluster() {
    local count=$1 name=$2 db="herald_bench_${run_id}_$2"
    local settings=("${@:3}")
    psql "$admin" -qc "CREATE DATABASE $db" >/dev/null
    databases+=("$db")
    urls=""
    for ((i = 0; i < count; i++)); do
        local port=$((7400 + 10 * i))
        mkdir -p "$work/$name-$i"
        env "${settings[@]}" RUST_LOG=warn HERALD_WORKER_THREADS=${HERALD_WORKER_THREADS:-$(threads_per_node "$count")} HERALD_STORAGE__URL="${admin%/*}/$db" HERALD_CLUSTER__REDIS_URL="$redis_url" \
            HERALD_CLUSTER__KEY_PREFIX="bench$run_id:$name:" HERALD_CLUSTER__PEER_LISTEN="127.0.0.1:$((port + 1))" \
            "${herald_bin:-target/release/herald}" serve --dev --listen "127.0.0.1:$port" --data-dir "$work/$name-$i" &
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

# Counters summed over the nodes' /metrics, since the last call (a new cluster's counters
# start at zero, and the loop removes the baseline when it starts one): the route
# cache's hit rate, and how often delivery fell back — fan-outs sent to every node because
# the route table could not be read, and failed hops asked again, by outcome.
cluster_counters() {
    local count=$1
    for ((i = 0; i < count; i++)); do
        curl -sf "http://127.0.0.1:$((7400 + 10 * i))/metrics"
    done | python3 -c '
import json, os, re, sys
state = sys.argv[1]
now = {}
for line in sys.stdin:
    m = re.match(r"(herald_route_cache_(?:hits|misses|joined)_total|herald_delivery_unrouted_total|herald_delivery_hop_retries_total[{][^}]*[}]) (\S+)", line)
    if m:
        now[m[1]] = now.get(m[1], 0) + float(m[2])
before = json.load(open(state)) if os.path.exists(state) else {}
json.dump(now, open(state, "w"))
d = {k: v - before.get(k, 0) for k, v in now.items()}
h, m = d.get("herald_route_cache_hits_total", 0), d.get("herald_route_cache_misses_total", 0)
j = d.get("herald_route_cache_joined_total", 0)
print(f"route cache over this run: {h:.0f} hits, {m:.0f} misses ({j:.0f} of them waited for a read under way), "
      + f"hit rate {100 * h / max(h + m, 1):.1f} %")
hops = []
for k, v in sorted(d.items()):
    if "hop_retries" in k:
        hops.append(k.split("\"")[1] + f" {v:.0f}")
unrouted = d.get("herald_delivery_unrouted_total", 0)
print(f"fallbacks over this run: {unrouted:.0f} fan-outs sent to every node (route table unreadable); "
      + "failed hops: " + (", ".join(hops) or "none"))
' "$work/counters.json"
}

