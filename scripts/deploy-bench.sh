#!/usr/bin/env bash
# The plugin registry's deploy benchmark: three release nodes on the local PostgreSQL and
# Redis, `echo` deployed through the registry (every message passes its message policy),
# then:
#   1. how long a deploy takes, from `herald plugin deploy` to every node serving the new
#      version (the command answers then): DEPLOYS deploys (default 20), alternating
#      between two uploaded versions, with no load — median and worst;
#   2. the same load twice, RATE msgs/s (default 5,000) over 1,000 users spread on the
#      nodes: once without deploys, once with deploys one after another for the whole
#      window — send→deliver p99 of each, their ratio (target: within ×1.2) and every
#      send that was not acknowledged OK (target: none).
# Each part also prints the median of each step of its deploys (the answer's phases_ms:
# ready, hold, switch, apply; the hook calls wait from the hold to the apply).
#
#   [RATE=5000] [DEPLOYS=20] [DURATION=20] scripts/deploy-bench.sh
#
# A deploy holds the calls of the plugin's hooks on every node for its switch (a few round
# trips to Redis and the database); the second run is what that costs the traffic.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
. scripts/services.sh

RATE=${RATE:-5000}
DEPLOYS=${DEPLOYS:-20}
DURATION=${DURATION:-20}
ensure_wasm_target
build_test_guests
. scripts/cluster-lib.sh

guests=target/plugin-guests/wasm32-wasip2/release
[ -f "$guests/echo_v1.wasm" ] && [ -f "$guests/echo_v2.wasm" ] || die "the echo guests were not built in $guests"
printf 'name = "echo"\nversion = "1.0.0"\n' >"$work/echo-1.toml"
printf 'name = "echo"\nversion = "2.0.0"\n' >"$work/echo-2.toml"

# deploy PORT VERSION: one deploy through node PORT; prints its wall time and then its own
# steps (the answer's phases_ms: ready, hold, switch, apply), in ms, or fails.
deploy() {
    local started ended
    started=$(date +%s%N)
    target/release/herald plugin deploy echo "$2" --url "http://127.0.0.1:$1" --key dev-key >"$work/deploy.json" \
        || die "deploy of echo $2 failed: $(cat "$work/deploy.json")"
    ended=$(date +%s%N)
    python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
if not d.get("applied_everywhere"):
    sys.exit(1)
p = d["phases_ms"]
print(sys.argv[2], p["ready"], p["hold"], p["switch"], p["apply"])' "$work/deploy.json" $(((ended - started) / 1000000)) \
        || die "deploy of echo $2 did not reach every node: $(cat "$work/deploy.json")"
}

say "3 nodes, echo 1.0.0 and 2.0.0 uploaded, 1.0.0 deployed"
start_cluster 3 deploy
ports=(7400 7410 7420)
target/release/herald plugin push "$guests/echo_v1.wasm" --manifest "$work/echo-1.toml" --url http://127.0.0.1:7400 --key dev-key >/dev/null
target/release/herald plugin push "$guests/echo_v2.wasm" --manifest "$work/echo-2.toml" --url http://127.0.0.1:7400 --key dev-key >/dev/null
deploy 7400 1.0.0 >/dev/null

say "$DEPLOYS deploys without load, alternating 2.0.0 and 1.0.0, through each node in turn"
: >"$work/times"
for ((i = 0; i < DEPLOYS; i++)); do
    version=$([ $((i % 2)) -eq 0 ] && echo 2.0.0 || echo 1.0.0)
    deploy "${ports[$((i % 3))]}" "$version" >>"$work/times"
done
# phases FILE: the median of each step of the deploys in FILE (lines of `wall ready hold
# switch apply`, ms).
phases() {
    python3 - "$1" <<'PY'
import statistics, sys
rows = [[int(x) for x in line.split()] for line in open(sys.argv[1]) if line.strip()]
if rows:
    steps = ("ready", "hold", "switch", "apply")
    medians = ", ".join(f"{name} {statistics.median(row[k + 1] for row in rows):.0f}" for k, name in enumerate(steps))
    print(f"  median of each step, ms: {medians} (calls wait from hold to apply)")
PY
}
python3 - "$work/times" <<'PY'
import statistics, sys
times = [int(line.split()[0]) for line in open(sys.argv[1]) if line.strip()]
print(f"  deploy to every node serving it: median {statistics.median(times):.0f} ms, worst {max(times)} ms "
      f"({len(times)} deploys)")
PY
phases "$work/times"

# load LABEL: RATE msgs/s for DURATION s after 5 s of warm-up; the report's JSON to $work/LABEL.json.
load() {
    target/release/herald-loadgen --url "$urls" --users 1000 --rate "$RATE" --warmup 5s --duration "${DURATION}s" \
        --verify --quiet --label "$1" >"$work/$1.out" || die "the load generator failed ($1): $(cat "$work/$1.out")"
    tail -n 1 "$work/$1.out" >"$work/$1.json"
}

say "$RATE msgs/s for ${DURATION} s without deploys"
load steady
say "$RATE msgs/s for ${DURATION} s with deploys one after another"
load deploying &
loading=$!
# From its start to its end, so the deploys cover its whole measured window.
: >"$work/times-loaded"
i=0
while kill -0 "$loading" 2>/dev/null; do
    version=$([ $((i % 2)) -eq 0 ] && echo 2.0.0 || echo 1.0.0)
    deploy "${ports[$((i % 3))]}" "$version" >>"$work/times-loaded"
    i=$((i + 1))
done
wait "$loading" || die "the load generator failed during the deploys"

python3 - "$work/steady.json" "$work/deploying.json" "$work/times-loaded" <<'PY'
import json, statistics, sys
steady, deploying = (json.load(open(path)) for path in sys.argv[1:3])
times = [int(line.split()[0]) for line in open(sys.argv[3]) if line.strip()]
def failed(run):
    c = run["counts"]
    return c["sent"] - c["send_ack_ok"] - c["send_ack_duplicate"], c["send_ack_rejected"], c["send_ack_retry"], c["given_up"], c["errors"]
for name, run in (("without deploys", steady), ("with deploys", deploying)):
    lost, rejected, retry, given_up, errors = failed(run)
    print(f"  {name:16} sent {run['counts']['sent']:7}  {run['sent_per_s']:6.0f}/s  "
          f"p99 {run['latency']['p99_us'] / 1000:7.2f} ms  not OK {lost} (rejected {rejected}, retry {retry}, "
          f"given up {given_up}, errors {errors})")
ratio = deploying["latency"]["p99_us"] / max(steady["latency"]["p99_us"], 1)
print(f"  p99 with deploys / without: x{ratio:.2f} (target: within x1.2); "
      f"{len(times)} deploys under load, median {statistics.median(times) if times else 0:.0f} ms, "
      f"worst {max(times) if times else 0} ms")
PY
phases "$work/times-loaded"
