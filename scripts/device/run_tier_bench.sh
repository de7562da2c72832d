#!/usr/bin/env bash
# Runs on the GPU machine from the repository root with the packaged binaries carried
# (scripts/device/package.sh strata gpu_kv_transfer_test): the batched KV block move test
# (gpu_kv_transfer_test), then bench/kv_tier_bench.py against `strata serve --device cuda
# --load-format dummy` with a Llama-3.1-8B-shaped model (random weights drawn on the device,
# the llama3 tokenizer from tests/data/reference) and a 32k-token prompt: TTFT cold, from the
# host tier, and from the disk tier after a restart, against the targets. Logs and the bench
# JSON go to $OUT. Prints one PASS/FAIL line per part and exits non-zero on a FAIL.
# Usage: bash scripts/device/run_tier_bench.sh [prompt_tokens] [rounds]
#   STRATA_DEVICE_BIN     the packaged binaries (default .device/bin), with lib/ holding the
#                         shared libraries the binaries need beyond CUDA (libcpp-httplib, brotli)
#   STRATA_TIER_WORK_DIR  where the disk tier lives (default /tmp: the machine's local disk)
#   STRATA_SKIP_TESTS=1   skips gpu_kv_transfer_test
#   STRATA_TIER_SETTLE_S  seconds between each restart and its disk hit (default 0)
#   STRATA_TEST_TIMEOUT, STRATA_BENCH_TIMEOUT  seconds for the test and the bench (120, 300)
#   STRATA_TIER_LOGS      also keep the servers' logs in this folder
set -u
out=${OUT:-/tmp/strata-tier-bench}
mkdir -p "$out"
bin=$(cd "${STRATA_DEVICE_BIN:-.device/bin}" && pwd)
export STRATA_SOURCE_DIR=$PWD
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
# Shared libraries the static-deps build still needs (cpp-httplib, brotli), when packaged.
[ -d "$bin/lib" ] && export LD_LIBRARY_PATH=$bin/lib:$LD_LIBRARY_PATH
if ldd "$bin/strata" | grep -q "not found"; then
  extra=$(dirname "$(find / -name 'libcublasLt.so.13' 2>/dev/null | head -1)")
  export LD_LIBRARY_PATH=$extra:$LD_LIBRARY_PATH
fi
prompt=${1:-32768}
rounds=${2:-1}
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv | tee "$out/gpu.txt"
status=0
if [ "${STRATA_SKIP_TESTS:-0}" != 1 ]; then
  timeout "${STRATA_TEST_TIMEOUT:-120}" "$bin/gpu_kv_transfer_test" >"$out/gpu_kv_transfer_test.log" 2>&1
  rc=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED)|^\[ +(OK|FAILED) +\]|Failure|Expected|Which is|KV transfer" "$out/gpu_kv_transfer_test.log" | head -40
  if [ $rc -eq 0 ] && ! grep -q "SKIPPED" "$out/gpu_kv_transfer_test.log"; then echo "PASS gpu_kv_transfer_test"
  else echo "FAIL gpu_kv_transfer_test rc=$rc (a skip means no CUDA device)"; status=1; fi
fi

# A Llama-3.1-8B-shaped config with the llama3 tokenizer; STRATA_TIER_MODEL=gemma3 a
# Gemma-3-4B-shaped sliding-window model (window blocks in tiers of their own), qwen35moe a
# Qwen3.5-35B-A3B-shaped hybrid (state snapshots in the disk tier; its hit ends at the last
# --state-snapshot-interval point before the prompt's last token).
source scripts/device/llama8b_dummy.sh
source scripts/device/dummy_models.sh
hit_slack=16
case "${STRATA_TIER_MODEL:-llama8b}" in
  llama8b) model=$(make_llama8b_dummy) ;;
  gemma3) model=$(make_gemma3_4b_dummy) ;;
  qwen35moe) model=$(make_qwen35moe_dummy); hit_slack=512 ;;
  *) echo "STRATA_TIER_MODEL must be llama8b, gemma3 or qwen35moe, got '$STRATA_TIER_MODEL'"; exit 2 ;;
esac

# KV of one 32k prompt: 32768 x 128 KiB = 4 GiB. The bench sizes the device pool itself
# (--kv-cache-bytes, 1.5 prompts); the host tier holds two prompts, the disk tier several, and
# shutdown gets the time to write the pool's blocks to disk.
kv_prompt=$((prompt * 131072))
work=${STRATA_TIER_WORK_DIR:-/tmp}
df -h "$work" | tail -1
serve_args="--device cuda --load-format dummy --max-model-len $((prompt + 256)) --max-batch-tokens 8192 \
--max-num-seqs 4 --kv-disk-bytes $((kv_prompt * 4)) --kv-flush-timeout 120"
timeout "${STRATA_BENCH_TIMEOUT:-300}" python3 bench/kv_tier_bench.py --strata "$bin/strata" --model "$model" \
  --prompt-tokens "$prompt" --rounds "$rounds" --kv-host-bytes $((kv_prompt * 2 + (256 << 20))) \
  --serve-args "$serve_args" --work-dir "$work" --probe-bytes $((1 << 30)) --start-timeout 300 --timeout 300 \
  --settle-s "${STRATA_TIER_SETTLE_S:-0}" --json "$out/kv_tier_bench.json" ${STRATA_TIER_LOGS:+--log-dir "$STRATA_TIER_LOGS"} 2>&1 | tee "$out/kv_tier_bench.log"
rc=${PIPESTATUS[0]}
# The bench ran and each hit came from its tier: cached tokens cover the prompt's full blocks.
python3 - "$out/kv_tier_bench.json" "$prompt" "$rc" "$hit_slack" <<'PY'
import json, sys
path, prompt, rc, slack = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
try:
    res = json.load(open(path))
except Exception as e:
    print(f"FAIL kv_tier_bench: no results (rc={rc}, {e})")
    sys.exit(1)
ok = rc == 0 and bool(res["rounds"])
full = prompt // 16 * 16
for r in res["rounds"]:
    hits = r["cached_host"] >= full - slack and r["cached_disk"] >= full - slack and r["cached_cold"] == 0
    ok = ok and hits
    print(f"{'PASS' if hits else 'FAIL'} round {r['round']} tier hits: cached cold {r['cached_cold']}, "
          f"host {r['cached_host']}, disk {r['cached_disk']} of {prompt} prompt tokens")
    print(f"TARGET host hit TTFT {r['host_s'] * 1e3:.1f} ms / cold {r['cold_s'] * 1e3:.1f} ms = "
          f"{r['host_ratio']:.3f} (<= 0.10: {'met' if r['host_ratio'] <= 0.10 else 'NOT met'})")
    print(f"TARGET disk hit TTFT {r['disk_s'] * 1e3:.1f} ms / bound {r['disk_bound_s'] * 1e3:.1f} ms = "
          f"{r['disk_ratio']:.2f} (<= 1: {'met' if r['disk_ratio'] <= 1.0 else 'NOT met'})")
print(("PASS" if ok else "FAIL") + f" kv_tier_bench rc={rc}")
sys.exit(0 if ok else 1)
PY
[ $? -eq 0 ] || status=1
rm -rf "$model"
exit $status
