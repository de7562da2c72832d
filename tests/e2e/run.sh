#!/usr/bin/env bash
# The end-to-end suite: `bash tests/e2e/run.sh <strata-binary> [<tests/data dir>]`.
# Needs node >= 20 and tests/e2e/node_modules (`npm ci` in tests/e2e; .ci/run does it). Runs
# offline once node_modules is there.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
binary="$(realpath "$1")"
if [ ! -d "$here/node_modules/openai" ] || [ ! -d "$here/node_modules/@anthropic-ai/sdk" ]; then
  echo "tests/e2e/node_modules is missing or incomplete: running npm ci" >&2
  (cd "$here" && npm ci --no-audit --no-fund)
fi
export STRATA_BINARY="$binary"
export STRATA_SOURCE_DIR="$(cd "$here/../.." && pwd)"
cd "$here"
# The browser test speaks the DevTools protocol over WebSocket: Node 20 has it behind a flag.
flags=()
if node -e 'process.exit(typeof WebSocket === "undefined" ? 0 : 1)'; then flags+=(--experimental-websocket); fi
exec node "${flags[@]}" --test --test-concurrency=1 ./*.test.mjs
