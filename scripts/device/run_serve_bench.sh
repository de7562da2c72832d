#!/usr/bin/env bash
# Runs on the GPU machine from the repository root with the packaged binaries carried
# (scripts/device/package.sh strata gpu_engine_test ...): the engine's GPU test, then a serving
# benchmark of a Llama-3.1-8B-shaped model with random weights drawn on the device
# (`strata serve --device cuda --load-format dummy`, the llama3 tokenizer from
# tests/data/reference) driven by `strata bench serve`. Logs and the bench JSON go to $OUT.
# Usage: bash scripts/device/run_serve_bench.sh [num_prompts] [input_len] [output_len] [concurrency]
#   STRATA_DEVICE_BIN  the packaged binaries (default .device/bin)
#   STRATA_SKIP_TESTS=1 skips gpu_engine_test; STRATA_PROFILE_STEPS=1 logs where step time goes
#   STRATA_SERVE_ARGS  extra `strata serve` flags (e.g. --no-async-scheduling)
#   STRATA_TEST_TIMEOUT, STRATA_BENCH_TIMEOUT  seconds for the test and the main bench (180, 420)
set -u
out=${OUT:-/tmp/strata-serve-bench}
mkdir -p "$out"
bin=${STRATA_DEVICE_BIN:-.device/bin}
source scripts/device/serve_common.sh
device_libs "$bin"
n=${1:-256}
in_len=${2:-1024}
out_len=${3:-1024}
conc=${4:-256}
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv | tee "$out/gpu.txt"
status=0
if [ "${STRATA_SKIP_TESTS:-0}" != 1 ]; then
  timeout "${STRATA_TEST_TIMEOUT:-180}" $bin/gpu_engine_test --gtest_brief=1 >"$out/gpu_engine_test.log" 2>&1
  rc=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED)|Failure|Expected|Which is|outside|seed|failed" "$out/gpu_engine_test.log" | head -40
  echo "gpu_engine_test rc=$rc"
  [ $rc -eq 0 ] || status=1
fi

# A Llama-3.1-8B-shaped config with the llama3 tokenizer.
source scripts/device/llama8b_dummy.sh
model=$(make_llama8b_dummy)

port=18080
max_len=$((in_len + out_len + 64))
start_server $port "$out/serve.log" --model "$model" --device cuda --load-format dummy --gpu-memory-fraction 0.85 \
  --max-num-seqs "$conc" --max-batch-tokens 4096 --max-model-len "$max_len" --max-queued 4096 \
  --served-model-name llama8b-dummy ${STRATA_SERVE_ARGS:-}
grep -E "CUDA engine|serving" "$out/serve.log"
# A short warm-up (captures the small decode graphs, loads the GEMM plans), then the run.
timeout 120 $bin/strata bench serve --url http://127.0.0.1:$port --num-prompts 16 --max-concurrency 16 \
  --random-input-len 128 --random-output-len 32 --ignore-eos --peak-bandwidth-gbs 1 --peak-tflops 1 >"$out/warmup.log" 2>&1
echo "warmup rc=$?"
timeout "${STRATA_BENCH_TIMEOUT:-420}" $bin/strata bench serve --url http://127.0.0.1:$port --num-prompts "$n" --max-concurrency "$conc" \
  --random-input-len "$in_len" --random-output-len "$out_len" --ignore-eos --json "$out/bench.json" 2>&1 | tee "$out/bench.log"
rc=${PIPESTATUS[0]}
echo "bench rc=$rc"
[ $rc -eq 0 ] || status=1
kill -TERM $server 2>/dev/null
wait $server 2>/dev/null
grep -E "CUDA steps|error|failed" "$out/serve.log" | tail -30
exit $status
