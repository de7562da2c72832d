#!/usr/bin/env bash
# strata tokenize: ids of text with and without special tokens, chat rendering, errors.
# Usage: tokenize.sh <strata-binary> <tests/data dir>
set -u
STRATA="$1"
DATA="$2"
ROOT="$(cd "$DATA/../.." && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
fail=0

check() {  # name, expected, actual
  if [ "$2" != "$3" ]; then
    echo "FAIL $1: expected [$2] got [$3]" >&2
    fail=1
  else
    echo "ok   $1"
  fi
}

unpack() {  # name -> $TMP/name
  mkdir -p "$TMP/$1"
  xz -dc "$DATA/reference/tokenizers/$1/tokenizer.json.xz" > "$TMP/$1/tokenizer.json" || { echo "FAIL xz $1" >&2; exit 1; }
  cp "$DATA/reference/tokenizers/$1/tokenizer_config.json" "$TMP/$1/"
}
unpack qwen3
unpack gemma3

check "qwen3 ids" "9707 1879" "$("$STRATA" tokenize --tokenizer "$TMP/qwen3" "Hello world")"
check "gemma3 adds bos" "2 9259 1902" "$("$STRATA" tokenize --tokenizer "$TMP/gemma3" "Hello world")"
check "gemma3 --no-special" "9259 1902" "$("$STRATA" tokenize --tokenizer "$TMP/gemma3" --no-special "Hello world")"
check "gemma3 special in text" "105 2364 107 2202 106" \
  "$("$STRATA" tokenize --tokenizer "$TMP/gemma3" --no-special $'<start_of_turn>user\nhi<end_of_turn>')"
check "one line" "1" "$("$STRATA" tokenize --tokenizer "$TMP/qwen3" "a b c" | wc -l | tr -d ' ')"

# Chat through the strata-demo template: exact bytes, no newline added.
DEMO="$ROOT/models/strata-demo"
printf '[{"role": "user", "content": "Hi"}]' > "$TMP/messages.json"
"$STRATA" tokenize --tokenizer "$DEMO" --chat "$TMP/messages.json" --add-generation-prompt > "$TMP/out.txt"
printf '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n' > "$TMP/want.txt"
if cmp -s "$TMP/out.txt" "$TMP/want.txt"; then echo "ok   demo chat"; else echo "FAIL demo chat: $(od -c "$TMP/out.txt" | head)" >&2; fail=1; fi
"$STRATA" tokenize --tokenizer "$DEMO" --chat "$TMP/messages.json" > "$TMP/out2.txt"
printf '<|im_start|>user\nHi<|im_end|>\n' > "$TMP/want2.txt"
if cmp -s "$TMP/out2.txt" "$TMP/want2.txt"; then echo "ok   demo chat without generation prompt"; else echo "FAIL demo chat 2" >&2; fail=1; fi

# Every qwen3 chat case of the oracle (needs python3 to take the JSON apart).
if command -v python3 > /dev/null; then
  python3 - "$DATA/reference/tokenizer_cases.json" "$TMP" <<'PY'
import json, sys
cases = json.load(open(sys.argv[1]))["qwen3"]["chat"]
for i, c in enumerate(cases):
    json.dump(c["messages"], open(f"{sys.argv[2]}/chat{i}.json", "w"))
    json.dump(c.get("kwargs", {}), open(f"{sys.argv[2]}/kwargs{i}.json", "w"))
    open(f"{sys.argv[2]}/agp{i}", "w").write("1" if c["add_generation_prompt"] else "0")
    if "error" in c:
        open(f"{sys.argv[2]}/error{i}", "w").write("1")
    else:
        open(f"{sys.argv[2]}/want_chat{i}.txt", "w", newline="").write(c["text"])
PY
  for f in "$TMP"/chat*.json; do
    i="${f##*/chat}"; i="${i%.json}"
    flag=""; [ "$(cat "$TMP/agp$i")" = "1" ] && flag="--add-generation-prompt"
    if "$STRATA" tokenize --tokenizer "$TMP/qwen3" --chat "$f" $flag --kwargs "@$TMP/kwargs$i.json" > "$TMP/got$i.txt" 2> "$TMP/err$i.txt"; then
      if [ -f "$TMP/error$i" ]; then echo "FAIL qwen3 chat $i: the template should raise" >&2; fail=1
      elif cmp -s "$TMP/got$i.txt" "$TMP/want_chat$i.txt"; then echo "ok   qwen3 chat $i"
      else echo "FAIL qwen3 chat $i differs" >&2; fail=1; fi
    else
      if [ -f "$TMP/error$i" ]; then echo "ok   qwen3 chat $i raises"
      else echo "FAIL qwen3 chat $i: $(cat "$TMP/err$i.txt")" >&2; fail=1; fi
    fi
  done
fi

# Errors: a clear message on stderr and a non-zero exit.
expect_error() {  # name, pattern, command...
  local name="$1" pattern="$2"; shift 2
  if "$@" > "$TMP/stdout" 2> "$TMP/stderr"; then
    echo "FAIL $name: exit status 0" >&2; fail=1
  elif ! grep -q "$pattern" "$TMP/stderr"; then
    echo "FAIL $name: stderr lacks [$pattern]: $(cat "$TMP/stderr")" >&2; fail=1
  else
    echo "ok   $name"
  fi
}
expect_error "missing dir" "tokenizer.json" "$STRATA" tokenize --tokenizer "$TMP/nowhere" "hi"
expect_error "invalid utf-8" "byte offset 2" "$STRATA" tokenize --tokenizer "$TMP/qwen3" $'ab\xff'
expect_error "missing messages" "cannot open" "$STRATA" tokenize --tokenizer "$DEMO" --chat "$TMP/none.json"
printf '{"role": ' > "$TMP/bad.json"
expect_error "bad messages json" "invalid JSON" "$STRATA" tokenize --tokenizer "$DEMO" --chat "$TMP/bad.json"
expect_error "bad kwargs" "kwargs" "$STRATA" tokenize --tokenizer "$DEMO" --chat "$TMP/messages.json" --kwargs "[1"
expect_error "no template" "chat template" "$STRATA" tokenize --tokenizer "$TMP/gemma3" --chat "$TMP/messages.json" --template nope

exit $fail
