// AVX-512 instantiation of the kernels in cpu_simd_body.inc.
#include <immintrin.h>
#include <math.h>

#include <cstdint>

#include "backend/cpu/cpu_simd_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")
// GCC 12 reports the deliberately undefined pass-through operands inside its own AVX-512
// intrinsics (_mm512_undefined_*) as uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace strata::cpu::detail {
namespace {

// 16 f32 lanes; partial loads and stores through masks.
struct Vec {
  using T = __m512;
  static constexpr int kLanes = 16;
  static __mmask16 mask(int n) { return __mmask16((1u << n) - 1u); }
  static T zero() { return _mm512_setzero_ps(); }
  static T set1(float v) { return _mm512_set1_ps(v); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static T load_n(const float* p, int n) { return _mm512_maskz_loadu_ps(mask(n), p); }
  static void store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static void store_n(float* p, T v, int n) { _mm512_mask_storeu_ps(p, mask(n), v); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T div(T a, T b) { return _mm512_div_ps(a, b); }
  static T fmadd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T fnmadd(T a, T b, T c) { return _mm512_fnmadd_ps(a, b, c); }
  static T max(T a, T b) { return _mm512_max_ps(a, b); }
  static T min(T a, T b) { return _mm512_min_ps(a, b); }
  static T round(T a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // 2^n for integral n in [-126, 127] held as float.
  static T pow2(T n) {
    const __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
  }
  static float reduce_add(T v) {
    // Fixed tree: halves, then quarters, ... (the same sequence on every call).
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    const __m128 e = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(e, _mm_movehdup_ps(e)));
  }
  static float reduce_max(T v) { return _mm512_reduce_max_ps(v); }
  // out[i] = sum of the lanes of a_i, four at once (its own fixed tree).
  static void reduce4(T a0, T a1, T a2, T a3, float* out) {
    const T s01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
    const T s23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
    const T t = _mm512_add_ps(_mm512_shuffle_ps(s01, s23, 0x44), _mm512_shuffle_ps(s01, s23, 0xee));
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(t), _mm512_extractf32x8_ps(t, 1));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
  }
};

#include "backend/cpu/cpu_simd_body.inc"

}  // namespace

const SimdKernels& simd_kernels_avx512() {
  static const SimdKernels k = {&rms_norm_impl, &gated_act_impl, &add_impl, &mul_impl, &act_only_impl, &softmax_impl,
                                    &rope_token_impl, &attention_query_impl,
                                    &attention_part_impl, &attention_merge_impl, &attention_tile_impl};
  return k;
}

}  // namespace strata::cpu::detail

#pragma GCC pop_options
