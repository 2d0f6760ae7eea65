#!/usr/bin/env bash
# The messaging benchmark: builds release binaries, starts a fresh embedded
# Herald (persistence on, dev mode, a temporary data dir), then drives 1,000 connected
# users in pairs through the real WebSocket path with herald-loadgen:
#   1. at a steady 5,000 msgs/s, for send→deliver latency,
#   2. as fast as possible, compared with a trivial relay (no persistence),
#   3. at 5,000 msgs/s again, right after that burst: the latency while SQLite is still
#      checkpointing the burst's write-ahead log (the disk is busier, commits slower).
# It measures the data dir's fdatasync first and ends with a summary: the tail's bound
# (the larger of 10 ms and the relay's p99 + 2 x the fdatasync p99) against phases
# 1 and 3's p99 (at most the bound) and p999 (at most 3 x), and Herald's resident size
# before the burst and a minute after the last phase (target: within 20 %), with the dedup
# marks it holds at both times (live data, not memory kept).
#
#   scripts/loadtest.sh [extra herald-loadgen flags, e.g. --duration 20s]
#   HERALD_LOADTEST_PLUGINS=1 scripts/loadtest.sh     # the same with all four first-party plugins loaded
#   REPORT=DIR scripts/loadtest.sh                    # also charts and a page per phase: DIR/<phase>/index.html
#   ALLOCS=1 scripts/loadtest.sh                      # also Herald's allocations per message stored, per phase,
#                                                     # and its live heap before the burst and a minute after
#                                                     # (herald serve --count-allocations: a few ns each)
#
# Room fan-out, the same fresh Herald, each run compared with herald-relay's
# broadcast (no persistence): publishers send as fast as their in-flight limit allows (a
# message is in flight until every subscriber of its room has it), and herald-loadgen
# reports deliveries/s over all subscribers, the latency of every delivery and the
# deliveries missing:
#   1. 10,000 subscribers in one room,
#   2. 10 rooms of 1,000 subscribers.
# 10,000 connections need more file descriptors than the usual 1,024 (in herald-loadgen
# and in Herald, each): the script raises the soft limit to the hard one (ulimit -n) and
# says what it set.
#
#   scripts/loadtest.sh rooms [extra herald-loadgen flags, e.g. --publish-rate 50]
#
# Memory per connected device, the same fresh Herald: IDLE_DEVICES devices
# (default 10,000) connect in pairs and stay for 20 s at a trickle (devices/100 msgs/s in
# all); the script reads Herald's resident size (/proc/PID/status) before they connect
# (after 100 devices for 5 s, so that what a node's first traffic sets up is there), every
# second while they are connected, as they leave, and a minute later, and prints the
# peak's growth per device and how far the minute-later size is above the one before. Beyond about 28,000 devices one loopback address runs out of
# ephemeral ports (net.ipv4.ip_local_port_range).
#
#   scripts/loadtest.sh idle
#
# Reloads nobody feels: the same fresh Herald with all four first-party plugins,
# 1,000 users at 5,000 msgs/s for RELOAD_SECONDS (default 20), RELOAD_ROUNDS times (default
# 6) a run untouched and a run with room-rate-limit's manifest changed every second (each
# change is a new version, loaded and swapped in while the load runs), the two in
# alternating order. It prints each run's send→deliver latency, each round's ratio of the
# p99 with reloads to the p99 without, their median (target: at most 1.2), how many versions
# were swapped in, and every plugin's failed calls (target: none), and fails when a target
# is missed. Ratios are taken within a round, between runs a few seconds apart, because
# latency drifts up from round to round as the database grows (on the disk p99 went from 7
# to 18 ms over four rounds): the median of each side's p99s would pair runs from
# different rounds. Its data dir is on /dev/shm (RAM) unless
# RELOAD_DATA_ROOT names another place: on this box's disk, a few seconds of most runs
# stall on fsync (a per-second p99 of 25-40 ms against 5-10 ms otherwise, with or without
# reloads), and where those seconds fall decides either side's p99 — the comparison then
# measures the disk, not the reloads. Persistence stays on; only its fsyncs cost nothing.
#
#   scripts/loadtest.sh reloads
#   RELOAD_DATA_ROOT=/tmp scripts/loadtest.sh reloads    # the same on the disk
set -euo pipefail
mode=pairs
case "${1:-}" in
    rooms) mode=rooms; shift ;;
    idle) mode=idle; shift ;;
    reloads) mode=reloads; shift; HERALD_LOADTEST_PLUGINS=1 ;;
