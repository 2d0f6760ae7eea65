#!/usr/bin/env bash
# The overload benchmark of a cluster: three nodes on the local PostgreSQL and Redis, their
# intake together sized at INTAKE msgs/s (`intake.sends_per_node` = INTAKE / 3 on each),
# 1,000 users spread over them (half of the pairs across nodes), driven at three times the
# intake for SPIKE_SECONDS, then back to half of it. Each of RUNS runs (default 3) starts a
# fresh cluster and prints:
#   - admitted sends' send->ack p99 unloaded (half the intake, SPIKE_SECONDS) and during the
#     spike (target: within 2x of unloaded), and how many sends got RETRY or were given up;
#   - the 5 s right after the spike (target: p99 back at the unloaded value, no RETRY);
#   - whether every message acked OK reached its recipient's connected device with no sync
#     (`--verify`: "exact"), during the spike and after it;
#   - the fallbacks over the spike: fan-outs sent to every node because the route table could
#     not be read, and failed deliver hops asked again (bounded: they must not multiply).
#
#   [INTAKE=3000] [SPIKE_SECONDS=30] [RUNS=3] scripts/cluster-overload-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
. scripts/services.sh

ensure_postgres
ensure_redis
say "building release binaries"
cargo build --release --locked --bin herald --bin herald-loadgen >&2
. scripts/cluster-lib.sh

intake=${INTAKE:-3000}
spike=${SPIKE_SECONDS:-30}
runs=${RUNS:-3}
per_node=$((intake / 3))

# load RATE SECONDS WARMUP: the load generator over the three nodes; prints its JSON line
# (also when it exits non-zero, a run that did not drain or verify: the line says how).
load() {
    { target/release/herald-loadgen --url "$urls" --cross-node-share 0.5 --users 1000 --rate "$1" \
        --duration "$2s" --warmup "$3s" --verify --quiet || true; } | tail -n 1
}

# phase NAME JSON: one phase's figures on a line.
phase() {
    python3 -c '
import json, sys
name, run = sys.argv[1], json.loads(sys.argv[2])
ack, counts, check = run["send_ack_latency"], run["counts"], run.get("verification", {})
exact = "exact" if check.get("exact") else f"MISMATCH ({check.get(\"missing\")} missing)"
print(f"  {name:18} sent {run[\"sent_per_s\"]:7.0f}/s  admitted send->ack p50 {ack[\"p50_us\"] / 1000:7.2f} ms"
      f"  p99 {ack[\"p99_us\"] / 1000:8.2f} ms  RETRY {counts[\"send_ack_retry\"]:7d}  gave up {counts[\"given_up\"]:5d}"
      f"  deliveries: {exact}")
' "$1" "$2"
}

say "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB; PostgreSQL, Redis and the load generator on the same box"
say "intake: $intake msgs/s in all, intake.sends_per_node = $per_node on each of 3 nodes; spike ${spike} s at $((3 * intake)) msgs/s"
for run in $(seq 1 "$runs"); do
    start_cluster 3 "o$run" HERALD_INTAKE__SENDS_PER_NODE="$per_node" \
        HERALD_INTAKE__NODE_BURST="${NODE_BURST:-$((per_node / 20))}"
    rm -f "$work/counters.json"
    say "run $run of $runs: unloaded, half the intake ($((intake / 2)) msgs/s) for ${spike} s"
    unloaded=$(load $((intake / 2)) "$spike" 10)
    cluster_counters 3 >/dev/null
    say "run $run of $runs: spike, three times the intake ($((3 * intake)) msgs/s offered) for ${spike} s"
    spiked=$(load $((3 * intake)) "$spike" 2)
    fallbacks=$(cluster_counters 3 | tail -n 1)
    say "run $run of $runs: right after, half the intake for 5 s, measured from the first second"
    recovered=$(load $((intake / 2)) 5 0)
    stop_nodes
    echo "run $run:"
    phase "unloaded" "$unloaded"
    phase "spike (3x intake)" "$spiked"
    phase "right after (5 s)" "$recovered"
    python3 -c '
import json, sys
unloaded, spiked, after = (json.loads(a)["send_ack_latency"]["p99_us"] for a in sys.argv[1:4])
retry = json.loads(sys.argv[3])["counts"]["send_ack_retry"]
print(f"  admitted p99: spike / unloaded {spiked / max(unloaded, 1):.2f}x (target <= 2x); "
      f"after / unloaded {after / max(unloaded, 1):.2f}x with {retry} RETRY after (target: back, none)")
' "$unloaded" "$spiked" "$recovered"
    echo "  spike: $fallbacks"
done
