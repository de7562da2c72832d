#!/usr/bin/env bash
# Runs on the GPU machine from the repository root with the packaged binaries carried
# (scripts/device/package.sh strata gpu_hybrid_test gpu_golden_test): the GPU hybrid tests, then
# a Qwen3.5-35B-A3B-shaped hybrid with random weights drawn on the device (dummy_models.sh)
# served and driven by `strata bench serve`: batch 1 (128 in / 256 out) and 64 streams of
# 1024 in / 256 out. Logs and bench JSON go to $OUT.
set -u
out=${OUT:-/tmp/strata-hybrid-bench}
mkdir -p "$out"
bin=${STRATA_DEVICE_BIN:-.device/bin}
export STRATA_SOURCE_DIR=$PWD
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
[ -d "$bin/lib" ] && export LD_LIBRARY_PATH=$PWD/$bin/lib:$LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
for t in gpu_hybrid_test gpu_golden_test; do
  [ -x $bin/$t ] || continue
  timeout 200 $bin/$t --gtest_brief=1 >"$out/$t.log" 2>&1
  echo "$t rc=$?"; grep -E "^\[  (PASSED|FAILED)|FAILED|Failure" "$out/$t.log" | head -12
done
source scripts/device/dummy_models.sh
model=$(make_qwen35moe_dummy)
port=18091
healthy() { python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null; }
$bin/strata serve --model "$model" --device cuda --load-format dummy --gpu-memory-fraction 0.9 \
  --max-num-seqs 64 --max-batch-tokens 4096 --max-model-len 4096 --max-queued 4096 \
  --port $port --served-model-name qwen35moe-dummy >"$out/serve.log" 2>&1 &
server=$!
for _ in $(seq 1 240); do healthy && break; kill -0 $server 2>/dev/null || break; sleep 1; done
if ! healthy; then echo "server did not come up"; tail -20 "$out/serve.log"; kill $server 2>/dev/null; exit 1; fi
grep -E "serving|weight" "$out/serve.log" | head -5
url=http://127.0.0.1:$port
timeout 150 $bin/strata bench serve --url $url --num-prompts 3 --concurrency 1 --random-input-len 128 \
  --random-output-len 256 --ignore-eos --json "$out/b1.json" >"$out/b1.txt" 2>&1
echo "== batch 1 (128 in, 256 out)"; grep -E "Mean TPOT|Median TPOT|Mean TTFT|Output token|roofline|Roofline" "$out/b1.txt" | head -8
timeout 240 $bin/strata bench serve --url $url --num-prompts 64 --concurrency 64 --random-input-len 1024 \
  --random-output-len 256 --ignore-eos --json "$out/b64.json" >"$out/b64.txt" 2>&1
echo "== 64 streams (1024 in, 256 out)"; grep -E "Mean TPOT|Median TPOT|Mean TTFT|Output token|roofline|Roofline" "$out/b64.txt" | head -8
kill $server; wait $server 2>/dev/null
