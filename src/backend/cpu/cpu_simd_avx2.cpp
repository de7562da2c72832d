// AVX2 + FMA instantiation of the kernels in cpu_simd_body.inc.
#include <immintrin.h>
#include <math.h>

#include <cstdint>

#include "backend/cpu/cpu_simd_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma")

namespace strata::cpu::detail {
namespace {

// 8 f32 lanes; partial loads and stores through lane masks.
struct Vec {
  using T = __m256;
  static constexpr int kLanes = 8;
  static __m256i mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static T zero() { return _mm256_setzero_ps(); }
  static T set1(float v) { return _mm256_set1_ps(v); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static T load_n(const float* p, int n) { return _mm256_maskload_ps(p, mask(n)); }
  static void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static void store_n(float* p, T v, int n) { _mm256_maskstore_ps(p, mask(n), v); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T div(T a, T b) { return _mm256_div_ps(a, b); }
  static T fmadd(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T fnmadd(T a, T b, T c) { return _mm256_fnmadd_ps(a, b, c); }
  static T max(T a, T b) { return _mm256_max_ps(a, b); }
  static T min(T a, T b) { return _mm256_min_ps(a, b); }
  static T round(T a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static T pow2(T n) {
    const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
  }
  static float reduce_add(T v) {
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 e = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(e, _mm_movehdup_ps(e)));
  }
  // out[i] = sum of the lanes of a_i, four at once (its own fixed tree).
  static void reduce4(T a0, T a1, T a2, T a3, float* out) {
    const T s01 = _mm256_add_ps(_mm256_unpacklo_ps(a0, a1), _mm256_unpackhi_ps(a0, a1));
    const T s23 = _mm256_add_ps(_mm256_unpacklo_ps(a2, a3), _mm256_unpackhi_ps(a2, a3));
    const T t = _mm256_add_ps(_mm256_shuffle_ps(s01, s23, 0x44), _mm256_shuffle_ps(s01, s23, 0xee));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
  }
  static float reduce_max(T v) {
    const __m128 q = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 e = _mm_max_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_max_ss(e, _mm_movehdup_ps(e)));
  }
};

#include "backend/cpu/cpu_simd_body.inc"

}  // namespace

const SimdKernels& simd_kernels_avx2() {
  static const SimdKernels k = {&rms_norm_impl, &gated_act_impl, &add_impl, &mul_impl, &act_only_impl, &softmax_impl,
                                    &rope_token_impl, &attention_query_impl,
                                    &attention_part_impl, &attention_merge_impl, &attention_tile_impl};
  return k;
}

}  // namespace strata::cpu::detail

#pragma GCC pop_options
