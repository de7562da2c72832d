#!/usr/bin/env bash
# strata serve with a disk KV tier: a long prompt's KV survives a restart (SIGTERM writes the
# pool's cached blocks down); after the restart the same prompt reports its tokens as cached
# (usage.prompt_tokens_details.cached_tokens) and answers with the cold run's text.
# Usage: kv_tier_restart.sh <strata-binary> <tests/data dir>
set -u
BIN="$1"
MODEL="$2/../../models/strata-demo"
TMP="$(mktemp -d)"
PID=""
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# start <name>: a server over the tier directory; sets PID and PORT.
start() {
  "$BIN" serve --model "$MODEL" --port 0 --threads 2 --kv-disk-dir "$TMP/kv" >"$TMP/$1.out" 2>"$TMP/$1.err" &
  PID=$!
  PORT=""
  for _ in $(seq 1 600); do
    PORT=$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$TMP/$1.out")
    [ -n "$PORT" ] && return 0
    kill -0 "$PID" 2>/dev/null || fail "server $1 exited: $(tail -3 "$TMP/$1.err")"
    sleep 0.1
  done
  fail "server $1 did not listen"
}

stop() {
  kill -TERM "$PID"
  wait "$PID" || fail "server exited with $? after SIGTERM"
  PID=""
}

# 1,000 prompt token ids (the demo model's vocabulary is larger than 3,000).
python3 -c '
import json
ids = [3 + (i * 7919 + 13) % 3000 for i in range(1000)]
print(json.dumps({"model": "strata-demo", "prompt": ids, "max_tokens": 8, "temperature": 0}))' >"$TMP/req.json"

complete() {
  curl -sf "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' -d @"$TMP/req.json" >"$TMP/$1.json" ||
    fail "request $1 failed"
}
field() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$TMP/$1.json"; }

start first
complete cold
[ "$(field cold 'd["usage"]["prompt_tokens_details"]["cached_tokens"]')" = 0 ] || fail "cold run reports cached tokens"
stop
ls "$TMP/kv"/*.kvb >/dev/null 2>&1 || fail "no tier files after SIGTERM"

start second
complete warm
cached=$(field warm 'd["usage"]["prompt_tokens_details"]["cached_tokens"]')
[ "$cached" -ge 992 ] || fail "after the restart cached_tokens is $cached, expected >= 992 (62 blocks of 16)"
[ "$(field warm 'd["choices"][0]["text"]')" = "$(field cold 'd["choices"][0]["text"]')" ] ||
  fail "text after the restart differs from the cold run"
curl -sf "http://127.0.0.1:$PORT/metrics" | grep -q 'strata_kv_tier_hit_blocks_total{.*tier="disk"} [1-9]' ||
  fail "/metrics shows no disk tier hits"
stop
echo "all checks passed"
