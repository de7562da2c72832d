#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, with .device/bin carried (see package.sh):
# the GPU tests, then the Llama-8B-shaped benchmark and transformers on the same shapes
# (STRATA_SKIP_HF=1 skips it). Logs go to $OUT (or /tmp/strata-gpu).
# Usage: bash scripts/device/run_gpu.sh [decode_steps] [prefill_reps]
#   STRATA_GPU_TESTS_SKIP  space-separated test names not to run here
set -u
out=${OUT:-/tmp/strata-gpu}
mkdir -p "$out"
export STRATA_SOURCE_DIR=$PWD
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
bin=${STRATA_DEVICE_BIN:-.device/bin}
if ldd $bin/bench_cuda_llama | grep -q "not found"; then
  extra=$(dirname "$(find / -name 'libcublasLt.so.13' 2>/dev/null | head -1)")
  export LD_LIBRARY_PATH=$extra:$LD_LIBRARY_PATH
fi
ldd $bin/bench_cuda_llama | grep -E "cuda|cublas|not found"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
status=0
# Every packaged GPU test; the engine and KV-transfer tests run here unless the serving and
# tier scripts run them (STRATA_GPU_TESTS_SKIP lists names to leave out).
for f in $bin/gpu_*_test; do
  t=$(basename "$f")
  if [[ " ${STRATA_GPU_TESTS_SKIP:-} " == *" $t "* ]]; then continue; fi
  timeout 300 $bin/$t --gtest_brief=1 >"$out/$t.log" 2>&1
  rc=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED)|Failure|error|Expected|Which is|actual|seed|failed" "$out/$t.log" | head -40
  echo "$t rc=$rc"
  [ $rc -eq 0 ] || status=1
done
timeout 400 $bin/bench_cuda_llama "${1:-128}" "${2:-3}" 2>&1 | tee "$out/bench.log"
echo "bench rc=${PIPESTATUS[0]}"
# Hugging Face transformers on the same shapes (installed on the GPU machine), same run.
if [ "${STRATA_SKIP_HF:-0}" != 1 ]; then
  PYTHONUNBUFFERED=1 timeout 300 python3 bench/cuda/hf_prefill.py "${2:-3}" 2>&1 | grep -v Warning | tee "$out/hf.log"
  echo "hf rc=${PIPESTATUS[0]}"
fi
exit $status
