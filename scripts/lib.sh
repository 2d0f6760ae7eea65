# Shared helpers for Herald's scripts. Sourced, not run.

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf '\033[31merror:\033[0m %s\n' "$*" >&2; exit 1; }

# The web chat page (examples/web, on the TypeScript client) is built by build_web_page into
# target/web/index.html, and Herald's build embeds it when WEB_CHAT_PAGE names it
# (host/build.rs; without it, a page saying how to build it). Once the page exists every
# script builds Herald with it, so running one script after another does not rebuild Herald
# with and without the page.
if [ -f target/web/index.html ]; then export WEB_CHAT_PAGE=$PWD/target/web/index.html; fi

# npm_ci DIR: installs DIR's packages from its package-lock.json (npm ci), unless the
# node_modules there were installed from that same lockfile.
npm_ci() {
    local dir=$1
    cmp -s "$dir/package-lock.json" "$dir/node_modules/.installed-from-lock" 2>/dev/null && return 0
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error) >&2 || die "npm ci failed in $dir"
    cp "$dir/package-lock.json" "$dir/node_modules/.installed-from-lock"
}

# Builds the web chat page into target/web (the client library's packages and protobuf code,
# then examples/web's esbuild, each from its lockfile) and exports WEB_CHAT_PAGE for the
# Herald build that follows. Needs Node >= 20 and npm; dies when a step fails.
build_web_page() {
    command -v npm >/dev/null 2>&1 \
        || die "node and npm (Node >= 20) are needed to build the web chat page (apt-get install -y nodejs npm)"
    node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' \
        || die "Node >= 20 is needed to build the web chat page, found $(node --version)"
    say "building the web chat page (examples/web on clients/typescript, esbuild) into target/web"
    npm_ci clients/typescript
    (cd clients/typescript && npm run --silent generate) >&2 || die "generating the TypeScript client's protobuf code failed"
    npm_ci examples/web
    node examples/web/build.mjs target/web >&2 || die "building the web chat page failed (examples/web/build.mjs)"
    export WEB_CHAT_PAGE=$PWD/target/web/index.html
}

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

