#!/usr/bin/env bash
# Runs on the GPU machine from the repository root with the packaged binaries carried
# (scripts/device/package.sh strata ...): structured output's cost on the device. A
# Llama-3.1-8B-shaped model with random weights drawn on the device (`strata serve --device
# cuda --load-format dummy`, the llama3 tokenizer from tests/data/reference) serves `strata
# bench serve` in rounds, in alternation: the requests without a schema, then every request
# under a JSON schema whose outputs run to max_tokens: an array of strings without maxItems
# ("strings"; a random-weight model closes some arrays early), and the same with minItems 300
# ("strings300": at most one item a token, so no output of 256 tokens can close it). The
# summary, the bench JSONs and the server's grammar metrics go to $OUT, the logs into
# $OUT/logs.tar.xz.
# Usage: bash scripts/device/run_grammar_bench.sh [num_prompts] [input_len] [output_len] [concurrency] [rounds]
#   STRATA_DEVICE_BIN  the packaged binaries (default .device/bin)
#   STRATA_SERVE_ARGS  extra `strata serve` flags
set -u
out=${OUT:-/tmp/strata-grammar-bench}
mkdir -p "$out"
bin=${STRATA_DEVICE_BIN:-.device/bin}
source scripts/device/serve_common.sh
device_libs "$bin"
n=${1:-192}
in_len=${2:-1024}
out_len=${3:-256}
conc=${4:-64}
rounds=${5:-2}
source scripts/device/llama8b_dummy.sh
model=$(make_llama8b_dummy)
port=18081
start_server $port "$out/serve.log" --model "$model" --device cuda --load-format dummy --gpu-memory-fraction 0.85 \
  --max-num-seqs "$conc" --max-batch-tokens 4096 --max-model-len $((in_len + out_len + 64)) --max-queued 4096 \
  --served-model-name llama8b-dummy ${STRATA_SERVE_ARGS:-}
schema='{"response_format": {"type": "json_schema", "json_schema": {"name": "strings", "schema": {"type": "array", "items": {"type": "string"}}}}}'
schema300='{"response_format": {"type": "json_schema", "json_schema": {"name": "strings300", "schema": {"type": "array", "items": {"type": "string"}, "minItems": 300}}}}'
mkdir -p "$out/logs"
seed=10
bench() {  # name, extra args...: new random prompts each run (no prefix-cache hits between runs)
  local name=$1
  shift
  seed=$((seed + 1))
  timeout 300 $bin/strata bench serve --url http://127.0.0.1:$port --num-prompts "$n" --max-concurrency "$conc" \
    --random-input-len "$in_len" --random-output-len "$out_len" --ignore-eos --seed $seed --json "$out/logs/$name.json" "$@" \
    >"$out/logs/$name.log" 2>&1
  echo "$name rc=$?"
}
# Warm-up of every kind at the measured shapes (decode graphs, GEMM plans, the schemas'
# compiled grammars and masks).
for body in '{}' "$schema" "$schema300"; do
  timeout 120 $bin/strata bench serve --url http://127.0.0.1:$port --num-prompts "$conc" --max-concurrency "$conc" \
    --random-input-len "$in_len" --random-output-len 32 --ignore-eos --seed 3 --extra-body "$body" >>"$out/logs/warmup.log" 2>&1
done
echo "warmups done"
for r in $(seq 1 "$rounds"); do
  bench "plain_$r"
  bench "strings_$r" --extra-body "$schema"
  bench "strings300_$r" --extra-body "$schema300"
done
curl -s http://127.0.0.1:$port/metrics | grep -E "strata_grammar|strata_fill|overlapped" >"$out/metrics.txt" 2>/dev/null
# One schema request's text, to show what the outputs are.
curl -s http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' \
  -d '{"model": "llama8b-dummy", "prompt": "List some words:", "max_tokens": 64, "temperature": 0, "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "array", "items": {"type": "string"}}}}}' \
  >"$out/logs/sample.json"
kill -TERM $server 2>/dev/null
wait $server 2>/dev/null
python3 - "$out" "$rounds" <<'PY' | tee "$out/summary.txt"
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
for r in range(1, rounds + 1):
    p = json.load(open(f"{out}/logs/plain_{r}.json"))
    line = (f"round {r}: plain {p['output_throughput']:.1f} tok/s ({p['total_output_tokens']} tokens, "
            f"TPOT median {p['tpot_ms']['median']:.2f} ms)")
    for name in ("strings", "strings300"):
        s = json.load(open(f"{out}/logs/{name}_{r}.json"))
        line += (f"; {name} {s['output_throughput']:.1f} tok/s ({s['total_output_tokens']} tokens, TPOT median "
                 f"{s['tpot_ms']['median']:.2f} ms): {s['output_throughput'] / p['output_throughput']:.3f} of plain")
    print(line)
PY
mv "$out/serve.log" "$out/logs/"
grep -E "error|failed" "$out/logs/serve.log" | tail -10
grep -E "overlapped steps" "$out/logs/serve.log" | tail -4
tar cJf "$out/logs.tar.xz" -C "$out" logs && rm -rf "$out/logs"
