#!/usr/bin/env bash
# Efficiency at ordinary load: what a node pays per message when messages are spread out,
# against the trivial relay (herald-relay, no persistence) at the same rates in the same
# run. Builds release binaries; for each rate, 1,000 users in pairs (herald-loadgen, on
# the same box) send at that steady rate to a fresh Herald, then to a fresh relay, and the
# script reads each server's CPU time and context switches from /proc, and its system
# calls with `perf stat` (read/write ones from /proc where perf cannot trace them), over a
# window inside the load generator's measured one (after every user is connected and
# WARMUP seconds passed). It prints, per message: CPU (µs), context switches and system
# calls, and the send→deliver p99, with Herald / relay ratios.
#
#   scripts/efficiency-bench.sh                       # embedded, then three cluster nodes
#   MODES=embedded RATES=1000 scripts/efficiency-bench.sh
#   DURATION=30 WARMUP=5 scripts/efficiency-bench.sh  # seconds measured, unmeasured lead-in
#
# Cluster mode runs three nodes on the local PostgreSQL and Redis (scripts/cluster-lib.sh),
# users spread over the nodes as herald-loadgen spreads them; per-message figures are
# for the three nodes together, with each node's CPU beside them (Herald's processes only:
# PostgreSQL's and Redis's work is not counted). A quiet machine matters:
# everything else running shows up in the servers' wake-ups.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
. scripts/services.sh

modes=${MODES:-embedded cluster}
rates=${RATES:-1000 5000}
duration=${DURATION:-20}
warmup=${WARMUP:-5}
users=1000
case " $modes " in
*" cluster "*) . scripts/cluster-lib.sh ;;
*) work=$(mktemp -d); trap 'stop_herald 2>/dev/null; rm -rf "$work"' EXIT ;;
esac
say "building release binaries"
cargo build --release --locked --bin herald --bin herald-loadgen --bin herald-relay >&2
say "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(lscpu | sed -n 's/^Model name: *//p'); the load generator on the same box"

