#!/usr/bin/env bash
# Two strata binaries in one benchmark run on the GPU machine (from the repository root): the
# same served workloads through `strata bench serve`, each binary's server started once per
# model and every workload repeated, the binaries taking turns per model. For changes that must
# not cost speed: compare the slower binary's best repeat with the other's.
#   Llama-3.1-8B shape: decode at batch 1 (128 in, 256 out), a 4096-token prefill (TTFT), and
#   256 streams x (1024 in, 128 out) (output tok/s);
#   Qwen3-30B-A3B shape: decode at batch 1, a 4096-token prefill.
# Usage: bash scripts/device/run_ab_bench.sh BIN_A BIN_B [repeats]   (binaries' folders, each
#   with strata and lib/); logs under $OUT/<name>_<bin>/, one summary line per metric on stdout.
set -u
out=${OUT:-/tmp/strata-ab-bench}
mkdir -p "$out"
bins=("$1" "$2")
reps=${3:-3}
export STRATA_SOURCE_DIR=$PWD
base_ld=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
source scripts/device/llama8b_dummy.sh
source scripts/device/dummy_models.sh
llama=$(make_llama8b_dummy)
moe=$(make_qwen3moe_dummy)
port=18100
healthy() { python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null; }
# metric FILE KEY: the number after "KEY" in a bench serve report.
metric() { grep -E "^$2" "$1" | head -1 | grep -oE "[0-9]+(\.[0-9]+)?" | tail -1; }

run_model() {  # run_model NAME MODEL_DIR SEQS MAXLEN BIN_INDEX
  local name=$1 model=$2 seqs=$3 max_len=$4 i=$5
  local bin=${bins[$i]} dir="$out/${1}_$i"
  mkdir -p "$dir"
  LD_LIBRARY_PATH=$PWD/$bin/lib:$base_ld $bin/strata serve --model "$model" --device cuda --load-format dummy \
    --gpu-memory-fraction 0.85 --max-num-seqs "$seqs" --max-batch-tokens 4096 --max-model-len "$max_len" \
    --max-queued 4096 --port $port --served-model-name dummy >"$dir/serve.log" 2>&1 &
  local server=$!
  for _ in $(seq 1 180); do healthy && break; kill -0 $server 2>/dev/null || break; sleep 1; done
  if ! healthy; then echo "$name $bin: server did not come up"; tail -5 "$dir/serve.log"; kill $server 2>/dev/null; return; fi
  local url=http://127.0.0.1:$port
  local bench="env LD_LIBRARY_PATH=$PWD/$bin/lib:$base_ld $bin/strata bench serve --url $url"
  timeout 120 $bench --num-prompts 8 --concurrency 8 --random-input-len 128 --random-output-len 32 --ignore-eos >"$dir/warmup.txt" 2>&1
  for r in $(seq 1 "$reps"); do
    # A fresh seed per repeat: the prompts are new, so no repeat is a prefix-cache hit.
    timeout 120 $bench --seed $((100 + r)) --num-prompts 2 --concurrency 1 --random-input-len 128 --random-output-len 256 \
      --ignore-eos >"$dir/b1_$r.txt" 2>&1
    echo "$name decode_b1_tpot_ms $i $(metric "$dir/b1_$r.txt" 'Median TPOT')" >>"$out/metrics.txt"
    timeout 120 $bench --seed $((200 + r)) --num-prompts 2 --concurrency 1 --random-input-len 4096 --random-output-len 1 \
      >"$dir/p4k_$r.txt" 2>&1
    echo "$name prefill4k_ttft_ms $i $(metric "$dir/p4k_$r.txt" 'Median TTFT')" >>"$out/metrics.txt"
    if [ "$seqs" -ge 256 ]; then
      timeout 240 $bench --seed $((300 + r)) --num-prompts 256 --concurrency 256 --random-input-len 1024 \
        --random-output-len 128 --ignore-eos >"$dir/s256_$r.txt" 2>&1
      echo "$name streams256_out_tok_s $i $(metric "$dir/s256_$r.txt" 'Output token throughput')" >>"$out/metrics.txt"
    fi
  done
  kill $server; wait $server 2>/dev/null
}

: >"$out/metrics.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for i in 0 1; do run_model llama8b "$llama" 256 4200 $i; done
for i in 0 1; do run_model qwen3moe "$moe" 16 4200 $i; done
# Per metric and binary: the repeats, their best and their median.
python3 - "$out/metrics.txt" "${bins[0]}" "${bins[1]}" <<'PY'
import sys, collections, statistics
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    p = line.split()
    if len(p) == 4:
        rows[(p[0], p[1], int(p[2]))].append(float(p[3]))
for (model, m, i) in sorted(rows):
    v = rows[(model, m, i)]
    best = max(v) if "tok_s" in m else min(v)
    print(f"{model} {m} {sys.argv[2 + i]}: runs {v} best {best} median {statistics.median(v)}")
PY
