#!/usr/bin/env bash
# Installs (npm ci, from package-lock.json), builds (protobuf generation with buf, then tsc)
# and tests the TypeScript client against a real Herald binary.
#
#   HERALD_BIN=/path/to/herald clients/typescript/run-tests.sh
#
# HERALD_BIN defaults to target/debug/herald of the repository; a missing binary fails the
# run (the conformance tests never skip). Any failing step fails the script.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

# A relative HERALD_BIN is taken from where the script was called.
if [ -n "${HERALD_BIN:-}" ]; then bin=$(realpath -m -- "$HERALD_BIN"); else bin=$(realpath -m -- "$here/../../target/debug/herald"); fi
if [ ! -x "$bin" ]; then
    echo "run-tests.sh: no Herald binary at $bin; build it or set HERALD_BIN" >&2
    exit 1
fi
export HERALD_BIN=$bin
cd "$here"

command -v npm >/dev/null 2>&1 || { echo "run-tests.sh: node and npm (Node >= 20) are needed" >&2; exit 1; }
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' \
    || { echo "run-tests.sh: Node >= 20 is needed, found $(node --version)" >&2; exit 1; }

npm ci --no-audit --no-fund --loglevel=error
npm run build
npm test
# The package as it would be published: what `npm pack` puts in it must build and be there.
npm pack --dry-run --loglevel=error >/dev/null
