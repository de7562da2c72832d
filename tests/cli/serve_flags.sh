#!/usr/bin/env bash
# strata serve: every bad flag value exits non-zero before listening, with a message that names
# the flag (or the file) and the value.
# Usage: serve_flags.sh <strata-binary> <tests/data dir>
set -u
BIN="$1"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# expect_error "<flags>" <text the message must contain>...
expect_error() {
  local flags="$1"; shift
  # shellcheck disable=SC2086
  timeout 60 "$BIN" serve --port 0 $flags >"$TMP/out" 2>&1
  local rc=$?
  if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then
    fail "serve $flags: exit $rc, expected a refusal"
    return
  fi
  grep -q "listening on" "$TMP/out" && fail "serve $flags: listened before refusing"
  for want in "$@"; do
    grep -qF -- "$want" "$TMP/out" || fail "serve $flags: message lacks '$want': $(tail -2 "$TMP/out")"
  done
}

echo '[{"layer_idx": 99, "codec": "int8"}]' >"$TMP/kv.json"
echo 'not json' >"$TMP/bad.json"

expect_error "--model $TMP/missing" "$TMP/missing"
expect_error "--kv-cache-dtype int3" "--kv-cache-dtype" "int3"
expect_error "--quantization int3 --load-format dummy" "--quantization" "int3"
expect_error "--quantization fp8" "--quantization fp8" "--load-format dummy"
expect_error "--kv-config $TMP/kv.json" "--kv-config" "99"
expect_error "--kv-config $TMP/bad.json" "--kv-config"
expect_error "--kv-config $TMP/none.json" "$TMP/none.json"
expect_error "--kv-quant-start 32" "--kv-quant-start" "32"
expect_error "--kv-quant-start soon" "--kv-quant-start" "soon"
expect_error "--state-snapshot-interval 0" "state-snapshot-interval" "0"
expect_error "--checkpoint-every -1" "--checkpoint-every" "-1"
expect_error "--kv-host-bytes -5" "kv_host_bytes" "-5"
expect_error "--max-batch-tokens 0" "max_batch_tokens" "0"
expect_error "--scheduling-policy lifo" "lifo"
expect_error "--max-json-depth 1" "--max-json-depth" "1"
expect_error "--header-timeout 0" "--header-timeout" "0"
expect_error "--max-connections-per-address -1" "--max-connections-per-address" "-1"
expect_error "--responses-store-ttl -1" "--responses-store-ttl" "-1"
expect_error "--responses-store-bytes -1" "--responses-store-bytes" "-1"
# An engine start error names its code once (it read 'invalid argument: invalid argument: ...').
expect_error "--kv-disk-dir /proc/nonexistent/kv" "/proc/nonexistent/kv"
grep -q "invalid argument: invalid argument" "$TMP/out" && fail "the error repeats its prefix: $(tail -1 "$TMP/out")"

if [ $failures -ne 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "all checks passed"
