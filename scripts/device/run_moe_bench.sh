#!/usr/bin/env bash
# Runs on the GPU machine from the repository root with the packaged binaries carried
# (scripts/device/package.sh strata gpu_moe_test bench_moe_gemm): gpu_moe_test, bench_moe_gemm
# (the expert GEMMs of one layer per path), then a Qwen3-30B-A3B-shaped model with random
# weights drawn on the device (48 layers, hidden 2048, 128 experts, top 8, moe_intermediate 768,
# 32/4 heads, the qwen3 tokenizer) served and driven by `strata bench serve`, once per
# grouped-GEMM setting in MOE_BENCH_PATHS (default "mma simt"): mma is the default dispatch
# (GEMV up to 32 tokens, tensor cores above), simt sets STRATA_MOE_GEMM=simt (the CUDA-core
# dispatch before the tensor-core kernel: GEMV up to 256 tokens, else tiled), tiled
# STRATA_MOE_GEMM=tiled.
# Workloads: prefill of 1024, 4096 and 16384 tokens (TTFT), 64 streams of 1024 in / 256 out,
# and on the default dispatch batch 1 (128 in / 256 out). Logs and bench JSON go to $OUT.
set -u
out=${OUT:-/tmp/strata-moe-bench}
mkdir -p "$out"
bin=${STRATA_DEVICE_BIN:-.device/bin}
export STRATA_SOURCE_DIR=$PWD
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
[ -d "$bin/lib" ] && export LD_LIBRARY_PATH=$PWD/$bin/lib:$LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
if [ -x $bin/gpu_moe_test ]; then
  timeout 300 $bin/gpu_moe_test --gtest_brief=1 >"$out/gpu_moe_test.log" 2>&1
  echo "gpu_moe_test rc=$?"
  grep -E "^\[  (PASSED|FAILED)|Failure|Expected|Which is|path|seed" "$out/gpu_moe_test.log" | head -30
fi
if [ -x $bin/bench_moe_gemm ]; then
  echo "== bench_moe_gemm (Qwen3-30B-A3B experts)"
  timeout 240 $bin/bench_moe_gemm 128 8 2048 768 48 16,32,64,128,256,1024,4096,16384 | tee "$out/bench_moe_gemm.txt"
  echo "== bench_moe_gemm (256 experts of 512, top 8, hidden 2048, 40 layers)"
  timeout 120 $bin/bench_moe_gemm 256 8 2048 512 40 4096,16384 | tee -a "$out/bench_moe_gemm.txt"
fi
[ "${MOE_BENCH_SERVE:-1}" = 1 ] || exit 0

source scripts/device/dummy_models.sh
model=$(make_qwen3moe_dummy)

port=18090
healthy() { python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null; }
for path in ${MOE_BENCH_PATHS:-mma simt}; do
  if [ "$path" = mma ]; then unset STRATA_MOE_GEMM; else export STRATA_MOE_GEMM=$path; fi
  $bin/strata serve --model "$model" --device cuda --load-format dummy --gpu-memory-fraction 0.85 \
    --max-num-seqs 64 --max-batch-tokens 4096 --max-model-len 17000 --max-queued 4096 \
    --port $port --served-model-name qwen3moe-dummy >"$out/serve_$path.log" 2>&1 &
  server=$!
  for _ in $(seq 1 180); do healthy && break; kill -0 $server 2>/dev/null || break; sleep 1; done
  if ! healthy; then echo "server did not come up ($path)"; tail -20 "$out/serve_$path.log"; kill $server 2>/dev/null; continue; fi
  grep -E "serving" "$out/serve_$path.log"
  url=http://127.0.0.1:$port
  for len in 1024 4096 16384; do
    timeout 120 $bin/strata bench serve --url $url --num-prompts 3 --concurrency 1 --random-input-len $len \
      --random-output-len 1 --json "$out/p${len}_$path.json" >"$out/p${len}_$path.txt" 2>&1
    echo "== $path prefill $len"; grep -E "Mean TTFT|Median TTFT" "$out/p${len}_$path.txt" | head -4
  done
  timeout 240 $bin/strata bench serve --url $url --num-prompts 64 --concurrency 64 --random-input-len 1024 \
    --random-output-len 256 --ignore-eos --json "$out/b64_$path.json" >"$out/b64_$path.txt" 2>&1
  echo "== $path 64 streams (1024 in, 256 out)"; grep -E "Mean TPOT|Median TPOT|Mean TTFT|Output token|Fraction of roofline|Roofline:" "$out/b64_$path.txt" | head -8
  if [ "$path" = mma ]; then
    timeout 200 $bin/strata bench serve --url $url --num-prompts 4 --concurrency 1 --random-input-len 128 \
      --random-output-len 256 --ignore-eos --json "$out/b1_$path.json" >"$out/b1_$path.txt" 2>&1
    echo "== $path batch 1 (128 in, 256 out)"; grep -E "Mean TPOT|Median TPOT|Mean TTFT|Output token|Fraction of roofline|Roofline:" "$out/b1_$path.txt" | head -8
  fi
  kill $server; wait $server 2>/dev/null
done