esac
devices=${IDLE_DEVICES:-10000}
# A relative REPORT is relative to where the script was started, not to the repository.
[ -z "${REPORT:-}" ] || REPORT=$(realpath -m -- "$REPORT")
cd "$(dirname "$0")/.."
. scripts/lib.sh

say "building release binaries"
# Name the binaries: `--bin` would otherwise filter every package given with `-p`.
cargo build --release --locked --bin herald --bin herald-loadgen --bin herald-relay >&2
if [ "$mode" = reloads ]; then
    reload_root=${RELOAD_DATA_ROOT:-/dev/shm}
    [ -d "$reload_root" ] && [ -w "$reload_root" ] || die "RELOAD_DATA_ROOT $reload_root is not a writable folder"
    data=$(mktemp -d "$reload_root/herald-reloads.XXXXXX")
    say "data dir: $data ($(df --output=fstype "$data" | tail -n 1))"
else
    data=$(mktemp -d)
fi
if [ "${HERALD_LOADTEST_PLUGINS:-0}" = 1 ]; then
    build_plugins release
    install_plugins "$data/plugins"
    say "first-party plugins loaded: $(ls "$data/plugins" | grep -c wasm)"
fi
port=${HERALD_LOADTEST_PORT:-7099}
trap 'stop_herald; rm -rf "$data"' EXIT
if [ "$mode" = rooms ] || [ "$mode" = idle ]; then
    # Before Herald starts, so that it inherits the limit too. The limit is per process:
    # herald-loadgen and Herald (and the relay) each hold one descriptor per connection.
    connections=10000
    [ "$mode" = rooms ] || connections=$devices
    need=$((connections + 100))
    hard=$(ulimit -Hn)
    # "unlimited" cannot be set as such for descriptors: ask for plenty instead.
    [ "$hard" != unlimited ] || hard=65536
    if [ "$hard" -lt "$need" ]; then
        say "warning: the hard file-descriptor limit is $hard; these connections need about $need per process (herald-loadgen and Herald each hold one per connection)"
    fi
    ulimit -n "$hard"
    say "file-descriptor limit (ulimit -n) set to $(ulimit -n) (hard limit $hard)"
fi
herald_flags=()
[ "${ALLOCS:-0}" != 1 ] || herald_flags=(--count-allocations)
start_herald "$port" "$data"
say "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB; load generator on the same box"
if [ "$mode" = rooms ]; then
    # The last line herald-loadgen prints is JSON: {"herald": …, "relay": …, "ratio": …}.
    summary() {
        tail -n 1 | jq -r --arg name "$1" '"\($name): Herald \(.herald.delivered_per_s) deliveries/s (\(.herald.sent_per_s) msg/s published, p99 \(.herald.latency.p99_us / 10 | round / 100) ms, missing \(.herald.rooms.missing_deliveries)), relay \(.relay.delivered_per_s) deliveries/s (missing \(.relay.rooms.missing_deliveries)); Herald/relay x\(.ratio.delivered_per_s)"'
    }
    results=$(mktemp -d)
    trap 'stop_herald; rm -rf "$data" "$results"' EXIT
    say "1) 10,000 subscribers in one room, Herald vs the relay's broadcast"
    report_flags rooms-1x10000
    target/release/herald-loadgen --url "ws://127.0.0.1:$port/v1/ws" --rooms 1 --subscribers 10000 --duration 10s \
        --compare-relay --quiet --connect-concurrency 128 "${report[@]}" "$@" | tee "$results/1"
    say "2) 10 rooms of 1,000 subscribers, Herald vs the relay's broadcast"
    report_flags rooms-10x1000
    target/release/herald-loadgen --url "ws://127.0.0.1:$port/v1/ws" --rooms 10 --subscribers 10000 --duration 10s \
        --compare-relay --quiet --connect-concurrency 128 "${report[@]}" "$@" | tee "$results/2"
    say "room fan-out, $(nproc) cores:"
    summary "1 room x 10,000" <"$results/1" >&2
    summary "10 rooms x 1,000" <"$results/2" >&2
    [ -z "${REPORT:-}" ] || say "reports: $REPORT/{rooms-1x10000,rooms-10x1000}/index.html"
    exit 0
