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
#   [RATE=5000] [DEPLOYS=20] [DURATION=20] [EVERY_MS=0] scripts/deploy-bench.sh
#
# EVERY_MS starts the deploys under load that often instead of back to back (a deploy that
# takes longer starts the next at once): back to back, a faster deploy means more of them,
# and the share of the time the calls are held grows with their number.
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
EVERY_MS=${EVERY_MS:-0}
ensure_wasm_target
build_test_guests
. scripts/cluster-lib.sh

guests=target/plugin-guests/wasm32-wasip2/release
[ -f "$guests/echo_v1.wasm" ] && [ -f "$guests/echo_v2.wasm" ] || die "the echo guests were not built in $guests"
printf 'name = "echo"\nversion = "1.0.0"\n' >"$work/echo-1.toml"
printf 'name = "echo"\nversion = "2.0.0"\n' >"$work/echo-2.toml"

# deploy PORT VERSION FILE: one deploy through node PORT, appended to FILE as one line: its
# wall time in ms, then the command's answer (JSON). Nothing else is started per deploy (no
# python, no date): the deploys under load share the box with the traffic they are measured
# against, and an interpreter's start-up per deploy took a sixth of a core there.
deploy() {
    local started=$EPOCHREALTIME ended answer
    target/release/herald plugin deploy echo "$2" --url "http://127.0.0.1:$1" --key dev-key >"$work/deploy.json" \
        || die "deploy of echo $2 failed: $(cat "$work/deploy.json")"
    ended=$EPOCHREALTIME
    read -r -d '' answer <"$work/deploy.json" || true
    printf '%s %s\n' $(((${ended/[.,]/} - ${started/[.,]/}) / 1000)) "${answer//$'\n'/ }" >>"$3"
}

# deploys FILE: checks that every deploy in FILE reached every node, then prints the median
# and worst wall time and the median of each step (the answer's phases_ms).
deploys() {
    python3 - "$1" <<'PY'
import json, statistics, sys
rows = [line.split(" ", 1) for line in open(sys.argv[1]) if line.strip()]
walls, answers = [int(wall) for wall, _ in rows], [json.loads(answer) for _, answer in rows]
for answer in answers:
    if not answer.get("applied_everywhere"):
        sys.exit(f"a deploy did not reach every node: {json.dumps(answer)}")
if walls:
    print(f"  deploy to every node serving it: median {statistics.median(walls):.0f} ms, worst {max(walls)} ms "
          f"({len(walls)} deploys)")
    steps = ("ready", "hold", "switch", "apply")
    medians = ", ".join(f"{name} {statistics.median(a['phases_ms'][name] for a in answers):.0f}" for name in steps)
    print(f"  median of each step, ms: {medians} (calls wait from hold to apply)")
PY
}

say "3 nodes, echo 1.0.0 and 2.0.0 uploaded, 1.0.0 deployed"
start_cluster 3 deploy
ports=(7400 7410 7420)
target/release/herald plugin push "$guests/echo_v1.wasm" --manifest "$work/echo-1.toml" --url http://127.0.0.1:7400 --key dev-key >/dev/null
target/release/herald plugin push "$guests/echo_v2.wasm" --manifest "$work/echo-2.toml" --url http://127.0.0.1:7400 --key dev-key >/dev/null
deploy 7400 1.0.0 "$work/first"
versions=(2.0.0 1.0.0)

say "$DEPLOYS deploys without load, alternating 2.0.0 and 1.0.0, through each node in turn"
: >"$work/times"
for ((i = 0; i < DEPLOYS; i++)); do
    deploy "${ports[i % 3]}" "${versions[i % 2]}" "$work/times"
done
deploys "$work/times" || die "the deploys without load failed"

# load LABEL: RATE msgs/s for DURATION s after 5 s of warm-up; the report's JSON to $work/LABEL.json.
load() {
    target/release/herald-loadgen --url "$urls" --users 1000 --rate "$RATE" --warmup 5s --duration "${DURATION}s" \
        --verify --quiet --label "$1" >"$work/$1.out" || die "the load generator failed ($1): $(cat "$work/$1.out")"
    tail -n 1 "$work/$1.out" >"$work/$1.json"
}

say "$RATE msgs/s for ${DURATION} s without deploys"
load steady
say "$RATE msgs/s for ${DURATION} s with deploys $([ "$EVERY_MS" -gt 0 ] && echo "every $EVERY_MS ms" || echo "one after another")"
load deploying &
loading=$!
# From its start to its end, so the deploys cover its whole measured window.
: >"$work/times-loaded"
i=0
next=${EPOCHREALTIME/[.,]/}
while kill -0 "$loading" 2>/dev/null; do
    deploy "${ports[i % 3]}" "${versions[i % 2]}" "$work/times-loaded"
    i=$((i + 1))
    if [ "$EVERY_MS" -gt 0 ]; then
        next=$((next + EVERY_MS * 1000))
        left=$((next - ${EPOCHREALTIME/[.,]/}))
        if [ "$left" -gt 0 ]; then sleep "$((left / 1000000)).$(printf '%06d' $((left % 1000000)))"; fi
    fi
done
wait "$loading" || die "the load generator failed during the deploys"

python3 - "$work/steady.json" "$work/deploying.json" <<'PY'
import json, sys
steady, deploying = (json.load(open(path)) for path in sys.argv[1:3])
def failed(run):
    c = run["counts"]
    return c["sent"] - c["send_ack_ok"] - c["send_ack_duplicate"], c["send_ack_rejected"], c["send_ack_retry"], c["given_up"], c["errors"]
for name, run in (("without deploys", steady), ("with deploys", deploying)):
    lost, rejected, retry, given_up, errors = failed(run)
    print(f"  {name:16} sent {run['counts']['sent']:7}  {run['sent_per_s']:6.0f}/s  "
          f"p99 {run['latency']['p99_us'] / 1000:7.2f} ms  not OK {lost} (rejected {rejected}, retry {retry}, "
          f"given up {given_up}, errors {errors})")
ratio = deploying["latency"]["p99_us"] / max(steady["latency"]["p99_us"], 1)
print(f"  p99 with deploys / without: x{ratio:.2f} (target: within x1.2)")
PY
say "the deploys under load"
deploys "$work/times-loaded" || die "the deploys under load failed"