# Per process: CPU ms (user + system), context switches (all threads, voluntary or not),
# and read/write-family system calls (the count of every system call comes from perf when
# the kernel lets it trace them), as "cpu switches syscalls".
sample() {
    local hz
    hz=$(getconf CLK_TCK)
    awk -v hz="$hz" '{ printf "%d ", ($14 + $15) * 1000 / hz }' "/proc/$1/stat"
    cat /proc/"$1"/task/*/status | awk '/ctxt_switches/ { n += $2 } END { printf "%d ", n }'
    awk '/^syscr|^syscw/ { n += $2 } END { print n }' "/proc/$1/io"
}

# Established connections to the local ports given.
connections() {
    local filter=""
    for port; do filter+="${filter:+ or }sport = :$port"; done
    ss -Htn state established "( $filter )" | wc -l
}

# measure LABEL "PIDS" "PORTS" URLS RATE: runs the load at RATE against URLS and samples
# PIDS over the window; prints one line and appends it to the summary.
summary=()
measure() {
    local label=$1 pids=$2 ports=$3 urls=$4 rate=$5 out="$work/loadgen.json"
    target/release/herald-loadgen --url "$urls" --users "$users" --rate "$rate" --warmup "${warmup}s" \
        --duration "$((duration + 2))s" --quiet >"$out" 2>"$work/loadgen.err" &
    local loadgen=$!
    # shellcheck disable=SC2086
    until [ "$(connections $ports)" -ge "$users" ]; do
        kill -0 "$loadgen" 2>/dev/null || die "herald-loadgen failed: $(tail -n 5 "$work/loadgen.err")"
        sleep 0.2
    done
    sleep "$((warmup + 1))"
    local before=() after=() pid syscalls=""
    for pid in $pids; do before+=("$(sample "$pid")"); done
    if [ -n "$perf" ]; then
        # Every system call of every thread, from the kernel's tracepoint.
        perf stat -e raw_syscalls:sys_enter -x, -o "$work/perf.txt" -p "${pids// /,}" -- sleep "$duration" 2>/dev/null
        syscalls=$(awk -F, '/raw_syscalls/ { print $1 }' "$work/perf.txt")
    else
        sleep "$duration"
    fi
    for pid in $pids; do after+=("$(sample "$pid")"); done
    wait "$loadgen" || die "herald-loadgen failed: $(tail -n 5 "$work/loadgen.err")"
    local line
    line=$(python3 - "$label" "$rate" "$duration" "$out" "${before[*]}" "${after[*]}" "$syscalls" <<'EOF'
import json, sys
label, rate, duration, out, before, after, traced = sys.argv[1:]
report = json.loads([line for line in open(out) if line.strip()][-1])  # its last line is JSON
b = [int(x) for x in before.split()]
a = [int(x) for x in after.split()]
d = [y - x for x, y in zip(b, a)]
cpu = d[0::3]; switches = sum(d[1::3])
syscalls = int(traced) if traced.isdigit() else sum(d[2::3])
messages = report["sent_per_s"] * float(duration)
per_node = "" if len(cpu) == 1 else " (per node: " + ", ".join(f"{100 * c / 1000 / float(duration):.0f} %" for c in cpu) + ")"
print(json.dumps({
    "label": label, "rate": int(rate), "sent_per_s": report["sent_per_s"],
    "cpu_percent": round(100 * sum(cpu) / 1000 / float(duration), 1),
    "cpu_us_per_msg": round(sum(cpu) * 1000 / messages, 1),
    "switches_per_msg": round(switches / messages, 2),
    "syscalls_per_msg": round(syscalls / messages, 2),
    "p99_ms": round(report["latency"]["p99_us"] / 1000, 2),
    "per_node": per_node,
}))
EOF
)
    say "$(jq -r '"\(.label) at \(.rate) msgs/s (\(.sent_per_s) sent/s): \(.cpu_percent) % of a core\(.per_node), \(.cpu_us_per_msg) µs CPU/msg, \(.switches_per_msg) context switches/msg, \(.syscalls_per_msg) syscalls/msg, p99 \(.p99_ms) ms"' <<<"$line")"
    summary+=("$line")
}

relay() {
    local rate=$1 port=7171
    target/release/herald-relay --listen "127.0.0.1:$port" &
    local pid=$!
    until ss -Htln "( sport = :$port )" | grep -q .; do
        kill -0 "$pid" 2>/dev/null || die "herald-relay did not start"
        sleep 0.1
    done
    measure "relay" "$pid" "$port" "ws://127.0.0.1:$port/v1/ws" "$rate"
    kill "$pid"; wait "$pid" 2>/dev/null || true
}

# ratio LABEL: Herald's last figures over the relay's, in the summary's last two lines.
ratio() {
    printf '%s\n' "${summary[@]: -2}" | jq -rs --arg name "$1" '"\($name) at \(.[0].rate) msgs/s, Herald / relay: CPU x\(.[0].cpu_us_per_msg / .[1].cpu_us_per_msg * 10 | round / 10), context switches x\(.[0].switches_per_msg / .[1].switches_per_msg * 10 | round / 10), syscalls x\(.[0].syscalls_per_msg / ([.[1].syscalls_per_msg, 0.01] | max) * 10 | round / 10)"'
}

ulimit -n "$(ulimit -Hn)"
perf=""
if perf stat -e raw_syscalls:sys_enter -o /dev/null -- true 2>/dev/null; then
    perf=1
    syscall_kind="every system call, traced by perf"
else
    syscall_kind="read/write syscalls (perf cannot trace system calls here)"
fi
ratios=()
for mode in $modes; do
    for rate in $rates; do
        case $mode in
        embedded)
            port=7097
            mkdir -p "$work/data-$rate"
            start_herald "$port" "$work/data-$rate"
            measure "embedded Herald" "$server" "$port" "ws://127.0.0.1:$port/v1/ws" "$rate"
            stop_herald
            ;;
        cluster)
            start_cluster 3 "eff$rate"
            measure "3 Herald nodes" "${pids[*]}" "7400 7410 7420" "$urls" "$rate"
            stop_nodes
            ;;
        *) die "MODES: embedded and/or cluster, not $mode" ;;
        esac
        relay "$rate"
        ratios+=("$(ratio "$mode")")
    done
done
say "summary ($(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'); syscalls: $syscall_kind):"
printf '%s\n' "${ratios[@]}" >&2
