#!/usr/bin/env bash
# Herald's benchmarks: id allocators and the cluster ring (criterion), storage (seq
# renewals, group-committed inserts on SQLite, MariaDB and PostgreSQL) and plugin hook
# calls. Starts the services and installs the wasm32-wasip2 target they need, so it runs
# on a fresh machine.
#
#   scripts/bench.sh                  # all of them
#   scripts/bench.sh ids hooks        # or name some: ids ring hooks renewals sqlite sqlite-v4
#                                     #   sqlite-normal mysql postgres
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
. scripts/services.sh
say "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -m), $(lscpu | sed -n 's/^Model name: *//p')"

wants() { [ -z "$selected" ] || [[ " $selected " == *" $1 "* ]]; }
selected=""
storage=()
for name in "$@"; do
    case $name in
        ids | ring | hooks) selected+=" $name" ;;
        renewals | sqlite | sqlite-v4 | sqlite-normal | mysql | postgres) selected+=" $name"; storage+=("$name") ;;
        *) die "unknown benchmark '$name' (known: ids ring hooks renewals sqlite sqlite-v4 sqlite-normal mysql postgres)" ;;
    esac
done

if wants ids; then
    cargo bench --locked -p herald-host --bench ids
fi
if wants ring; then
    cargo bench --locked -p herald-host --bench ring
fi
if [ -z "$selected" ] || [ ${#storage[@]} -gt 0 ]; then
    ensure_postgres
    ensure_mariadb
    cargo bench --locked -p herald-host --bench storage -- "${storage[@]}"
fi
if wants hooks; then
    ensure_wasm_target
    cargo bench --locked -p herald-plugin-runtime --bench hooks
fi
