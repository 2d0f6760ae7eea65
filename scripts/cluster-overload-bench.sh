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
#     (`--verify`: "0 acked and not pushed"), during the spike and after it;
#   - the fallbacks over the spike: fan-outs sent to every node because the route table could
#     not be read, and failed deliver hops asked again (bounded: they must not multiply);
#   - then, on a fresh cluster with no node rate set (`intake.sends_per_node` 0, the default),
#     10 s as fast as the load generator can send: what the nodes' own protection (the
#     backlog cap, the delay gate) makes of load past saturation, with the same figures.
#
# INTAKE is what the three nodes together take in with a low tail on this box: 1,500 by
# default. Three nodes on one 2-core box, each message crossing a node and Redis, carry less
# than one node does (`scripts/overload-bench.sh` sizes one node at 2,000): at 2,000 the
# spike's admitted p99 was 1.5-2.2x the unloaded one, at 3,000 2.7x.
# NODE_SETTINGS adds settings of every node, e.g. NODE_SETTINGS="HERALD_INTAKE__SEND_DELAY_TARGET_MS=0".
#
#   [INTAKE=1500] [SPIKE_SECONDS=30] [RUNS=3] [NODE_SETTINGS=…] scripts/cluster-overload-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
. scripts/services.sh
. scripts/cluster-lib.sh

intake=${INTAKE:-1500}
spike=${SPIKE_SECONDS:-30}
runs=${RUNS:-3}
per_node=$((intake / 3))
# Each phase's JSON summary is kept here (run<N>-<phase>.json), to look at again.
results=${RESULTS:-target/cluster-overload}
mkdir -p "$results"

# load RATE SECONDS WARMUP: the load generator over the three nodes as the users "$users"
# (the phases of a run share them, and so their conversations: the phase right after the
# spike measures the cluster's recovery, not the first leases of 1,000 new conversations)
# (RATE 0: as fast as it
# can); prints its JSON line (also when it exits non-zero, a run that did not drain or
# verify: the line says how). The drain outlasts the longest wait a turned-back send is told
# (`intake.node_retry_after_max_ms`, 10 s), so what is counted as not pushed was not.
load() {
    local rate=()
    [ "$1" -gt 0 ] && rate=(--rate "$1")
    { target/release/herald-loadgen --url "$urls" --cross-node-share 0.5 --users 1000 "${rate[@]}" --user-prefix "$users" \
        --duration "$2s" --warmup "$3s" --drain 15s --verify --quiet || true; } | tail -n 1
}

# phase NAME JSON: one phase's figures on a line.
phase() {
    python3 -c '
import json, sys
name, run = sys.argv[1], json.loads(sys.argv[2])
ack, counts, check = run["send_ack_latency"], run["counts"], run.get("verification", {})
# Missing: acked OK, never pushed to its connected recipient. Delivered but not acked in
# this phase: pushed to a device this phase reconnected, sent in an earlier phase.
missing, earlier = check.get("missing", 0), check.get("unacknowledged", 0)
exact = f"{missing} acked and not pushed" + (f" ({earlier} of an earlier phase pushed)" if earlier else "")
rate, p50, p99 = run["sent_per_s"], ack["p50_us"] / 1000, ack["p99_us"] / 1000
retry, gave_up = counts["send_ack_retry"], counts["given_up"]
print(f"  {name:18} sent {rate:7.0f}/s  admitted send->ack p50 {p50:7.2f} ms  p99 {p99:8.2f} ms"
      f"  RETRY {retry:7d}  gave up {gave_up:5d}  deliveries: {exact}")
' "$1" "$2"
}

say "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB; PostgreSQL, Redis and the load generator on the same box"
say "intake: $intake msgs/s in all, intake.sends_per_node = $per_node on each of 3 nodes; spike ${spike} s at $((3 * intake)) msgs/s"
for run in $(seq 1 "$runs"); do
    start_cluster 3 "o$run" HERALD_INTAKE__SENDS_PER_NODE="$per_node" \
        HERALD_INTAKE__NODE_BURST="${NODE_BURST:-$((per_node / 20))}" ${NODE_SETTINGS:-}
    rm -f "$work/counters.json"
    users="ob$$-$run"
    say "run $run of $runs: unloaded, half the intake ($((intake / 2)) msgs/s) for ${spike} s"
    unloaded=$(load $((intake / 2)) "$spike" 10)
    cluster_counters 3 >/dev/null
    say "run $run of $runs: spike, three times the intake ($((3 * intake)) msgs/s offered) for ${spike} s"
    spiked=$(load $((3 * intake)) "$spike" 2)
    fallbacks=$(cluster_counters 3 | tail -n 1)
    say "run $run of $runs: right after, half the intake for 5 s, measured from the first second"
    recovered=$(load $((intake / 2)) 5 0)
    stop_nodes
    for phase in unloaded spiked recovered; do printf '%s\n' "${!phase}" >"$results/run$run-$phase.json"; done
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

    start_cluster 3 "f$run" ${NODE_SETTINGS:-}
    rm -f "$work/counters.json"
    users="of$$-$run"
    say "run $run of $runs: a fresh cluster with no node rate, as fast as possible for 10 s"
    flat=$(load 0 10 2)
    fallbacks=$(cluster_counters 3 | tail -n 1)
    stop_nodes
    printf '%s\n' "$flat" >"$results/run$run-flat-out.json"
    phase "flat out, no rate" "$flat"
    echo "  flat out: $fallbacks"
done
