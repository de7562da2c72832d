#!/usr/bin/env bash
# Runs on the GPU machine from the repository root with the packaged binaries carried
# (scripts/device/package.sh strata gpu_moe_test): gpu_moe_test, then a Qwen3-30B-A3B-shaped
# model with random weights drawn on the device (48 layers, hidden 2048, 128 experts, top 8,
# moe_intermediate 768, 32/4 heads, the qwen3 tokenizer) served and driven by `strata bench
# serve`: decode at batch 1, 64 streams, and a 4096-token prefill, once per grouped-GEMM path
# (STRATA_MOE_GEMM=tiled forces the tiled kernel; unset, decode takes the grouped GEMV).
# Logs and bench JSON go to $OUT.
set -u
out=${OUT:-/tmp/strata-moe-bench}
mkdir -p "$out"
bin=${STRATA_DEVICE_BIN:-.device/bin}
export STRATA_SOURCE_DIR=$PWD
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
[ -d "$bin/lib" ] && export LD_LIBRARY_PATH=$PWD/$bin/lib:$LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
timeout 300 $bin/gpu_moe_test --gtest_brief=1 >"$out/gpu_moe_test.log" 2>&1
echo "gpu_moe_test rc=$?"
grep -E "^\[  (PASSED|FAILED)|Failure|Expected|Which is|path" "$out/gpu_moe_test.log" | head -30

model=$(mktemp -d /tmp/qwen3moe-dummy-XXXXXX)
cat >"$model/config.json" <<'JSON'
{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
 "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
 "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": true, "decoder_sparse_step": 1,
 "mlp_only_layers": [], "vocab_size": 151936, "tie_word_embeddings": false, "rope_theta": 1000000.0,
 "max_position_embeddings": 40960, "rms_norm_eps": 1e-06, "hidden_act": "silu", "attention_bias": false,
 "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16"}
JSON
xz -dc tests/data/reference/tokenizers/qwen3/tokenizer.json.xz >"$model/tokenizer.json"
cp tests/data/reference/tokenizers/qwen3/tokenizer_config.json "$model/"

port=18090
healthy() { python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null; }
for path in gemv tiled; do
  if [ "$path" = tiled ]; then export STRATA_MOE_GEMM=tiled; else unset STRATA_MOE_GEMM; fi
  $bin/strata serve --model "$model" --device cuda --load-format dummy --gpu-memory-fraction 0.85 \
    --max-num-seqs 64 --max-batch-tokens 4096 --max-model-len 5200 --max-queued 4096 \
    --port $port --served-model-name qwen3moe-dummy >"$out/serve_$path.log" 2>&1 &
  server=$!
  for _ in $(seq 1 180); do healthy && break; kill -0 $server 2>/dev/null || break; sleep 1; done
  if ! healthy; then echo "server did not come up ($path)"; tail -20 "$out/serve_$path.log"; kill $server 2>/dev/null; continue; fi
  grep -E "serving" "$out/serve_$path.log"
  url=http://127.0.0.1:$port
  timeout 200 $bin/strata bench serve --url $url --num-prompts 4 --concurrency 1 --random-input-len 128 \
    --random-output-len 256 --ignore-eos --json "$out/b1_$path.json" >"$out/b1_$path.txt" 2>&1
  echo "== $path batch 1 (128 in, 256 out)"; grep -E "Mean TPOT|Median TPOT|Mean TTFT|Output token|Fraction of roofline|Roofline:" "$out/b1_$path.txt" | head -8
  timeout 240 $bin/strata bench serve --url $url --num-prompts 64 --concurrency 64 --random-input-len 1024 \
    --random-output-len 256 --ignore-eos --json "$out/b64_$path.json" >"$out/b64_$path.txt" 2>&1
  echo "== $path 64 streams (1024 in, 256 out)"; grep -E "Mean TPOT|Median TPOT|Mean TTFT|Output token|Fraction of roofline|Roofline:" "$out/b64_$path.txt" | head -8
  timeout 120 $bin/strata bench serve --url $url --num-prompts 3 --concurrency 1 --random-input-len 4096 \
    --random-output-len 1 --json "$out/p4k_$path.json" >"$out/p4k_$path.txt" 2>&1
  echo "== $path prefill 4096"; grep -E "Mean TTFT|Median TTFT" "$out/p4k_$path.txt" | head -4
  kill $server; wait $server 2>/dev/null
done
