#!/usr/bin/env bash
# The cluster benchmark of issue 13: the cost of the node-to-node hop on one machine.
# Builds release binaries, then runs the same load twice on the local PostgreSQL and Redis,
# each time on a fresh database and a fresh Redis key prefix:
#   1. one node in cluster mode (every send and delivery stays on the node),
#   2. three nodes, users spread over them round-robin, at least half of the pairs across
#      nodes (a send is forwarded to its conversation's owner, a delivery to the recipient's
#      node),
# each at steady rates after $WARMUP (default 10 s) of load left unmeasured: route lookups
# warm up, and each new conversation's seq step grows from `seq.min_step` (16) to the size
# that lasts `seq.segment_lifetime_ms`, which at 10 msgs/s per conversation takes about
# 10 s (until then a lease, one more commit, per conversation every few seconds)
# (send→deliver latency, same-node and cross-node pairs apart; by
# default 1,500 msgs/s, which this 2-core box carries with three nodes, and 5,000, the
# target's rate) and as fast as possible (throughput). Prints the route cache's hit rate
# under load, how often delivery fell back (fan-outs sent to every node, failed hops asked
# again or not, herald_delivery_unrouted_total and _hop_retries_total), how long each step of a send took on one node (herald_send_stage_seconds,
# herald_cluster_peer_request_seconds, herald_redis_call_seconds) and the CPU each program
# used.
#
# Nodes sharing this box get a share of its cores each: HERALD_WORKER_THREADS defaults to
# cores / nodes (at least 1), so one node runs one thread per core and three nodes on two
# cores one each (about 8 % of a core less than two each, at the same latency and
# throughput within the noise, in alternating runs); set HERALD_WORKER_THREADS to compare.
#
#   [STEADY_RATES="1500 5000"] [WARMUP=10] [NODES="1 3"] scripts/cluster-loadtest.sh [extra herald-loadgen flags, e.g. --duration 20s]
#   REPORT=DIR scripts/cluster-loadtest.sh     # also charts and a page per run: DIR/n<nodes>-steady-<rate>/, DIR/n<nodes>-max/
set -euo pipefail
# A relative REPORT is relative to where the script was started, not to the repository.
[ -z "${REPORT:-}" ] || REPORT=$(realpath -m -- "$REPORT")
cd "$(dirname "$0")/.."
. scripts/lib.sh
. scripts/services.sh

ensure_postgres
ensure_redis
say "building release binaries"
cargo build --release --locked --bin herald --bin herald-loadgen >&2

export WARMUP=${WARMUP:-10}
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

# start_cluster COUNT NAME: COUNT nodes (client ports 7400, 7410, …) on a fresh database.
start_cluster() {
    local count=$1 name=$2 db="herald_bench_${run_id}_$2"
    psql "$admin" -qc "CREATE DATABASE $db" >/dev/null
    databases+=("$db")
    urls=""
    for ((i = 0; i < count; i++)); do
        local port=$((7400 + 10 * i))
        mkdir -p "$work/$name-$i"
        RUST_LOG=warn HERALD_WORKER_THREADS=${HERALD_WORKER_THREADS:-$(threads_per_node "$count")} HERALD_STORAGE__URL="${admin%/*}/$db" HERALD_CLUSTER__REDIS_URL="$redis_url" \
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

# p50 / p99 of each step of a send on the first node over the last minute (summaries).
stage_times() {
    curl -sf "http://127.0.0.1:7400/metrics" | python3 -c '
import re, sys
pattern = re.compile(r"herald_(send_stage|cluster_peer_request|redis_call)_seconds[{]\w+=\"([^\"]+)\",quantile=\"(0[.]5|0[.]99)\"[}] (\S+)")
rows = {}
for line in sys.stdin:
    m = pattern.match(line)
    if m:
        rows.setdefault(m[1] + " " + m[2], {})[m[3]] = float(m[4]) * 1000
for name, q in sorted(rows.items()):
    p50, p99 = q.get("0.5", 0), q.get("0.99", 0)
    print(f"  {name:42} p50 {p50:8.2f} ms   p99 {p99:8.2f} ms")
'
}

# CPU used by each program on the box (herald, postgres, redis-server, herald-loadgen, …)
# over 8 s of a run's measured window, in % of one core: where the machine's time went.
cpu_share() {
    python3 - <<'PY'
import os, time
def ticks():
    by = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        name, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        by[pid] = (name, int(fields[11]) + int(fields[12]))
    return by
time.sleep(float(os.environ["WARMUP"]) + 1)
before, start = ticks(), time.monotonic()
time.sleep(8)
after, seconds = ticks(), time.monotonic() - start
hz = os.sysconf("SC_CLK_TCK")
used = {}
for pid, (name, n) in after.items():  # a process that ended meanwhile is left out
    used[name] = used.get(name, 0) + (n - before.get(pid, (name, 0))[1]) / hz / seconds * 100
top = sorted(((p, n) for n, p in used.items() if p >= 1), reverse=True)
print(f"  CPU (% of one core, of {100 * os.cpu_count()}): " + ", ".join(f"{n} {p:.0f}" for p, n in top))
PY
}

say "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB; PostgreSQL and Redis and the load generator on the same box; worker threads per node: ${HERALD_WORKER_THREADS:-cores / nodes}"
for nodes in ${NODES:-1 3}; do
    start_cluster "$nodes" "n$nodes"
    rm -f "$work/counters.json"
    share=()
    [ "$nodes" -gt 1 ] && share=(--cross-node-share 0.5)
    for rate in ${STEADY_RATES:-1500 5000}; do
        say "$nodes node(s): 1,000 users at a steady $rate msgs/s"
        cpu_share > "$work/cpu" &
        report_flags "n$nodes-steady-$rate"
        # --verify: every message acked OK must reach its recipient's connected device, with
        # no sync (a line "ids: … exact", or the count missing).
        target/release/herald-loadgen --url "$urls" "${share[@]}" --users 1000 --rate "$rate" --warmup "${WARMUP}s" --duration 10s --verify --quiet "${report[@]}" "$@"
        wait $!
        cat "$work/cpu"
        stage_times
        cluster_counters "$nodes"
    done
    say "$nodes node(s): 1,000 users, as fast as possible"
    report_flags "n$nodes-max"
    target/release/herald-loadgen --url "$urls" "${share[@]}" --users 1000 --duration 10s --quiet "${report[@]}" "$@"
    cluster_counters "$nodes"
    stop_nodes
done
[ -z "${REPORT:-}" ] || say "reports: $REPORT/*/index.html"
