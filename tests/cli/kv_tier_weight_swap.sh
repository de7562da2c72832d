#!/usr/bin/env bash
# strata serve with a disk KV tier keys it by the weights' content, not the model's path: other
# weights of the same shape written to the same path are served cold after a restart, with the
# new weights' tokens; the same weights hit the tier (their hashes from the cache in the tier
# directory); a `cp -p` of other weights over the file (same size and mtime) is noticed too.
# Usage: kv_tier_weight_swap.sh <strata-binary> <tests/data dir>
set -u
BIN="$1"
DEMO="$2/../../models/strata-demo"
TMP="$(mktemp -d)"
PID=""
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  [ -n "${KEEP:-}" ] || rm -rf "$TMP"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

synth() {  # synth <dir> <seed>: random weights of one shape, the demo model's tokenizer
  "$BIN" bench synth-model --out "$1" --preset tiny --vocab 4096 --tokenizer "$DEMO" --seed "$2" >/dev/null 2>&1 ||
    fail "synth-model $1 seed $2"
}

# start <name> [flags]: a server over the model directory; sets PID and PORT.
start() {
  local name="$1"
  shift
  "$BIN" serve --model "$TMP/model" --port 0 --threads 2 "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
  PID=$!
  PORT=""
  for _ in $(seq 1 600); do
    PORT=$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$TMP/$name.out")
    [ -n "$PORT" ] && return 0
    kill -0 "$PID" 2>/dev/null || fail "server $name exited: $(tail -3 "$TMP/$name.err")"
    sleep 0.1
  done
  fail "server $name did not listen"
}

stop() {
  kill -TERM "$PID"
  wait "$PID" || fail "server exited with $? after SIGTERM"
  PID=""
}

python3 -c '
import json
ids = [3 + (i * 7919 + 13) % 4000 for i in range(500)]
print(json.dumps({"model": "model", "prompt": ids, "max_tokens": 16, "temperature": 0, "logprobs": 1}))' >"$TMP/req.json"

complete() {
  curl -sf "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' -d @"$TMP/req.json" >"$TMP/$1.json" ||
    fail "request $1 failed"
}
field() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$TMP/$1.json"; }
cached() { field "$1" 'd["usage"]["prompt_tokens_details"]["cached_tokens"]'; }
# The text and each token's logprob (tied random embeddings tend to repeat the prompt's last
# token whatever the seed; the logprobs still tell the weights apart).
text() { field "$1" 'd["choices"][0]["text"] + repr(d["choices"][0]["logprobs"]["token_logprobs"])'; }
tiered() { start "$1" --kv-disk-dir "$TMP/kv"; complete "$1"; stop; }

# A cold run of weights A, then a restart: a disk-tier hit with the same text.
synth "$TMP/model" 1
tiered cold_a
[ "$(cached cold_a)" = 0 ] || fail "the first run reports cached tokens"
[ -f "$TMP/kv/weight_hashes.txt" ] || fail "no weight hash cache in the tier directory"
tiered warm_a
[ "$(cached warm_a)" -ge 496 ] || fail "same weights after a restart: cached_tokens $(cached warm_a), expected >= 496"
[ "$(text warm_a)" = "$(text cold_a)" ] || fail "same weights after a restart: the text differs from the cold run"
grep -q "2 files hashed" "$TMP/cold_a.err" || fail "the first run did not hash config.json and the weights"
grep -q "0 files hashed, 2 from the hash cache" "$TMP/warm_a.err" || fail "the restart hashed the unchanged weights again"

# Weights B, same shape, same path: served cold, with B's own cold text.
synth "$TMP/model" 2
start cold_b  # no tier at all
complete cold_b
stop
[ "$(text cold_b)" != "$(text cold_a)" ] || fail "the two seeds give the same text; the test cannot tell them apart"
tiered swapped
[ "$(cached swapped)" = 0 ] || fail "other weights at the same path report $(cached swapped) cached tokens (the old model's KV)"
[ "$(text swapped)" = "$(text cold_b)" ] || fail "other weights at the same path answer with other text than their cold run"

# cp -p of A's weights over B's: same size, same mtime (made equal first), same inode; only
# ctime moves. The tier now holds B's blocks: A must not be served them.
synth "$TMP/a" 1
touch -r "$TMP/model/model.safetensors" "$TMP/a/model.safetensors"
sleep 0.05
cp -p "$TMP/a/model.safetensors" "$TMP/model/model.safetensors"
tiered copied
[ "$(cached copied)" = 0 ] || fail "weights copied with cp -p report $(cached copied) cached tokens"
[ "$(text copied)" = "$(text cold_a)" ] || fail "weights copied with cp -p answer with other text than their cold run"
echo "all checks passed"
