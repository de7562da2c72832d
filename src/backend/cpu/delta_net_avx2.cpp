// AVX2 + FMA instantiation of the gated delta rule kernels in delta_net_body.inc.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/delta_net_internal.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma")

namespace strata::cpu::detail {
namespace {

struct Vec {
  using T = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kRows = 4;  // GEMM tile: 4 rows x 2 vectors = 8 accumulators of 16
  static T zero() { return _mm256_setzero_ps(); }
  static T set1(float v) { return _mm256_set1_ps(v); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T fmadd(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
};

#include "backend/cpu/delta_net_body.inc"

}  // namespace

const DeltaRuleKernels& delta_rule_kernels_avx2() {
  static const DeltaRuleKernels k = {&recurrent_head_impl, &chunked_head_impl};
  return k;
}

}  // namespace strata::cpu::detail

#pragma GCC pop_options
