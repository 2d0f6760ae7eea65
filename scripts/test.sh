#!/usr/bin/env bash
# Herald's whole test suite, as CI runs it: starts the local services the tests need,
# builds the plugins, checks lints, and runs every test; then the Redis-backed tests again
# against a 3-master Redis Cluster it starts on 127.0.0.1:7001-7003 and stops at the end.
#
#   scripts/test.sh            everything
#   scripts/test.sh -- ARGS    extra arguments for `cargo test` (e.g. a test name filter)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
. scripts/services.sh

ensure_services
# The Redis-backed tests run a second time against a 3-master Redis Cluster (below); start it
# now so a broken set-up fails before the long run, and stop it however the script ends.
trap stop_redis_cluster EXIT
redis_cluster_url=$(ensure_redis_cluster)
say "Redis Cluster up: $redis_cluster_url"
ensure_wasm_target
ensure_chromium
ensure_promtool
ensure_nginx
build_plugins debug
build_test_guests
build_language_guests
# Before any cargo command: Herald embeds the page, and every build below sees the same
# WEB_CHAT_PAGE (a change of it would rebuild Herald).
build_web_page

say "formatting (rustfmt.toml; \`cargo fmt --all\` fixes it)"
for manifest in Cargo.toml plugins/Cargo.toml host/plugin-runtime/tests/guests/Cargo.toml; do
    cargo fmt --manifest-path "$manifest" --all --check >/dev/null \
        || die "$manifest: code is not formatted; run: cargo fmt --manifest-path $manifest --all"
done

say "links in README.md and docs/"
scripts/check-links.sh

say "alert rules (deploy/prometheus): promtool check and unit tests"
promtool check rules deploy/prometheus/alerts.yml
promtool test rules deploy/prometheus/alerts_test.yml

say "clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

if [ -f plugins/Cargo.toml ]; then
    say "plugin unit tests (native, with the SDK's test kit)"
    cargo test --manifest-path plugins/Cargo.toml --locked
fi

say "herald-sdk packs as a crate of its own (no path dependencies, its own copy of the contract)"
cargo package -p herald-sdk --no-verify --allow-dirty --locked >/dev/null 2>&1 \
    || die "herald-sdk does not package: run cargo package -p herald-sdk --no-verify --allow-dirty to see why"

say "workspace tests"
[ "${1:-}" = "--" ] && shift
# herald-client's tests run here too, against the Herald binary this run builds first.
cargo test --workspace --locked "$@"

# The TypeScript client library against the debug Herald the tests just built: its unit
# tests and the conformance scenarios of clients/SPEC.md, each on a Herald of its own.
say "TypeScript client (clients/typescript): npm ci, build, tests, npm pack"
HERALD_BIN=${CARGO_TARGET_DIR:-target}/debug/herald clients/typescript/run-tests.sh
# The web chat page (built above, embedded in that Herald) in headless Chromium.
say "web chat page (examples/web) in headless Chromium"
HERALD_BIN=${CARGO_TARGET_DIR:-target}/debug/herald examples/web/run-tests.sh
say "Rust client (clients/rust) packs as a crate of its own (its conformance scenarios ran above)"
cargo package -p herald-client --no-verify --allow-dirty --locked >/dev/null 2>&1 \
    || die "herald-client does not package: run cargo package -p herald-client --no-verify --allow-dirty to see why"

# The soak's short version (docs/OPERATIONS.md, "Soak test"), on the debug binaries the tests
# just built: 2 minutes of mixed traffic with churn, storms and hot reloads; it fails when
# connection state or idle state is not forgotten once the clients leave, or on gross growth.
say "soak, short version (2 minutes)"
PROFILE=debug scripts/soak.sh 2

# Only the Redis-backed modules of herald-host's tests, on the cluster: every script and
# multi-key step must stay in one slot (a CROSSSLOT error fails them). cluster_plugin_state::
# and messaging::cluster_nodes:: / cluster_faults:: / the behaviour suite's three nodes on
# PostgreSQL (multi-process clusters of herald nodes,
# handed the URL as HERALD_CLUSTER__REDIS_URL) are included, but for the test that cuts a
# node off from Redis through a proxy, which a Redis Cluster's announced master addresses
# bypass, the one restarting a Redis of its own (it never uses the cluster), and the
# MariaDB twin of the paused-owner test (what it adds is the SQL side, checked above).
# `--workspace` rather than `-p herald-host`: the same feature set as the run above,
# so nothing is rebuilt (no test of the other packages' `all` binaries matches these filters).
say "Redis-backed tests again, against the Redis Cluster at $redis_cluster_url"
HERALD_TEST_REDIS_URL=$redis_cluster_url cargo test --workspace --test all --locked -- \
    cluster:: cluster_membership:: cluster_plugin_state:: messaging::cluster_nodes:: messaging::cluster_faults:: \
    messaging::behaviour::three_nodes_on_postgres:: \
    --skip a_node_cut_off_from_redis --skip a_redis_restart \
    --skip a_paused_owner_resumed_after_its_lease_lapsed_commits_nothing_on_mariadb
