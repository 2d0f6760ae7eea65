#!/usr/bin/env bash
# Every benchmark of the foundation: id allocators (criterion) and storage (seq renewals,
# group-committed inserts on SQLite, MariaDB and PostgreSQL). Starts the services it needs.
#
#   scripts/bench.sh [renewals|sqlite|sqlite-v4|sqlite-normal|mysql|postgres ...]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
. scripts/services.sh
ensure_postgres
ensure_mariadb
say "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -m)"
if [ $# -eq 0 ]; then
    cargo bench --locked -p herald-host --bench ids
fi
cargo bench --locked -p herald-host --bench storage -- "$@"
