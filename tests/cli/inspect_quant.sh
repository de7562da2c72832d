#!/usr/bin/env bash
# strata inspect on a quantized checkpoint: the format, bits and block, the parameter count of
# the logical matrices and the weight bytes one decoded token reads.
# Usage: inspect_quant.sh <strata-binary> <tests/data dir>
set -u
BIN="$1"
DATA="$2"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

"$BIN" inspect --model "$DATA/reference/fp8/qwen3-small-fp8" >"$TMP/out" 2>"$TMP/err" || fail "inspect: $(cat "$TMP/err")"
grep -q "^quantization: *fp8 e4m3 8-bit, block 128x128$" "$TMP/out" || fail "format: $(cat "$TMP/out")"
# The header holds 1,572,864 float8 weights (1 byte), 96 f32 block scales (384 bytes) and
# 132,608 bf16 values (265,216 bytes: the tied 512 x 256 embedding and the norms). A token
# reads everything once (the tied head reads the whole table) plus one embedding row (512
# bytes): 1,838,976 bytes as stored. The CPU keeps the float8 codes (1,572,864 bytes, every row
# count a multiple of the 16-row panel) with one f32 scale per row and 128-column group
# (768x256 x4, 128x256 x4, 256x256 x4: 2 groups a row; 256x768 x2: 6; 12,288 scales, 49,152
# bytes), the bf16 table (262,144 + the 512-byte row) and the 1,536 norm values as f32 (6,144):
# 1,890,816. Dequantized, the float8 weights are f32 (6,291,456 bytes) and the scales are gone:
# 6,557,184.
grep -q "^weight_bytes/token: 1838976 as stored, 1890816 as held on the CPU (quantized), 6557184 dequantized to f32$" "$TMP/out" ||
  fail "bytes per token: $(cat "$TMP/out")"
grep -q "^parameters: *1705472 (1705568 stored elements)$" "$TMP/out" || fail "parameters: $(cat "$TMP/out")"

"$BIN" inspect --model "$DATA/reference/models/qwen3-tiny" >"$TMP/out" 2>"$TMP/err" || fail "inspect: $(cat "$TMP/err")"
grep -q "^quantization: *none$" "$TMP/out" || fail "unquantized format: $(cat "$TMP/out")"

[ "$failures" -eq 0 ] || exit 1
echo "inspect_quant: ok"
