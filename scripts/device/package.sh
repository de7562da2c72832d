#!/usr/bin/env bash
# Builds CUDA targets here (cuda-release preset: sm_90, static Debian libraries) and copies
# stripped binaries to a folder that `carry` sends to the GPU machine.
# Usage: scripts/device/package.sh [target...]
#   STRATA_CUDA_BUILD  build directory (default build-cuda; one per person building at once)
#   STRATA_DEVICE_BIN  destination (default .device/bin)
#   STRATA_DEVICE_XZ   also pack the destination into this .tar.xz (binaries compress ~7x;
#                      the tree plus raw binaries can pass the 64 MiB a device call carries):
#                      carry its folder and unpack there with `tar xJf FILE`
# Shared libraries the static-deps build still loads (cpp-httplib, brotli) go to DEST/lib.
# With no targets: the GPU tests, the GPU benchmark and the strata binary.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${STRATA_CUDA_BUILD:-build-cuda}
dest=${STRATA_DEVICE_BIN:-.device/bin}
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_STATIC_DEPS=ON >/dev/null
fi
if [ $# -gt 0 ]; then
  targets=("$@")
else
  targets=(gpu_kernels_test gpu_attention_test gpu_golden_test bench_cuda_llama strata)
  for f in tests/gpu/*_test.cpp; do
    t=$(basename "$f" .cpp)
    [[ " ${targets[*]} " == *" $t "* ]] || targets+=("$t")
  done
fi
cmake --build "$build" -j2 --target "${targets[@]}"
mkdir -p "$dest"
for t in "${targets[@]}"; do
  f=$(find "$build" -name "$t" -type f -perm -u+x | head -1)
  strip -o "$dest/$t" "$f"
done
mkdir -p "$dest/lib"
for t in "${targets[@]}"; do
  { ldd "$dest/$t" | awk '/=> \// {print $3}' | grep -E "libcpp-httplib|libbrotli" || true; } | xargs -r -I{} cp -L {} "$dest/lib/"
done
ls -la "$dest" "$dest/lib"
if [ -n "${STRATA_DEVICE_XZ:-}" ]; then
  mkdir -p "$(dirname "$STRATA_DEVICE_XZ")"
  # One xz stream with a dictionary spanning several binaries (-9: 64 MiB): they share most of
  # their code, so this packs ~4x smaller than the default preset.
  tar cf - "$dest" | xz -9 -T2 >"$STRATA_DEVICE_XZ"
  ls -la "$STRATA_DEVICE_XZ"
fi
