# Shared helpers for Herald's scripts. Sourced, not run.

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf '\033[31merror:\033[0m %s\n' "$*" >&2; exit 1; }

# The wasm32-wasip2 target builds the plugins; install it from the project's scripts so a
# fresh machine needs nothing done by hand.
ensure_wasm_target() {
    if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2; then
        say "installing the wasm32-wasip2 Rust target (plugins are built for it)"
        rustup target add wasm32-wasip2 >&2 || die "could not install the wasm32-wasip2 target with rustup"
    fi
}

# Builds the first-party plugins (if the plugins workspace exists) and prints the folder
# holding the .wasm files.
build_plugins() {
    local profile=${1:-release}
    if [ ! -f plugins/Cargo.toml ]; then
        return 0
    fi
    ensure_wasm_target
    say "building the first-party plugins for wasm32-wasip2"
    local flag=--release
    [ "$profile" = debug ] && flag=
    cargo build --manifest-path plugins/Cargo.toml --target wasm32-wasip2 $flag >&2 \
        || die "building the plugins failed"
}

# Headless Chromium drives the web page test; Debian's package, installed when missing.
ensure_chromium() {
    [ -n "${HERALD_TEST_CHROMIUM:-}" ] && return 0
    command -v chromium >/dev/null 2>&1 && return 0
    say "installing Debian's chromium (the web chat page is tested in a real browser)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >&2 \
        || die "could not install chromium; install it (apt-get install -y chromium) or set HERALD_TEST_CHROMIUM"
}

# promtool checks and unit-tests deploy/prometheus/alerts.yml; it comes with Debian's
# prometheus package (only the tool is used; no Prometheus server is started).
ensure_promtool() {
    command -v promtool >/dev/null 2>&1 && return 0
    say "installing Debian's prometheus package (promtool tests the alert rules)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; } >&2 \
        || die "could not install promtool; install it (apt-get install -y prometheus)"
    command -v promtool >/dev/null 2>&1 || die "the prometheus package did not provide promtool"
}

# Installs each built first-party plugin into DIR as <name>.wasm, its manifest beside it as
# <name>.toml (the layout the node loads and hot-reloads).
install_plugins() {
    local dir=$1 profile=${2:-release}
    mkdir -p "$dir"
    for manifest in plugins/*/plugin.toml; do
        [ -e "$manifest" ] || continue
        local name wasm
        name=$(basename "$(dirname "$manifest")")
        wasm="plugins/target/wasm32-wasip2/$profile/$(echo "$name" | tr - _).wasm"
        [ -f "$wasm" ] || die "plugin $name was not built ($wasm missing)"
        cp "$wasm" "$dir/$name.wasm"
        cp "$manifest" "$dir/$name.toml"
    done
}

# Builds the test suite's guest plugins (well-behaved and hostile ones, and the first-party
# plugins in release) into target/plugin-guests, where the runtime's and the server's tests
# load them from.
build_test_guests() {
    ensure_wasm_target
    say "building the test guest plugins (well-behaved and hostile) for wasm32-wasip2"
    local manifest
    for manifest in host/plugin-runtime/tests/guests/Cargo.toml plugins/Cargo.toml; do
        CARGO_TARGET_DIR=target/plugin-guests cargo build --release --target wasm32-wasip2 --manifest-path "$manifest" >&2 \
            || die "building the test guests ($manifest) failed"
    done
}

# Starts the release build of Herald (or the binary the shell variable `herald_bin` names)
# in dev mode on 127.0.0.1:$1 with data dir $2 (further arguments are VAR=value settings
# for it), waits until it answers, and sets $server (its process id). The scripts' own
# HERALD_LOADTEST_* settings are not the server's: Herald refuses unknown HERALD_* keys.
start_herald() {
    local port=$1 data=$2
    shift 2
    RUST_LOG=warn env -u HERALD_LOADTEST_PLUGINS -u HERALD_LOADTEST_PORT "$@" \
        "${herald_bin:-target/release/herald}" serve --dev --listen "127.0.0.1:$port" --data-dir "$data" &
    server=$!
    for _ in $(seq 1 300); do
        curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && return 0
        kill -0 "$server" 2>/dev/null || break
        sleep 0.1
    done
    die "Herald did not come up on port $port (its error is above)"
}

# report_flags PHASE: sets the array `report` to `--report $REPORT/PHASE` when REPORT is set
# (herald-loadgen then writes that phase's charts, summary and page there), to nothing
# otherwise. The scripts make REPORT absolute before they change directory.
report_flags() {
    report=()
    if [ -n "${REPORT:-}" ]; then report=(--report "$REPORT/$1"); fi
}

# Resident memory of process $1 in KiB (VmRSS of /proc/$1/status).
rss_kib() {
    awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"
}

# Stops the server start_herald started.
stop_herald() {
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
}
