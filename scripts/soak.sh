#!/usr/bin/env bash
# The soak test: starts a fresh embedded Herald (dev mode, a temporary data dir,
# the first-party plugins installed) and runs herald-soak against it for MINUTES: mixed
# traffic (direct, group and room messages, announcements, groups changed through the API,
# sync and history) with connection churn, a reconnect storm every few minutes and a plugin
# hot-reloaded every minute, sampling the server's RSS, open fds, live tasks and map sizes.
# It fails when one of them grows beyond its tolerance over the steady part of the run, or
# when connection-bound maps do not drain back to their starting value once every client
# has left (docs/OPERATIONS.md, "Soak").
#
#   scripts/soak.sh [MINUTES] [herald-soak flags]   # default 30 minutes, release build
#   PROFILE=debug scripts/soak.sh 2                 # the suite's short version: the debug binaries as built
#   REPORT=DIR scripts/soak.sh                      # keep DIR/soak.csv and DIR/summary.txt
#   SOAK_PORT=7096 scripts/soak.sh                  # another port for the server (default 7095)
#
# Runs under 5 minutes are the short version: a storm every 45 s, a reload every 20 s,
# samples every 3 s, 40 % warm-up, loose trend tolerances and a 5 s reconnect grace, so that
# everything happens at least once and the drain check is quick. The server's dedup-mark TTL
# and idle-conversation eviction are shortened (60 s; 5 s in the short version) so that
# those maps reach their steady size within the warm-up and empty within the drain check:
# the soak checks that they stop growing and are forgotten, not how long the production
# TTLs are. SOAK_TTL_MS and SOAK_GRACE_MS override these.
set -euo pipefail
[ -z "${REPORT:-}" ] || REPORT=$(realpath -m -- "$REPORT")
cd "$(dirname "$0")/.."
. scripts/lib.sh

minutes=${1:-30}
[ $# -gt 0 ] && shift
[[ "$minutes" =~ ^[0-9]+$ ]] && [ "$minutes" -gt 0 ] || die "MINUTES must be a whole number of minutes, got '$minutes'"
profile=${PROFILE:-release}
case "$profile" in
    release)
        say "building release binaries"
        cargo build --release --locked --bin herald --bin herald-soak >&2
        ;;
    debug)
        # As the test suite's `cargo test` left them: building here could unify features
        # differently and rebuild the host. Built only when missing.
        if [ ! -x target/debug/herald ] || [ ! -x target/debug/herald-soak ]; then
            say "building debug binaries"
            cargo build --locked --bin herald --bin herald-soak >&2
        fi
        ;;
    *) die "PROFILE must be release or debug, got '$profile'" ;;
esac
herald_bin=target/$profile/herald
soak_bin=target/$profile/herald-soak

if [ "$minutes" -lt 5 ]; then
    # Trend tolerances for a window of a minute or so: a map the server sweeps every minute
    # (intake buckets) swings by its whole size within it, and a debug build's memory is
    # still settling. Only gross growth fails; the drain check is the assertion.
    ttl_ms=${SOAK_TTL_MS:-5000}
    grace_ms=${SOAK_GRACE_MS:-5000}
    # Retry waits of at most 13 s (10 s and its jitter), so the pushes still waiting when
    # the clients leave settle within the drain check.
    retry_env=(HERALD_DELIVERY__BACKOFF_MAX_MS=10000 HERALD_DELIVERY__ACK_TIMEOUT_MAX_MS=10000)
    short=(--sample-every 3s --warmup $((minutes * 24))s --storm-every 45s --storm-settle 10s
        --reload-every 20s --lifetime 20s --max-user-age 30s --room-period 20s --drain-timeout 60s
        --rss-tolerance 20%+16 --fd-tolerance 10%+32 --task-tolerance 100%+256 --map-tolerance 100%+64)
else
    ttl_ms=${SOAK_TTL_MS:-60000}
    grace_ms=${SOAK_GRACE_MS:-30000}
    retry_env=()
    short=()
fi

data=$(mktemp -d)
server=
trap 'stop_herald; rm -rf "$data"' EXIT
build_plugins "$profile"
install_plugins "$data/plugins" "$profile"
port=${SOAK_PORT:-7095}
start_herald "$port" "$data" \
    "HERALD_DELIVERY__DEDUP_TTL_MS=$ttl_ms" "HERALD_SEQ__EVICT_IDLE_MS=$ttl_ms" \
    "HERALD_GATEWAY__RECONNECT_GRACE_MS=$grace_ms" "${retry_env[@]}"
say "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB; the soak's clients on the same box"
say "soak: $minutes min against $herald_bin (pid $server), plugins: $(ls "$data/plugins" | grep -c '\.wasm$' || true); dedup TTL and idle eviction ${ttl_ms} ms, reconnect grace ${grace_ms} ms"
report=()
[ -z "${REPORT:-}" ] || report=(--report "$REPORT")
"$soak_bin" --url "ws://127.0.0.1:$port/v1/ws" --pid "$server" --duration "${minutes}m" \
    --plugins-dir "$data/plugins" "${short[@]}" "${report[@]}" "$@"
[ -z "${REPORT:-}" ] || say "samples: $REPORT/soak.csv, summary: $REPORT/summary.txt"
