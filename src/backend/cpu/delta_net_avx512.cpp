// AVX-512 instantiation of the gated delta rule kernels in delta_net_body.inc.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/delta_net_internal.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace strata::cpu::detail {
namespace {

struct Vec {
  using T = __m512;
  static constexpr int kLanes = 16;
  static constexpr int kRows = 6;  // GEMM tile: 6 rows x 2 vectors = 12 accumulators of 32
  static T zero() { return _mm512_setzero_ps(); }
  static T set1(float v) { return _mm512_set1_ps(v); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T fmadd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
};

#include "backend/cpu/delta_net_body.inc"

}  // namespace

const DeltaRuleKernels& delta_rule_kernels_avx512() {
  static const DeltaRuleKernels k = {&recurrent_head_impl, &chunked_head_impl};
  return k;
}

}  // namespace strata::cpu::detail

#pragma GCC pop_options
