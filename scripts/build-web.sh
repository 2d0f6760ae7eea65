#!/usr/bin/env bash
# Builds the web chat page (examples/web, bundled with esbuild) into target/web/index.html and
# prints its path. Herald embeds it when built with WEB_CHAT_PAGE set to that path;
# scripts/run.sh and scripts/test.sh do both, and every script sets it once the page exists.
#
#   scripts/build-web.sh && WEB_CHAT_PAGE=$PWD/target/web/index.html cargo build -p herald-host --bin herald
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
build_web_page
echo "$WEB_CHAT_PAGE"