fi
# With ALLOCS=1: the live heap of Herald's Rust code in MiB (herald_heap_live_bytes), to
# set beside the resident size: what is still held, against what was freed but not handed back.
live_heap() {
    [ "${ALLOCS:-0}" = 1 ] || return 0
    curl -sf "http://127.0.0.1:$port/metrics" | awk '/^herald_heap_live_bytes / { printf "%.1f", $2 / 1048576 }'
}
if [ "$mode" = idle ]; then
    # Herald's resident size (from /proc) before the devices connect, every second while
    # they are held, and a minute after they left.
    rate=$(( devices >= 200 ? devices / 100 : 1 ))
    cold=$(rss_kib "$server")
    # A node that has served anything holds what its first traffic set up (metrics'
    # histograms, SQLite's caches, pools): 100 devices for 5 s first, so that "before" is
    # a serving node's size, and the minute after compares with it (cold is printed too).
    target/release/herald-loadgen --url "ws://127.0.0.1:$port/v1/ws" --users 100 --rate 10 \
        --duration 5s --warmup 1s --quiet >"$data/warm.out" || die "herald-loadgen failed: $(tail -n 5 "$data/warm.out")"
    sleep 2
    before=$(rss_kib "$server")
    live_before=$(live_heap)
    target/release/herald-loadgen --url "ws://127.0.0.1:$port/v1/ws" --users "$devices" --rate "$rate" \
        --duration 20s --warmup 2s --quiet --connect-concurrency 128 "$@" >"$data/idle.out" &
    loadgen=$!
    peak=$before
    while kill -0 "$loadgen" 2>/dev/null; do
        now=$(rss_kib "$server")
        [ "$now" -le "$peak" ] || peak=$now
        sleep 1
    done
    wait "$loadgen" || die "herald-loadgen failed: $(tail -n 5 "$data/idle.out")"
    left=$(rss_kib "$server")
    say "waiting a minute for the memory to be handed back"
    sleep 60
    later=$(rss_kib "$server")
    live_later=$(live_heap)
    per_device=$(( (peak - before) * 1024 / devices ))
    say "idle memory, $devices devices at $rate msgs/s, $(nproc) cores: Herald resident $((cold / 1024)) MiB started, $((before / 1024)) MiB before (after 100 devices for 5 s), $((peak / 1024)) MiB at the peak with them connected: $((per_device / 1024)).$(( (per_device % 1024) * 10 / 1024 )) KiB per device; $((left / 1024)) MiB as they left, $((later / 1024)) MiB a minute later ($(( (later - before) * 100 / before ))% above before; target: at most 20%)"
    [ "${ALLOCS:-0}" != 1 ] || say "Herald's live heap (Rust code, herald_heap_live_bytes): $live_before MiB before the devices came, $live_later MiB a minute after they left"
    exit 0
