#!/usr/bin/env bash
# strata generate: greedy ids against the transformers goldens, and clean error exits.
# Usage: generate.sh <strata-binary> <tests/data dir>
set -u
BIN="$1"
DATA="$2"
MODELS="$DATA/reference/models"
LOGITS="$DATA/reference/logits.json"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

golden() {  # golden <model> <case> <field>: the field as comma- or space-separated ids
  python3 -c "import json,sys; c=json.load(open('$LOGITS'))['$1']['cases'][$2]['$3']; print(('${4:-}' or ' ').join(map(str,c)))"
}

# 1. --temperature 0 --output ids prints exactly the golden greedy ids on one stdout line.
for spec in "qwen2-tiny 1" "gemma3-tiny 2" "llama3-tiny 3"; do
  set -- $spec
  model="$1"; idx="$2"
  prompt="$(golden "$model" "$idx" prompt_ids ,)"
  want="$(golden "$model" "$idx" greedy_ids)"
  got="$("$BIN" generate --model "$MODELS/$model" --prompt-ids "$prompt" --max-tokens 32 --temperature 0 --output ids \
         --ignore-eos --threads 2 2>"$TMP/stderr")"
  rc=$?
  [ $rc -eq 0 ] || fail "$model case $idx: exit $rc: $(cat "$TMP/stderr")"
  [ "$got" = "$want" ] || fail "$model case $idx: got '$got' want '$want'"
  [ "$(printf '%s\n' "$got" | wc -l)" -eq 1 ] || fail "$model case $idx: stdout is not one line"
done

# 2. Generation stops at an EOS id of generation_config.json (int or list), without printing
#    it, unless --ignore-eos. The copy below declares the golden's third token an EOS id.
prompt="$(golden qwen2-tiny 1 prompt_ids ,)"
read -r -a greedy <<<"$(golden qwen2-tiny 1 greedy_ids)"
mkdir -p "$TMP/eos"
cp "$MODELS/qwen2-tiny/config.json" "$MODELS/qwen2-tiny/model.safetensors" "$TMP/eos/"
echo "{\"eos_token_id\": [511, ${greedy[2]}]}" >"$TMP/eos/generation_config.json"
want="${greedy[0]} ${greedy[1]}"
got="$("$BIN" generate --model "$TMP/eos" --prompt-ids "$prompt" --max-tokens 32 --temperature 0 --output ids 2>/dev/null)"
[ "$got" = "$want" ] || fail "eos stop: got '$got' want '$want'"
got="$("$BIN" generate --model "$TMP/eos" --prompt-ids "$prompt" --max-tokens 5 --temperature 0 --output ids --ignore-eos 2>/dev/null)"
[ "$got" = "${greedy[*]:0:5}" ] || fail "--ignore-eos: got '$got' want '${greedy[*]:0:5}'"

# 3. Text prompts and text output through the demo model's tokenizer.
DEMO="$DATA/../../models/strata-demo"
demo() {  # demo <case> <field>
  python3 -c "import json; print(json.load(open('$LOGITS'))['strata-demo']['cases'][$1]['$2'])"
}
text="$(demo 2 text)"
want="$(python3 -c "import json; print(' '.join(map(str, json.load(open('$LOGITS'))['strata-demo']['cases'][2]['greedy_ids'])))")"
got="$("$BIN" generate --model "$DEMO" --prompt "$text" --max-tokens 48 --temperature 0 --output ids 2>"$TMP/stderr")"
[ "$got" = "$want" ] || fail "strata-demo --prompt: got '$got' want '$want' ($(cat "$TMP/stderr"))"
"$BIN" generate --model "$DEMO" --prompt "$text" --max-tokens 48 --temperature 0 --output text >"$TMP/text" 2>/dev/null
python3 - "$TMP/text" "$LOGITS" <<'PY' || fail "strata-demo --output text differs from greedy_text"
import json, sys
got = open(sys.argv[1], encoding="utf-8").read()
want = json.load(open(sys.argv[2]))["strata-demo"]["cases"][2]["greedy_text"] + "\n"
sys.exit(0 if got == want else 1)
PY

# 4. strata inspect: family, shape and the parameter count of the safetensors header.
"$BIN" inspect --model "$MODELS/qwen3moe-tiny" >"$TMP/inspect" 2>"$TMP/stderr" || fail "inspect: $(cat "$TMP/stderr")"
params="$(python3 - "$MODELS/qwen3moe-tiny/model.safetensors" <<'PY'
import json, struct, sys, math
f = open(sys.argv[1], "rb")
n = struct.unpack("<Q", f.read(8))[0]
h = json.loads(f.read(n))
print(sum(math.prod(v["shape"]) for k, v in h.items() if k != "__metadata__"))
PY
)"
grep -q "^family: *qwen3_moe" "$TMP/inspect" || fail "inspect: family: $(cat "$TMP/inspect")"
grep -q "^experts: *8 (top 2" "$TMP/inspect" || fail "inspect: experts: $(cat "$TMP/inspect")"
grep -q "^parameters: *$params\$" "$TMP/inspect" || fail "inspect: parameters != $params: $(cat "$TMP/inspect")"
# 2 layers x 2 KV heads x (32 + 32) dims x 4 bytes
grep -q "^kv_bytes/token: *1024 " "$TMP/inspect" || fail "inspect: kv bytes: $(cat "$TMP/inspect")"
# The engine's KV plan under the default limits: 512 MiB of 16-token blocks of 16 KiB.
grep -q "^kv_plan: *32768 full-attention blocks of 16 tokens (512 MiB) in 536870912 bytes, 64 sequences" "$TMP/inspect" ||
  fail "inspect: kv plan: $(cat "$TMP/inspect")"
