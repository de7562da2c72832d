#!/usr/bin/env bash
# Builds the CUDA tests and benchmarks here (cuda-release preset: sm_90, static Debian
# libraries) and copies stripped binaries to .device/bin, the folder `carry` sends to the GPU
# machine. Usage: scripts/device/package.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake --preset cuda-release >/dev/null
targets=(gpu_kernels_test gpu_attention_test gpu_golden_test bench_cuda_llama)
cmake --build build-cuda -j2 --target "${targets[@]}"
mkdir -p .device/bin
for t in "${targets[@]}"; do
  f=$(find build-cuda -name "$t" -type f -perm -u+x | head -1)
  strip -o ".device/bin/$t" "$f"
done
ls -la .device/bin
