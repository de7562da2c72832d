#!/usr/bin/env bash
# --speculative, --num-draft-tokens and --draft-model: bad values make serve and generate exit
# non-zero before serving, naming the flag and the value; generate's output with n-gram and
# draft-model speculation equals its output without.
# Usage: speculative_flags.sh <strata-binary> <tests/data dir>
set -u
BIN="$1"
DATA="$2"
MODELS="$(cd "$(dirname "$0")/../../models" && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# expect_error "<command and flags>" <text the message must contain>...
expect_error() {
  local cmd="$1"; shift
  # shellcheck disable=SC2086
  timeout 60 "$BIN" $cmd >"$TMP/out" 2>&1
  local rc=$?
  if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then
    fail "$cmd: exit $rc, expected a refusal"
    return
  fi
  grep -q "listening on" "$TMP/out" && fail "$cmd: listened before refusing"
  grep -q "not expected" "$TMP/out" && fail "$cmd: the flags are unknown: $(tail -2 "$TMP/out")"
  for want in "$@"; do
    grep -qF -- "$want" "$TMP/out" || fail "$cmd: message lacks '$want': $(tail -2 "$TMP/out")"
  done
}

for sub in "serve --port 0 --model $MODELS/strata-demo" "generate --model $MODELS/strata-demo --prompt-ids 1,2,3 --max-tokens 4"; do
  expect_error "$sub --speculative eagle" "--speculative" "eagle"
  expect_error "$sub --speculative ngram --num-draft-tokens 0" "--num-draft-tokens" "0"
  expect_error "$sub --speculative ngram --num-draft-tokens 17" "--num-draft-tokens" "17"
  expect_error "$sub --speculative draft" "--draft-model"
  expect_error "$sub --speculative ngram --draft-model $MODELS/strata-demo-draft" "--draft-model" "--speculative draft"
  expect_error "$sub --speculative draft --draft-model $TMP/missing" "--draft-model" "$TMP/missing"
  # A draft without the target's tokenizer (a reference checkpoint with none).
  expect_error "$sub --speculative draft --draft-model $DATA/reference/models/qwen3-tiny" "--draft-model" "qwen3-tiny" "tokenizer"
done
# Another vocabulary (same tokenizer presence: neither has one), and a shorter context.
expect_error "generate --model $DATA/reference/models/qwen3-tiny --prompt-ids 1,2,3 --speculative draft --draft-model $DATA/reference/models/stories260k --max-tokens 600" \
  "--draft-model" "stories260k" "512"

PROMPT="--model $MODELS/strata-demo --prompt-ids 10,20,30,40,10,20,30 --max-tokens 40 --temperature 0 --output ids --threads 2"
# shellcheck disable=SC2086
want="$(timeout 120 "$BIN" generate $PROMPT 2>/dev/null)"
[ -n "$want" ] || fail "generate without speculation gave nothing"
for spec in "--speculative ngram" "--speculative draft --draft-model $MODELS/strata-demo-draft --num-draft-tokens 6"; do
  # shellcheck disable=SC2086
  got="$(timeout 120 "$BIN" generate $PROMPT $spec 2>"$TMP/err")"
  [ "$got" = "$want" ] || fail "generate $spec: '$got' differs from '$want'"
  grep -q "speculation:" "$TMP/err" || fail "generate $spec: no speculation counts logged"
done

# serve: usage.speculation on a speculating request (stream and not), none on one that opts out,
# and the /metrics counters.
"$BIN" serve --port 0 --model "$MODELS/strata-demo" --speculative ngram --threads 2 >"$TMP/serve.out" 2>&1 &
SERVE=$!
for _ in $(seq 1 300); do
  grep -q "listening on" "$TMP/serve.out" 2>/dev/null && break
  sleep 0.1
done
URL="$(grep -o 'http://[0-9.:]*' "$TMP/serve.out" | head -1)"
if [ -z "$URL" ]; then
  fail "serve --speculative ngram did not start: $(tail -2 "$TMP/serve.out")"
else
  BODY='{"prompt":[10,20,30,40,10,20,30],"max_tokens":64,"temperature":0,"ignore_eos":true'
  curl -s "$URL/v1/completions" -H 'Content-Type: application/json' -d "$BODY}" >"$TMP/on.json"
  grep -q '"speculation":{"accepted_tokens":[0-9]*,"draft_tokens":[1-9]' "$TMP/on.json" ||
    fail "no usage.speculation with drafts: $(cat "$TMP/on.json")"
  curl -s "$URL/v1/completions" -H 'Content-Type: application/json' -d "$BODY,\"speculative\":false}" >"$TMP/off.json"
  grep -q '"usage"' "$TMP/off.json" || fail "opted-out request failed: $(cat "$TMP/off.json")"
  grep -q 'speculation' "$TMP/off.json" && fail "opted-out request reports speculation: $(cat "$TMP/off.json")"
  [ "$(grep -o '"text":"[^"]*"' "$TMP/on.json")" = "$(grep -o '"text":"[^"]*"' "$TMP/off.json")" ] ||
    fail "speculating and opted-out requests differ: $(cat "$TMP/on.json") vs $(cat "$TMP/off.json")"
  curl -s -N "$URL/v1/completions" -H 'Content-Type: application/json' \
    -d "$BODY,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" >"$TMP/stream.txt"
  grep -q '"speculation":{' "$TMP/stream.txt" || fail "no usage.speculation in the stream's final chunk"
  curl -s -X POST "$URL/v1/completions" -H 'Content-Type: application/json' -d '{"prompt":"a","speculative":3}' >"$TMP/bad.json"
  grep -q 'speculative' "$TMP/bad.json" || fail "speculative: 3 not refused by name: $(cat "$TMP/bad.json")"
  curl -s "$URL/metrics" >"$TMP/metrics.txt"
  grep -q '^strata_spec_draft_tokens_total{.*} [1-9]' "$TMP/metrics.txt" || fail "no drafted tokens in /metrics"
  grep -q '^strata_spec_accepted_tokens_total{' "$TMP/metrics.txt" || fail "no accepted tokens in /metrics"
  grep -q '^strata_spec_accepted_per_verify_count{' "$TMP/metrics.txt" || fail "no acceptance histogram in /metrics"
fi
kill "$SERVE" 2>/dev/null
wait "$SERVE" 2>/dev/null

if [ $failures -gt 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "speculative flags: ok"
