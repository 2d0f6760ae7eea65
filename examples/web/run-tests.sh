#!/usr/bin/env bash
# Tests the web chat page in headless Chromium (Debian's package; playwright-core drives it and
# never downloads a browser) against a real Herald that embeds the page.
#
#   HERALD_BIN=/path/to/herald examples/web/run-tests.sh
#
# HERALD_BIN defaults to target/debug/herald of the repository, built with the page
# (scripts/build-web.sh, then WEB_CHAT_PAGE set for the build; scripts/test.sh does both).
# A missing binary, page or Chromium fails the run: the tests never skip.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ -n "${HERALD_BIN:-}" ]; then bin=$(realpath -m -- "$HERALD_BIN"); else bin=$(realpath -m -- "$here/../../target/debug/herald"); fi
[ -x "$bin" ] || { echo "run-tests.sh: no Herald binary at $bin; build it or set HERALD_BIN" >&2; exit 1; }
export HERALD_BIN=$bin
chromium=${HERALD_TEST_CHROMIUM:-/usr/bin/chromium}
[ -x "$chromium" ] || { echo "run-tests.sh: no Chromium at $chromium: apt-get install -y chromium (or set HERALD_TEST_CHROMIUM)" >&2; exit 1; }
command -v npm >/dev/null 2>&1 || { echo "run-tests.sh: node and npm (Node >= 20) are needed" >&2; exit 1; }
cd "$here"
if ! cmp -s package-lock.json node_modules/.installed-from-lock 2>/dev/null; then
    npm ci --no-audit --no-fund --loglevel=error
    cp package-lock.json node_modules/.installed-from-lock
fi
npm test
