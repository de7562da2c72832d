#!/usr/bin/env bash
# --deterministic: accepted by generate and serve and named in their help; on --device cpu (whose
# kernels are batch-invariant always) it changes nothing: the golden greedy ids still come out.
# Usage: deterministic_flag.sh <strata-binary> <tests/data dir>
set -u
BIN="$1"
DATA="$2"
MODELS="$DATA/reference/models"
LOGITS="$DATA/reference/logits.json"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

golden() {  # golden <model> <case> <field> [sep]: the field's ids
  python3 -c "import json,sys; c=json.load(open('$LOGITS'))['$1']['cases'][$2]['$3']; print(('${4:-}' or ' ').join(map(str,c)))"
}

for sub in generate serve; do
  "$BIN" "$sub" --help >"$TMP/help" 2>&1 || fail "$sub --help: exit $?"
  grep -q -- "--deterministic" "$TMP/help" || fail "$sub --help does not name --deterministic"
done

prompt="$(golden llama3-tiny 3 prompt_ids ,)"
want="$(golden llama3-tiny 3 greedy_ids)"
for flags in "--deterministic" ""; do
  # shellcheck disable=SC2086
  got="$("$BIN" generate --device cpu $flags --model "$MODELS/llama3-tiny" --prompt-ids "$prompt" --max-tokens 32 \
         --temperature 0 --output ids --ignore-eos --threads 2 2>"$TMP/stderr")"
  rc=$?
  [ $rc -eq 0 ] || fail "generate --device cpu $flags: exit $rc: $(cat "$TMP/stderr")"
  [ "$got" = "$want" ] || fail "generate --device cpu $flags: got '$got' want '$want'"
done

if [ $failures -ne 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "deterministic_flag: all checks passed"
