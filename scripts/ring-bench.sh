#!/usr/bin/env bash
# The ring benchmark (cluster mode): which node owns a conversation, on a
# 3-node and a 10-node ring with the default 160 points per node (target ≤ 100 ns per
# lookup of `dm:alice:bob`), and how many of 100,000 conversation ids change owner when a
# 4th node joins a 3-node ring (target ≤ 1.1 × the ideal 1/4). Prints criterion's report,
# then the figures in a few lines.
#
#   scripts/ring-bench.sh            # criterion's full sampling (about a minute)
#   scripts/ring-bench.sh --quick    # criterion's quick mode: seconds, less precise
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
say "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -m), $(lscpu | sed -n 's/^Model name: *//p')"

report=$(mktemp)
trap 'rm -f "$report"' EXIT
cargo bench --locked -p herald-host --bench ring -- "$@" | tee "$report"

say "figures"
grep '^ring/moved_keys:' "$report" || die "the bench printed no moved-keys figure"
# Criterion prints `NAME time: [low median high]`, the time on the next line when the name
# is long; each lookup's median is checked against the 100 ns target.
awk '
    /^ring\// && $1 != "ring/moved_keys:" { name = $1 }
    /time:/ && name != "" {
        sub(/.*\[/, ""); value = $3; unit = $4
        ns = value * (unit == "ps" ? 0.001 : unit == "µs" || unit == "us" ? 1000 : unit == "ms" ? 1000000 : 1)
        verdict = name ~ /^ring\/owner\// ? (ns <= 100 ? "  (target <= 100 ns: met)" : "  (target <= 100 ns: MISSED)") : ""
        printf "%-40s median %s %s%s\n", name, value, unit, verdict
        name = ""
    }
' "$report"
