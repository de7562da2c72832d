#!/usr/bin/env bash
# Runs on the GPU machine from the repository root with the packaged binaries carried
# (scripts/device/package.sh strata gpu_fp8_test gpu_quant_test bench_cuda_llama ...): the FP8
# kernels' parity tests, the FP8 checkpoints against their oracle, the bf16 tests the shared
# GEMV touches, then bench_cuda_llama's bf16-against-FP8 comparison on the Llama-3.1-8B shape.
# Logs go to $OUT.
#   STRATA_DEVICE_BIN  the packaged binaries (default .device/bin)
#   STRATA_FP8_TESTS   the test binaries to run (default below)
set -u
out=${OUT:-/tmp/strata-fp8}
mkdir -p "$out"
bin=${STRATA_DEVICE_BIN:-.device/bin}
export STRATA_SOURCE_DIR=$PWD
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
[ -d "$bin/lib" ] && export LD_LIBRARY_PATH=$PWD/$bin/lib:$LD_LIBRARY_PATH
status=0
for t in ${STRATA_FP8_TESTS:-gpu_fp8_test gpu_quant_test gpu_decode_fusion_test gpu_golden_test gpu_kernels_test}; do
  [ -x "$bin/$t" ] || continue
  timeout 300 "$bin/$t" --gtest_brief=1 >"$out/$t.log" 2>&1
  rc=$?
  grep -E "^\[  (PASSED|FAILED)|Failure|Expected|Which is|layout|max-norm|outside|seed" "$out/$t.log" | head -60
  echo "$t rc=$rc"
  [ $rc -eq 0 ] || status=1
done
if [ -x "$bin/bench_cuda_llama" ]; then
  timeout 300 "$bin/bench_cuda_llama" "${STRATA_FP8_DECODE_STEPS:-64}" 3 fp8 >"$out/bench_fp8.log" 2>&1
  echo "bench_cuda_llama fp8 rc=$?"
  cat "$out/bench_fp8.log"
fi
exit $status