fi
if [ "$mode" = reloads ]; then
    seconds=${RELOAD_SECONDS:-20}
    rounds=${RELOAD_ROUNDS:-6}
    results=$(mktemp -d)
    reloader=
    trap '[ -z "$reloader" ] || kill "$reloader" 2>/dev/null; stop_herald; rm -rf "$data" "$results"' EXIT
    steady() {
        target/release/herald-loadgen --url "ws://127.0.0.1:$port/v1/ws" --users 1000 --rate 5000 \
            --duration "${seconds}s" --quiet "$@" | tail -n 1
    }
    latency() {
        jq -r '"p50 \(.latency.p50_us / 10 | round / 100) ms, p99 \(.latency.p99_us / 10 | round / 100) ms, p999 \(.latency.p999_us / 10 | round / 100) ms (\(.sent_per_s) msg/s sent, \(.delivered_per_s) delivered)"' "$1"
    }
    manifest="$data/plugins/room-rate-limit.toml"
    # Rounds of one run without and one with reloads, alternating, so that a stall of the
    # machine (this box's disk has them) weighs on both sides alike; the medians compare.
    quiet_run() {
        say "round $1/$rounds: 1,000 users at 5,000 msgs/s with all four plugins, ${seconds} s, no reload"
        steady "${@:2}" >"$results/quiet-$1"
    }
    reloading_run() {
        say "round $1/$rounds: the same while room-rate-limit's manifest changes every second"
        (
            n=0
            while :; do
                n=$((n + 1))
                printf '# reload %d\n' "$n" >>"$manifest"
                sleep 1
            done
        ) &
        reloader=$!
        steady "${@:2}" >"$results/reloading-$1"
        kill "$reloader"
        reloader=
    }
    for round in $(seq 1 "$rounds"); do
        # Odd rounds start without reloads, even ones with: latency drifts up as the
        # database grows, and a fixed order would hand that drift to one side.
        if [ $((round % 2)) = 1 ]; then
            quiet_run "$round" "$@"
            reloading_run "$round" "$@"
        else
            reloading_run "$round" "$@"
            quiet_run "$round" "$@"
        fi
        say "  without reloads: $(latency "$results/quiet-$round")"
        say "  with reloads:    $(latency "$results/reloading-$round")"
    done
    plugins=$(curl -sf -H 'authorization: Bearer dev-key' "http://127.0.0.1:$port/admin/plugins") \
        || die "GET /admin/plugins failed"
    reloads=$(grep -c '^# reload' "$manifest")
    failures=$(jq '[.plugins[].failures] | add' <<<"$plugins")
    # Each round's p99 with reloads over its p99 without, then the median of those ratios.
    ratios=$(for round in $(seq 1 "$rounds"); do
        jq -n --slurpfile q "$results/quiet-$round" --slurpfile r "$results/reloading-$round" \
            '$r[0].latency.p99_us / $q[0].latency.p99_us'
    done | jq -s -c 'map(. * 100 | round / 100)')
    ratio=$(jq -rn --argjson r "$ratios" '$r | sort | (.[(length - 1) / 2 | floor] + .[length / 2 | floor]) / 2 | . * 100 | round / 100')
    say "p99 with reloads / without, per round: $(jq -r 'map("x\(.)") | join(", ")' <<<"$ratios") (${reloads} reloads in all)"
    say "median of the rounds' ratios: x${ratio} (target at most x1.2); failed plugin calls: ${failures} (target 0): $(jq -c '[.plugins[] | {(.name): .failures}] | add' <<<"$plugins")"
    say "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB; load generator on the same box"
    jq -e -n --argjson r "$ratio" --argjson f "$failures" '$r <= 1.2 and $f == 0' >/dev/null \
        || die "a target was missed"
    exit 0