# nginx runs in the placement tests, as the real load balancer in front of a cluster
# (hash $arg_user): Debian's package, only the binary is used (each test starts its own
# process on loopback with a config in a temporary directory).
ensure_nginx() {
    command -v nginx >/dev/null 2>&1 && return 0
    [ -x /usr/sbin/nginx ] && return 0
    say "installing Debian's nginx (the placement tests route clients through a real nginx)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx; } >&2 \
        || die "could not install nginx; install it (apt-get install -y nginx)"
    [ -x /usr/sbin/nginx ] || command -v nginx >/dev/null 2>&1 || die "the nginx package did not provide nginx"
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

# Builds the Python and JavaScript example plugins (guests/python, guests/javascript) into
# target/language-guests/word_filter_py.wasm and word_filter_js.wasm, where the runtime's
# tests and benchmarks load them from. The tools are installed from the project's own pinned
# files, under target/language-guests: componentize-py (guests/python/requirements.txt) in a
# virtualenv, jco with componentize-js (guests/javascript/package-lock.json) by `npm ci`.
# Both build against the world `message-policy-plugin` of proto/wit by path; the contract
# version is read from the WIT, never written down. A component is rebuilt only when a file
# it is built from is newer. Needs python3 (with venv) and node/npm; dies when a tool cannot
# be installed or a build fails.
build_language_guests() {
    local out=target/language-guests
    local wit=proto/wit
    mkdir -p "$out"
    command -v python3 >/dev/null 2>&1 || die "python3 is needed to build the Python guests (apt-get install -y python3 python3-venv)"
    command -v npm >/dev/null 2>&1 || die "node and npm are needed to build the JavaScript guests (apt-get install -y nodejs npm)"

    # componentize-py, at the version requirements.txt pins, in target/language-guests/venv.
    local venv=$out/venv
    if ! cmp -s guests/python/requirements.txt "$venv/requirements.txt" 2>/dev/null; then
        say "installing componentize-py (guests/python/requirements.txt) into $venv"
        rm -rf "$venv"
        python3 -m venv "$venv" >&2 || die "could not create a Python virtualenv in $venv (apt-get install -y python3-venv)"
        "$venv/bin/pip" install --quiet --disable-pip-version-check -r guests/python/requirements.txt >&2 \
            || die "could not install componentize-py from PyPI (guests/python/requirements.txt)"
        cp guests/python/requirements.txt "$venv/requirements.txt"
    fi
    "$venv/bin/componentize-py" --version >/dev/null 2>&1 || die "componentize-py in $venv does not run; remove $venv and retry"

    # jco + componentize-js, exactly as package-lock.json pins them, in target/language-guests/js-tools.
    local js=$out/js-tools
    if ! cmp -s guests/javascript/package-lock.json "$js/package-lock.json" 2>/dev/null \
        || [ ! -x "$js/node_modules/.bin/jco" ]; then
        say "installing jco and componentize-js (guests/javascript/package-lock.json) into $js"
        rm -rf "$js"
        mkdir -p "$js"
        cp guests/javascript/package.json guests/javascript/package-lock.json "$js/"
        (cd "$js" && npm ci --no-audit --no-fund --loglevel=error) >&2 \
            || die "could not install jco/componentize-js from npm (guests/javascript/package-lock.json)"
    fi
    [ -x "$js/node_modules/.bin/jco" ] || die "npm ci did not install jco into $js"

    local version
    version=$(sed -n 's/^package herald:plugin@\([^;]*\);.*/\1/p' "$wit"/*.wit)
    version=${version%%$'\n'*}
    [ -n "$version" ] || die "no \`package herald:plugin@VERSION;\` line in $wit"

    local py_out=$out/word_filter_py.wasm
    if [ ! -f "$py_out" ] || [ -n "$(find guests/python "$wit" -newer "$py_out" -type f -not -path '*/__pycache__/*' | head -n 1)" ]; then
        say "building guests/python/word-filter with componentize-py"
        "$venv/bin/componentize-py" -d "$wit" -w message-policy-plugin componentize \
            -p guests/python/word-filter -p guests/python word_filter -o "$py_out.tmp" >&2 \
            || die "componentize-py failed to build guests/python/word-filter"
        mv "$py_out.tmp" "$py_out"
        find guests/python -name __pycache__ -type d -prune -exec rm -rf {} + 2>/dev/null || true
    fi

    local js_out=$out/word_filter_js.wasm
    if [ ! -f "$js_out" ] || [ -n "$(find guests/javascript "$wit" -newer "$js_out" -type f | head -n 1)" ]; then
        say "building guests/javascript/word-filter with jco componentize"
        # Staged beside node_modules (so the bundler finds smol-toml); componentize-js names
        # imports with their version, so the staged helper gets the WIT's. HTTP is disabled:
        # Herald serves no wasi:http (a plugin has no network), so the component must not
        # import it.
        rm -rf "$js/src"
        mkdir -p "$js/src"
        cp -r guests/javascript/herald-plugin.js guests/javascript/word-filter "$js/src/"
        sed -i "s#'herald:plugin/host'#'herald:plugin/host@$version'#" "$js/src/herald-plugin.js"
        "$js/node_modules/.bin/jco" componentize --bundle "$js/src/word-filter/word-filter.js" \
            --wit "$wit" --world-name message-policy-plugin --disable http fetch-event -o "$js_out.tmp" >&2 \
            || die "jco componentize failed to build guests/javascript/word-filter"
        mv "$js_out.tmp" "$js_out"
    fi
}

# Starts the release build of Herald (or the binary the shell variable `herald_bin` names)
# in dev mode on 127.0.0.1:$1 with data dir $2 (further arguments are VAR=value settings
# for it), waits until it answers, and sets $server (its process id). The scripts' own
# HERALD_LOADTEST_* settings are not the server's: Herald refuses unknown HERALD_* keys.
# The array `herald_flags`, when set, holds more flags for `herald serve`.
start_herald() {
    local port=$1 data=$2
    shift 2
    # A server left on the port would answer the health check below in this one's place.
    [ -z "$(ss -Htln "( sport = :$port )")" ] || die "port $port is taken (another Herald left running?)"
    RUST_LOG=warn env -u HERALD_LOADTEST_PLUGINS -u HERALD_LOADTEST_PORT "$@" \
        "${herald_bin:-target/release/herald}" serve --dev --listen "127.0.0.1:$port" --data-dir "$data" \
        ${herald_flags[@]+"${herald_flags[@]}"} &
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
