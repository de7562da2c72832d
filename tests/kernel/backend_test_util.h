// Helpers shared by the backend kernel tests: seeded random data, a paged KV pool builder,
// max-norm comparison, and iteration over the SIMD levels this CPU supports.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_ops.h"

namespace strata::test {

inline std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// max |a - b| / max(max |b|, floor): the relative max-norm error.
inline double max_rel_error(const float* a, const float* b, size_t n, double floor = 1e-30) {
  double diff = 0.0, mag = floor;
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i])) return INFINITY;
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    mag = std::max(mag, std::fabs(double(b[i])));
  }
  return diff / mag;
}

inline bool bitwise_equal(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// The SIMD levels to exercise: scalar up to the best this CPU has.
inline std::vector<cpu::detail::SimdLevel> simd_levels() {
  std::vector<cpu::detail::SimdLevel> out;
  for (int l = 0; l <= int(cpu::detail::detected_simd_level()); ++l) out.push_back(cpu::detail::SimdLevel(l));
  return out;
}

inline const char* level_name(cpu::detail::SimdLevel l) {
  switch (l) {
    case cpu::detail::SimdLevel::kScalar: return "scalar";
    case cpu::detail::SimdLevel::kAvx2: return "avx2";
    case cpu::detail::SimdLevel::kAvx512: return "avx512";
    case cpu::detail::SimdLevel::kAvx512Bf16: return "avx512bf16";
  }
  return "?";
}

// Restores the uncapped level when a test scope ends.
struct SimdCap {
  explicit SimdCap(cpu::detail::SimdLevel l) { cpu::detail::cap_simd_level(l); }
  ~SimdCap() { cpu::detail::cap_simd_level(cpu::detail::SimdLevel::kAvx512Bf16); }
};

// A paged KV cache for one sequence of n_pos tokens with blocks scattered in a larger pool.
struct PagedKv {
  int32_t block_size = 0;
  std::vector<float> k_pool, v_pool;  // [n_blocks_pool, block_size, n_kv_heads, head_dim(_v)]
  std::vector<int32_t> block_table;   // [ceil(n_pos / block_size)]

  PagedKv(int32_t n_pos, int32_t bs, int32_t n_kv_heads, int32_t head_dim, int32_t head_dim_v, uint64_t seed)
      : block_size(bs) {
    const int32_t n_blocks = (n_pos + bs - 1) / bs;
    const int32_t pool_blocks = n_blocks * 2 + 3;
    std::vector<int32_t> ids(pool_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::mt19937_64 rng(seed);
    std::shuffle(ids.begin(), ids.end(), rng);
    block_table.assign(ids.begin(), ids.begin() + n_blocks);
    k_pool = random_floats(size_t(pool_blocks) * bs * n_kv_heads * head_dim, seed + 1);
    v_pool = random_floats(size_t(pool_blocks) * bs * n_kv_heads * head_dim_v, seed + 2);
  }
};

}  // namespace strata::test
