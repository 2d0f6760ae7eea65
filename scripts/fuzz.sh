#!/usr/bin/env bash
# Coverage-guided fuzzing of every target in fuzz/ with libFuzzer, on the stable toolchain:
# the targets are built with LLVM's SanitizerCoverage instrumentation (no sanitizer: the
# code is safe Rust, what is hunted is panics, hangs and runaway memory) into target/fuzz/,
# then each runs for SECONDS (default 60) on one core, starting from its seed corpus and its
# regressions. What the runs learn (new inputs) stays in target/fuzz/corpus/<target>/;
# crashes go to target/fuzz/artifacts/<target>/ and fail the script.
#
#   scripts/fuzz.sh                 every target, 60 s each
#   scripts/fuzz.sh 600             every target, 10 minutes each
#   scripts/fuzz.sh 600 token       one target
#   JOBS=2 scripts/fuzz.sh 600      two targets at a time
#
# The first build instruments every dependency too (wasmtime, sqlx, …): about 15 minutes
# on two cores (profile `fuzz` in Cargo.toml: optimised, debug assertions and overflow
# checks on, no LTO); later builds take only the changed crates. A crash found here becomes a
# regression: fix it, copy the input to fuzz/regressions/<target>/<what-it-broke>, and the
# suite replays it from then on (fuzz/tests/corpus.rs). See fuzz/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

seconds=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(frame_proto frame_json token config manifest http_api plugin_imports)
fi
jobs=${JOBS:-1}
case "$seconds" in '' | *[!0-9]*) die "SECONDS must be a whole number, got '$seconds'" ;; esac

work=target/fuzz
# An explicit --target keeps RUSTFLAGS off build scripts and proc macros, which run on the
# host and have no libFuzzer to link against.
triple=$(rustc -vV | sed -n 's/^host: //p')
say "building ${#targets[@]} fuzz targets with coverage instrumentation (into $work)"
# The flags cargo-fuzz uses, minus the sanitizer (which needs nightly): edge coverage with
# inline 8-bit counters, the PC table, and comparison tracing, which lets libFuzzer solve
# magic values (a JSON key, an enum number) byte by byte.
RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing" \
    CARGO_TARGET_DIR=$work cargo build --locked --profile fuzz --target "$triple" -p herald-fuzz --features libfuzzer --bins

run_one() {
    local target=$1
    local corpus=$work/corpus/$target artifacts=$work/artifacts/$target log=$work/logs/$target.log
    mkdir -p "$corpus" "$artifacts" "$work/logs"
    local seeds=(fuzz/corpus/"$target")
    [ -d fuzz/regressions/"$target" ] && seeds+=(fuzz/regressions/"$target")
    # -timeout: one input taking this long is a hang; -rss_limit_mb: runaway memory is a
    # finding. The HTTP target holds an embedded node (SQLite, runtime) and is given more.
    local rss=2048
    [ "$target" = http_api ] && rss=4096
    if "$work/$triple/fuzz/$target" "$corpus" "${seeds[@]}" -max_total_time="$seconds" -timeout=10 \
        -rss_limit_mb=$rss -max_len=65536 -print_final_stats=1 -artifact_prefix="$artifacts/" >"$log" 2>&1; then
        local execs
        execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
        printf '%-16s ok      %12s executions in %ss, corpus %s inputs\n' "$target" "$execs" "$seconds" \
            "$(find "$corpus" -type f | wc -l)"
    else
        printf '%-16s CRASHED (see %s and %s)\n' "$target" "$log" "$artifacts"
        grep -m1 -A3 -E 'panicked|ERROR: libFuzzer' "$log" || true
        return 1
    fi
}

say "fuzzing each target for ${seconds}s, $jobs at a time"
failed=0
pids=()
for target in "${targets[@]}"; do
    [ -d fuzz/corpus/"$target" ] || die "no such fuzz target: $target (see fuzz/corpus/)"
    run_one "$target" &
    pids+=($!)
    if [ ${#pids[@]} -ge "$jobs" ]; then
        wait "${pids[0]}" || failed=1
        pids=("${pids[@]:1}")
    fi
done
for pid in "${pids[@]}"; do
    wait "$pid" || failed=1
done
[ $failed -eq 0 ] || die "a fuzz target crashed; the inputs are under $work/artifacts/"
say "no crash"
