#!/usr/bin/env bash
# What heartbeats cost an idle node. Builds release binaries, then for each setting starts a
# fresh embedded Herald (dev mode, a temporary data dir), connects DEVICES devices that do
# nothing but answer pings (herald-idle), and reads Herald's CPU time (/proc) and context
# switches over WINDOW seconds with every device connected:
#   1. the contract before: a ping every 30 s, every ping answered;
#   2. the defaults: the server writes at least every 12 s, pongs only when asked.
# With BASELINE_BIN=path/to/an/older/herald, that binary at its own defaults (every ping
# answered) runs first. The longest silence a device heard bounds how soon a client
# notices a dead server.
#
#   scripts/heartbeat-bench.sh
#   DEVICES=5000 WINDOW=70 scripts/heartbeat-bench.sh      # a shorter run
#   RUNS=defaults scripts/heartbeat-bench.sh                # the defaults only
#
# DEVICES defaults to what one process may hold here (each of Herald and herald-idle keeps
# one file descriptor per connection, within `ulimit -Hn`). WINDOW defaults to 210 s: a
# whole number of cycles of both settings (30 s pings; 70 s between asked answers).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

hard=$(ulimit -Hn)
[ "$hard" != unlimited ] || hard=65536
ulimit -n "$hard"
devices=${DEVICES:-$((hard - 1000 < 50000 ? hard - 1000 : 50000))}
window=${WINDOW:-210}
[ "$devices" -gt 0 ] || die "DEVICES must be at least 1 (the descriptor limit here is $hard)"

say "building release binaries"
cargo build --release --locked --bin herald --bin herald-idle >&2
say "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(lscpu | sed -n 's/^Model name: *//p'); the devices on the same box"
say "$devices idle devices, a window of $window s (file-descriptor limit $hard per process)"
port=${HERALD_LOADTEST_PORT:-7097}
data=""
idle=""
trap 'stop_herald; [ -z "$idle" ] || kill "$idle" 2>/dev/null; [ -z "$data" ] || rm -rf "$data"' EXIT

# Herald's CPU time so far in ms (user + system, from /proc/PID/stat).
cpu_ms() {
    awk -v hz="$(getconf CLK_TCK)" '{ print int(($14 + $15) * 1000 / hz) }' "/proc/$1/stat"
}
# Context switches so far, voluntary and not, over all of Herald's threads.
switches() {
    cat /proc/"$1"/task/*/status | awk '/ctxt_switches/ { n += $2 } END { print n }'
}

results=()
# run LABEL ANSWER [VAR=VALUE…]: one fresh server, the devices, the window measured.
run() {
    local label=$1 answer=$2
    shift 2
    data=$(mktemp -d)
    start_herald "$port" "$data" "$@"
    local out="$data/idle.json"
    # Held for the window plus time to connect and settle; the window starts once every
    # device is connected (herald-idle says so on stderr) and a few seconds passed.
    target/release/herald-idle --url "ws://127.0.0.1:$port/v1/ws" --devices "$devices" \
        --duration $((window + 15)) --answer "$answer" >"$out" 2>"$data/idle.err" &
    idle=$!
    until grep -qs "devices connected" "$data/idle.err"; do
        kill -0 "$idle" 2>/dev/null || die "herald-idle failed: $(tail -n 5 "$data/idle.err")"
        sleep 0.5
    done
    sleep 5
    local cpu0 sw0 cpu1 sw1
    cpu0=$(cpu_ms "$server")
    sw0=$(switches "$server")
    sleep "$window"
    cpu1=$(cpu_ms "$server")
    sw1=$(switches "$server")
    wait "$idle" || die "herald-idle failed: $(tail -n 5 "$data/idle.err")"
    idle=""
    local cpu=$((cpu1 - cpu0)) sw=$((sw1 - sw0))
    local line
    line=$(jq -r --arg name "$label" --argjson cpu "$cpu" --argjson sw "$sw" --argjson window "$window" \
        '"\($name): Herald \($cpu) ms of CPU in \($window) s (\($cpu * 1000 / $window | round / 1000) ms/s, \($cpu * 100000 / $window / .devices | round / 100) µs/s per device), \($sw / $window | round) context switches/s; the devices got \(.pings) pings (\(.asked) asking) and sent \(.pongs) pongs; longest silence a device heard \(.longest_silence_ms) ms; connections lost \(.lost)"' \
        "$out")
    say "$line"
    results+=("$line")
    stop_herald
    rm -rf "$data"
    data=""
}

if [ -n "${BASELINE_BIN:-}" ]; then
    herald_bin=$BASELINE_BIN run "$(basename "$BASELINE_BIN") at its defaults, every ping answered" all
fi
runs=${RUNS:-before defaults}
case " $runs " in *" before "*)
    run "a ping every 30 s, every ping answered (the contract before)" all HERALD_GATEWAY__HEARTBEAT_MS=30000 ;;
esac
case " $runs " in *" defaults "*)
    run "defaults: a frame at least every 12 s, pongs when asked" asked ;;
esac
say "summary, $devices idle devices, $(nproc) cores:"
printf '%s\n' "${results[@]}" >&2