# A model with sliding-window layers gets a window pool; limits that hold no block are refused.
"$BIN" inspect --model "$MODELS/gemma3-tiny" --kv-cache-bytes 4194304 --max-num-seqs 2 >"$TMP/inspect" 2>"$TMP/stderr" ||
  fail "inspect gemma3: $(cat "$TMP/stderr")"
grep -q "^kv_plan: .* sliding-window blocks" "$TMP/inspect" || fail "inspect gemma3: kv plan: $(cat "$TMP/inspect")"
if "$BIN" inspect --model "$MODELS/qwen3moe-tiny" --kv-cache-bytes 100 >"$TMP/inspect" 2>"$TMP/stderr"; then
  fail "inspect: 100 KV bytes accepted"
fi
grep -q "kv_cache_bytes 100 " "$TMP/stderr" || fail "inspect: kv bytes error: $(cat "$TMP/stderr")"

# 5. Error exits: a message on stderr, a nonzero status, never a crash (status > 128).
expect_error() {  # expect_error <pattern> <args...>
  local pattern="$1"; shift
  "$BIN" generate "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [ $rc -eq 0 ] || [ $rc -gt 128 ]; then fail "'$*': exit $rc"; fi
  grep -q -- "$pattern" "$TMP/err" || fail "'$*': stderr lacks '$pattern': $(cat "$TMP/err")"
}
expect_error "does not exist" --model "$TMP/no-such-model" --prompt-ids 1 --output ids
expect_error "not a token id" --model "$MODELS/qwen2-tiny" --prompt-ids 1,x --output ids
expect_error "outside the vocabulary" --model "$MODELS/qwen2-tiny" --prompt-ids 1,512 --output ids
long="$(python3 -c "print(','.join(['5']*600))")"
expect_error "600 tokens.*context of 512" --model "$MODELS/stories260k" --prompt-ids "$long" --output ids
mkdir -p "$TMP/unknown"
echo '{"model_type": "no_such_family", "vocab_size": 8, "hidden_size": 4, "num_hidden_layers": 1, "num_attention_heads": 1}' \
  >"$TMP/unknown/config.json"
expect_error "supported: .*llama" --model "$TMP/unknown" --prompt-ids 1 --output ids
mkdir -p "$TMP/noweights"
cp "$MODELS/qwen2-tiny/config.json" "$TMP/noweights/"
expect_error "model.safetensors" --model "$TMP/noweights" --prompt-ids 1 --output ids
expect_error "tokenizer" --model "$MODELS/qwen2-tiny" --prompt "hello" --output ids
expect_error "exactly one of" --model "$MODELS/qwen2-tiny" --output ids

# 6. --lora DIR: the PEFT oracle's greedy ids (tests/data/reference/lora), on the plain path and
# through the engine (--speculative ngram), and a refused adapter of another base model.
LORA="$DATA/reference/lora"
lora_golden() {  # lora_golden <model:variant> <case> <field> [sep]
  python3 -c "import json; c=json.load(open('$LORA/lora_logits.json'))['$1']['cases'][$2]['$3']; print(('${4:-}' or ' ').join(map(str,c)))"
}
for spec in "llama3-tiny a 1" "qwen3-tiny b 2"; do
  set -- $spec
  prompt="$(lora_golden "$1:$2" "$3" prompt_ids ,)"
  want="$(lora_golden "$1:$2" "$3" greedy_ids)"
  for extra in "" "--speculative ngram"; do
    got="$("$BIN" generate --model "$MODELS/$1" --lora "$LORA/$1-$2" --prompt-ids "$prompt" --max-tokens 16 --temperature 0 \
           --output ids --ignore-eos --threads 2 $extra 2>"$TMP/stderr")"
    [ "$got" = "$want" ] || fail "--lora $1-$2 case $3 $extra: got '$got' want '$want' ($(cat "$TMP/stderr"))"
  done
done
"$BIN" generate --model "$MODELS/qwen3-tiny" --lora "$LORA/llama3-tiny-a" --prompt-ids 1,2 --max-tokens 2 >/dev/null 2>"$TMP/stderr"
rc=$?
{ [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q "lora_A" "$TMP/stderr"; } || fail "--lora of another base: exit $rc: $(cat "$TMP/stderr")"

if [ $failures -ne 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "generate.sh: all checks passed"
