#!/usr/bin/env bash
# One device call that checks and measures everything: every packaged GPU test, the
# Llama-8B-shaped decode/prefill/batch benchmark with transformers on the same shapes, the
# KV-tier TTFT benchmark, the cost of --deterministic, the KV codec benchmarks (attention alone,
# and full-model decode per codec), and 256
# concurrent streams through `strata bench serve` (bf16 KV, then fp8 KV by default and at write). Each part logs under $OUT/<part>/; a
# summary line per part goes to stdout.
# Usage: bash scripts/device/run_all.sh   (STRATA_DEVICE_BIN: the packaged binaries;
#   STRATA_RUN_PARTS=gpu: only the GPU tests and the decode/prefill benchmark, =rest: the others,
#   for binaries that travel in two calls)
set -u
root=${OUT:-/tmp/strata-all}
bin=${STRATA_DEVICE_BIN:-.device/bin}
status=0
part() {  # part NAME COMMAND...: runs COMMAND with OUT=$root/NAME
  local name=$1; shift
  mkdir -p "$root/$name"
  local t0=$(date +%s)
  OUT=$root/$name "$@" >"$root/$name/stdout.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s"
  [ $rc -eq 0 ] || status=1
}
export STRATA_SOURCE_DIR=$PWD
parts=${STRATA_RUN_PARTS:-all}
if [ "$parts" != rest ]; then
part gpu env STRATA_GPU_TESTS_SKIP="gpu_engine_test gpu_kv_transfer_test" bash scripts/device/run_gpu.sh 128 3
grep -E "rc=|PASSED|FAILED|ratio|tok/s" "$root/gpu/stdout.log" | head -80
fi
[ "$parts" = gpu ] && exit $status
part tier bash scripts/device/run_tier_bench.sh 32768 3
tail -30 "$root/tier/stdout.log"
part deterministic bash -c "LD_LIBRARY_PATH=$bin/lib:/usr/local/cuda/lib64:\${LD_LIBRARY_PATH:-} timeout 240 $bin/bench_cuda_llama 128 3 deterministic"
tail -20 "$root/deterministic/stdout.log"
if [ -x "$bin/bench_kv_codec" ]; then
  part codec bash -c "LD_LIBRARY_PATH=$bin/lib:/usr/local/cuda/lib64:\${LD_LIBRARY_PATH:-} timeout 300 $bin/bench_kv_codec"
  tail -25 "$root/codec/stdout.log"
fi
if [ -x "$bin/bench_kv_codec_decode" ]; then
  part codec_decode bash -c "LD_LIBRARY_PATH=$bin/lib:/usr/local/cuda/lib64:\${LD_LIBRARY_PATH:-} timeout 300 $bin/bench_kv_codec_decode"
  tail -28 "$root/codec_decode/stdout.log"
fi
part serve env STRATA_PROFILE_STEPS=1 bash scripts/device/run_serve_bench.sh 256 1024 1024 256
tail -30 "$root/serve/stdout.log"
# fp8 KV through the server: the default (--kv-quant-start auto: full blocks in fp8, the block
# being written exact) and every row in fp8 at write.
for q in auto 0; do
  part serve_fp8_$q env STRATA_SKIP_TESTS=1 STRATA_BENCH_TIMEOUT=200 STRATA_SERVE_ARGS="--kv-cache-dtype fp8 --kv-quant-start $q" \
    bash scripts/device/run_serve_bench.sh 256 512 512 256
  grep -E "CUDA engine|Output token throughput|Median TTFT|Median TPOT" "$root/serve_fp8_$q/stdout.log"
done
exit $status
