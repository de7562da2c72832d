#include <algorithm>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_ops.h"

namespace strata::cpu {

namespace detail {

namespace {

SimdLevel detect() {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl");
  if (avx512 && __builtin_cpu_supports("avx512bf16")) return SimdLevel::kAvx512Bf16;
  if (avx512) return SimdLevel::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return SimdLevel::kAvx2;
  return SimdLevel::kScalar;
}

SimdLevel g_cap = SimdLevel::kAvx512Bf16;

}  // namespace

SimdLevel detected_simd_level() {
  static const SimdLevel level = detect();
  return level;
}

SimdLevel simd_level() { return std::min(detected_simd_level(), g_cap); }

void cap_simd_level(SimdLevel level) { g_cap = level; }

}  // namespace detail

const char* simd_level_name() {
  switch (detail::simd_level()) {
    case detail::SimdLevel::kAvx512Bf16: return "avx512bf16";
    case detail::SimdLevel::kAvx512: return "avx512";
    case detail::SimdLevel::kAvx2: return "avx2";
    case detail::SimdLevel::kScalar: return "scalar";
  }
  return "scalar";
}

}  // namespace strata::cpu
