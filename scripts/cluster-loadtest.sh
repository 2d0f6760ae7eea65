#!/usr/bin/env bash
# The cluster benchmark: the cost of the node-to-node hop on one machine.
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

export WARMUP=${WARMUP:-10}
. scripts/cluster-lib.sh

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
