#!/usr/bin/env bash
# Runs on the GPU machine from the repository root with the packaged binaries carried
# (scripts/device/package.sh strata gpu_engine_overlap_test ...): the GPU tests given in
# STRATA_TESTS, then what the durable-state features cost a served run. A Llama-3.1-8B-shaped
# model with random weights (`--load-format dummy`), N streams of IN random tokens and OUT
# output tokens (EOS ignored), plain and with a host KV tier, a disk KV tier and checkpoints
# every 32 tokens (and each part alone); then a Qwen3.5-MoE-shaped hybrid, 64 x (1024 in, 256 out), with
# overlapped steps on and off. After each run the server's /metrics (steps, overlapped steps,
# checkpoints and their blocks, disk tier counts) and the server log's tail go to $OUT/NAME.txt.
# Usage: bash scripts/device/run_durable_bench.sh [N] [IN] [OUT]
#   STRATA_DEVICE_BIN  the packaged binaries (default .device/bin)
#   STRATA_TESTS       GPU test binaries to run first (default: none)
#   STRATA_CASES       which runs (default all): plain tiers records durable durable_shm hybrid (tiers: the
#                      KV tiers without checkpoints; records: checkpoints without a disk KV tier;
#                      durable_shm: durable with the disk tier on tmpfs)
set -u
out=${OUT:-/tmp/strata-durable-bench}
mkdir -p "$out"
bin=${STRATA_DEVICE_BIN:-.device/bin}
source scripts/device/serve_common.sh
device_libs "$bin"
n=${1:-256}
in_len=${2:-1024}
out_len=${3:-512}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
df -h /tmp | tee -a "$out/gpu.txt"
for t in ${STRATA_TESTS:-}; do
  timeout 300 $bin/$t --gtest_brief=1 >"$out/$t.log" 2>&1
  echo "$t rc=$?"
  grep -E "^\[  (PASSED|FAILED)|FAILED|Failure|durable:" "$out/$t.log" | head -20
done

metrics() {  # PORT FILE
  python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$1/metrics', timeout=10).read().decode())" >"$2" 2>&1
}

run_case() {  # NAME MODEL SERVED N IN OUT MAXSEQS ARGS...
  local name=$1 model=$2 served=$3 num=$4 il=$5 ol=$6 seqs=$7
  shift 7
  local port=18100
  start_server $port "$out/$name.serve.log" --model "$model" --device cuda --load-format dummy --gpu-memory-fraction 0.85 \
    --max-num-seqs "$seqs" --max-batch-tokens 4096 --max-model-len $((il + ol + 64)) --max-queued 4096 \
    --served-model-name "$served" "$@"
  timeout 120 $bin/strata bench serve --url http://127.0.0.1:$port --num-prompts 16 --max-concurrency 16 \
    --random-input-len 128 --random-output-len 32 --ignore-eos --peak-bandwidth-gbs 1 --peak-tflops 1 >/dev/null 2>&1
  timeout 400 $bin/strata bench serve --url http://127.0.0.1:$port --num-prompts "$num" --max-concurrency "$num" \
    --random-input-len "$il" --random-output-len "$ol" --ignore-eos >"$out/$name.txt" 2>&1
  echo "== $name rc=$? ($*)"
  grep -E "Successful|Failed|Output token throughput|Mean TPOT|Mean TTFT|Roofline output|Fraction of roofline" "$out/$name.txt" | head -8
  sleep 2  # the checkpoint writer and the disk tier catch up with the last tokens
  metrics $port "$out/$name.metrics"
  grep -E "^strata_(engine_steps|engine_overlapped_steps|checkpoints_total|checkpoint_max_gap|checkpoint_blocks_total|kv_disk_(written|dropped)_blocks)" \
    "$out/$name.metrics" | sed 's/{[^}]*model_name="[^"]*",*/{/' | tee -a "$out/$name.txt"
  kill -TERM $server 2>/dev/null
  wait $server 2>/dev/null
  # One file per case comes back: the bench, the metrics above, the server log's lines.
  grep -vE "request id=" "$out/$name.serve.log" | tail -40 >>"$out/$name.txt"
  rm -f "$out/$name.serve.log" "$out/$name.metrics"
}

want() { [ -z "${STRATA_CASES:-}" ] || [[ " $STRATA_CASES " == *" $1 "* ]]; }
source scripts/device/llama8b_dummy.sh
llama=$(make_llama8b_dummy)
want plain && run_case plain "$llama" llama8b-dummy "$n" "$in_len" "$out_len" "$n"
rm -rf /tmp/strata-kvdisk /tmp/strata-ckpt
if want tiers; then
  run_case tiers "$llama" llama8b-dummy "$n" "$in_len" "$out_len" "$n" \
    --kv-host-bytes 17179869184 --kv-disk-dir /tmp/strata-kvdisk --kv-disk-bytes 34359738368
  rm -rf /tmp/strata-kvdisk
fi
if want records; then  # checkpoints without a disk KV tier: the records alone, no blocks
  run_case records "$llama" llama8b-dummy "$n" "$in_len" "$out_len" "$n" --checkpoint-every 32 --checkpoint-dir /tmp/strata-ckpt
  rm -rf /tmp/strata-ckpt
fi
if want durable; then
  run_case durable "$llama" llama8b-dummy "$n" "$in_len" "$out_len" "$n" \
    --kv-host-bytes 17179869184 --kv-disk-dir /tmp/strata-kvdisk --kv-disk-bytes 34359738368 --checkpoint-every 32
  du -sh /tmp/strata-kvdisk 2>/dev/null
  rm -rf /tmp/strata-kvdisk
fi
if want durable_shm; then  # the disk tier in memory (tmpfs): what the disk's I/O costs
  mkdir -p /dev/shm/strata-kvdisk
  run_case durable_shm "$llama" llama8b-dummy "$n" "$in_len" "$out_len" "$n" \
    --kv-host-bytes 17179869184 --kv-disk-dir /dev/shm/strata-kvdisk --kv-disk-bytes 25769803776 --checkpoint-every 32
  rm -rf /dev/shm/strata-kvdisk
fi
if want hybrid; then
  source scripts/device/dummy_models.sh
  hybrid=$(make_qwen35moe_dummy)
  run_case hybrid_overlap "$hybrid" qwen35moe-dummy 64 1024 256 64
  run_case hybrid_single "$hybrid" qwen35moe-dummy 64 1024 256 64 --no-async-scheduling
fi