fi
# The tail's bound: the larger of 10 ms and the relay's p99 plus twice the data
# dir's fdatasync p99, the disk measured here first: 500 appends of 8 KiB, each followed by
# fdatasync, as the WAL's are.
fsync_p99_us=$(python3 - "$data" <<'PY'
import os, sys, time
path = os.path.join(sys.argv[1], "fsync-probe")
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
block, took = b"\0" * 8192, []
for _ in range(500):
    os.write(fd, block)
    start = time.perf_counter()
    os.fdatasync(fd)
    took.append(time.perf_counter() - start)
os.close(fd)
os.unlink(path)
took.sort()
print(round(took[int(len(took) * 0.99)] * 1e6))
PY
)
say "the data dir's fdatasync p99: $((fsync_p99_us / 1000)).$(printf '%03d' $((fsync_p99_us % 1000))) ms ($(df --output=fstype "$data" | tail -n 1))"
results=$(mktemp -d)
trap 'stop_herald; rm -rf "$data" "$results"' EXIT
# With ALLOCS=1: "allocations bytes messages-stored" from Herald's /metrics.
alloc_counts() {
    curl -sf "http://127.0.0.1:$port/metrics" | awk '
        /^herald_allocations_total / { a = $2 } /^herald_allocated_bytes_total / { b = $2 }
        /^herald_pipeline_messages_stored_total/ { m += $2 }
        END { printf "%d %d %d\n", a, b, m }'
}
# The dedup marks Herald holds (each send's for delivery.dedup_ttl_ms, at most
# delivery.dedup_max_marks; ~100 bytes each): live data a minute after a burst, not memory
# that failed to go back (docs/ARCHITECTURE.md, "Memory per dedup mark").
dedup_marks() {
    curl -sf "http://127.0.0.1:$port/metrics" | awk '/^herald_map_entries[{].*map="dedup_marks"/ { m = $2 } END { printf "%d\n", m }'
}
# alloc_per_message NAME BEFORE AFTER: prints what was allocated per message stored between
# two alloc_counts (connections, acks and deliveries included: everything Herald did).
alloc_per_message() {
    [ "${ALLOCS:-0}" = 1 ] || return 0
    read -r a0 b0 m0 <<<"$2"
    read -r a1 b1 m1 <<<"$3"
    [ "$m1" -gt "$m0" ] || return 0
    say "$1: $(( (a1 - a0) / (m1 - m0) )) allocations and $(( (b1 - b0) / (m1 - m0) )) bytes allocated per message stored ($((m1 - m0)) messages)"
}
allocs_1=$(alloc_counts)
say "1) 1,000 users at a steady 5,000 msgs/s"
report_flags 1-steady-5000
target/release/herald-loadgen --url "ws://127.0.0.1:$port/v1/ws" --users 1000 --rate 5000 --duration 10s --compare-relay --quiet "${report[@]}" "$@" | tee "$results/1"
allocs_2=$(alloc_counts)
rss_before=$(rss_kib "$server")
marks_before=$(dedup_marks)
live_before=$(live_heap)
say "2) 1,000 users, as fast as possible, Herald vs a trivial relay"
report_flags 2-max
target/release/herald-loadgen --url "ws://127.0.0.1:$port/v1/ws" --users 1000 --duration 10s --compare-relay --quiet "${report[@]}" "$@" | tee "$results/2"
allocs_3=$(alloc_counts)
rss_burst=$(rss_kib "$server")
say "3) 1,000 users at 5,000 msgs/s right after the burst (SQLite still checkpointing it)"
report_flags 3-after-burst-5000
target/release/herald-loadgen --url "ws://127.0.0.1:$port/v1/ws" --users 1000 --rate 5000 --duration 10s --quiet "${report[@]}" "$@" | tee "$results/3"
allocs_4=$(alloc_counts)
[ -z "${REPORT:-}" ] || say "reports: $REPORT/{1-steady-5000,2-max,3-after-burst-5000}/index.html"
say "waiting a minute for the burst's memory to be handed back"
sleep 60
rss_later=$(rss_kib "$server")
marks_later=$(dedup_marks)
live_later=$(live_heap)
# The last line herald-loadgen prints is JSON: with --compare-relay {"herald": …, "relay": …}.
relay_p99_us=$(tail -n 1 "$results/1" | jq '.relay.latency.p99_us')
bound_us=$(( relay_p99_us + 2 * fsync_p99_us ))
[ "$bound_us" -ge 10000 ] || bound_us=10000
verdict() {
    jq -r --argjson bound "$bound_us" --arg name "$1" '(.herald // .) as $h | $h.latency as $l |
        "\($name): p50 \($l.p50_us / 10 | round / 100) ms, p99 \($l.p99_us / 10 | round / 100) ms (\(if $l.p99_us <= $bound then "met" else "NOT met" end)), p999 \($l.p999_us / 10 | round / 100) ms (\(if $l.p999_us <= 3 * $bound then "met" else "NOT met" end))"'
}
say "summary, $(nproc) cores: bound $((bound_us / 1000)).$(printf '%03d' $((bound_us % 1000))) ms (the larger of 10 ms and the relay's p99 $((relay_p99_us / 1000)).$(printf '%03d' $((relay_p99_us % 1000))) ms + 2 x fdatasync p99); target p99 <= bound, p999 <= 3 x bound"
tail -n 1 "$results/1" | verdict "steady 5,000 msgs/s" >&2
tail -n 1 "$results/3" | verdict "5,000 msgs/s right after the burst" >&2
tail -n 1 "$results/2" | jq -r '"as fast as possible: Herald \(.herald.sent_per_s) msg/s, relay \(.relay.sent_per_s) msg/s (x\(.herald.sent_per_s / .relay.sent_per_s * 1000 | round / 1000)); target: at least 50,000"' >&2
alloc_per_message "steady 5,000 msgs/s" "$allocs_1" "$allocs_2"
alloc_per_message "as fast as possible" "$allocs_2" "$allocs_3"
alloc_per_message "5,000 msgs/s right after the burst" "$allocs_3" "$allocs_4"
say "Herald resident: $((rss_before / 1024)) MiB before the burst, $((rss_burst / 1024)) MiB after it, $((rss_later / 1024)) MiB a minute after the last phase ($(( (rss_later - rss_before) * 100 / rss_before ))% above before; target: at most 20%); dedup marks held: $marks_before before, $marks_later a minute after"
[ "${ALLOCS:-0}" != 1 ] || say "Herald's live heap (Rust code, herald_heap_live_bytes): $live_before MiB before the burst, $live_later MiB a minute after"
