// AVX-512 matmul tiles. One zmm holds one panel's 16 output columns; a register block of
// MR rows x NP panels accumulates along k with one broadcast of x per row and one weight
// load per panel. bf16 weights widen to f32 by a 16-bit shift (exact).
//
// Everything compiled for AVX-512 lives in an anonymous namespace and uses no library
// templates, so no AVX-512 copy of a shared inline function can leak into other code.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_matmul_tile.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
// GCC 12 reports the deliberately undefined pass-through operand inside its own AVX-512
// intrinsics (_mm512_undefined_epi32) as maybe-uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace strata::cpu::detail {

namespace {

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

inline __m512 load_w(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load_w(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Columns of panel P that exist (the last panel may be partial).
inline __mmask16 panel_mask(int64_t P, int64_t n) {
  const int64_t valid = n - P * kPanel;
  return valid >= kPanel ? __mmask16(0xffff) : __mmask16((1u << valid) - 1u);
}

// acc[MR][NP] over k-steps [0, kc): x rows at stride ldx, panel j at w + j * wstride.
template <int MR, int NP, typename W>
void kernel(const float* x, int64_t ldx, const W* w, int64_t wstride, int64_t kc, float* y, int64_t ldy,
            const __mmask16* masks, bool first, const float* bias) {
  __m512 acc[MR][NP];
  if (first) {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
      for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_setzero_ps();
  } else {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
      for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_maskz_loadu_ps(masks[j], y + r * ldy + j * kPanel);
  }
  for (int64_t p = 0; p < kc; ++p) {
    __m512 wv[NP];
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) wv[j] = load_w(w + j * wstride + p * kPanel);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 b = _mm512_set1_ps(x[r * ldx + p]);
#pragma GCC unroll 8
      for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_fmadd_ps(b, wv[j], acc[r][j]);
    }
  }
  if (bias != nullptr) {
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) {
      const __m512 bv = _mm512_maskz_loadu_ps(masks[j], bias + j * kPanel);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) acc[r][j] = _mm512_add_ps(acc[r][j], bv);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) _mm512_mask_storeu_ps(y + r * ldy + j * kPanel, masks[j], acc[r][j]);
}

// Panels per register block for a given row count: as many accumulators as fit in 32 zmm
// next to the weight vectors, and at least 8 independent chains to hide FMA latency.
constexpr int group_panels(int mr) { return mr == 1 ? 8 : mr == 2 ? 6 : mr <= 6 ? 4 : 3; }
constexpr int kMaxRows = 8;

template <typename W>
using KernelFn = void (*)(const float*, int64_t, const W*, int64_t, int64_t, float*, int64_t, const __mmask16*, bool,
                          const float*);

template <typename W, int MR>
KernelFn<W> pick_np(int np) {
  switch (np) {
    case 1: return &kernel<MR, 1, W>;
    case 2: return &kernel<MR, 2, W>;
    case 3: return &kernel<MR, 3, W>;
    case 4: if constexpr (group_panels(MR) >= 4) return &kernel<MR, 4, W>; break;
    case 5: if constexpr (group_panels(MR) >= 5) return &kernel<MR, 5, W>; break;
    case 6: if constexpr (group_panels(MR) >= 6) return &kernel<MR, 6, W>; break;
    case 7: if constexpr (group_panels(MR) >= 7) return &kernel<MR, 7, W>; break;
    case 8: if constexpr (group_panels(MR) >= 8) return &kernel<MR, 8, W>; break;
  }
  return nullptr;
}

template <typename W>
KernelFn<W> pick(int mr, int np) {
  switch (mr) {
    case 1: return pick_np<W, 1>(np);
    case 2: return pick_np<W, 2>(np);
    case 3: return pick_np<W, 3>(np);
    case 4: return pick_np<W, 4>(np);
    case 5: return pick_np<W, 5>(np);
    case 6: return pick_np<W, 6>(np);
    case 7: return pick_np<W, 7>(np);
    default: return pick_np<W, 8>(np);
  }
}

// Widens np bf16 panels' k-range [k0, k0 + kc) into dst [np][kc][kPanel].
void widen_panels(const uint16_t* src, int64_t k, int64_t k0, int64_t kc, int np, float* dst) {
  for (int j = 0; j < np; ++j) {
    const uint16_t* s = src + j * k * kPanel + k0 * kPanel;
    float* d = dst + j * kc * kPanel;
    for (int64_t p = 0; p < kc; ++p) _mm512_storeu_ps(d + p * kPanel, load_w(s + p * kPanel));
  }
}

template <typename W>
void tile(const MatmulTile& t) {
  const int64_t k = t.k, n = t.n;
  const int64_t rows = t.row_end - t.row_begin;
  const int mr_main = int(min64(kMaxRows, rows));
  const int npg = group_panels(mr_main);
  const W* w = static_cast<const W*>(t.w);
  const bool widen = t.scratch != nullptr && sizeof(W) == 2;
  for (int64_t k0 = 0; k0 < k; k0 += t.kc) {
    const int64_t kc = min64(t.kc, k - k0);
    const bool first = k0 == 0, last = k0 + kc == k;
    for (int64_t P = t.panel_begin; P < t.panel_end; P += npg) {
      const int np = int(min64(npg, t.panel_end - P));
      __mmask16 masks[kMaxGroupPanels];
      for (int j = 0; j < np; ++j) masks[j] = panel_mask(P + j, n);
      const float* bias = last && t.bias != nullptr ? t.bias + P * kPanel : nullptr;
      float* y0 = t.y + P * kPanel;
      if (widen) {
        widen_panels(reinterpret_cast<const uint16_t*>(w) + P * k * kPanel, k, k0, kc, np, t.scratch);
        for (int64_t r = t.row_begin; r < t.row_end; r += kMaxRows) {
          const int mr = int(min64(kMaxRows, t.row_end - r));
          pick<float>(mr, np)(t.x + r * k + k0, k, t.scratch, kc * kPanel, kc, y0 + r * n, n, masks, first, bias);
        }
      } else {
        const W* wp = w + P * k * kPanel + k0 * kPanel;
        for (int64_t r = t.row_begin; r < t.row_end; r += kMaxRows) {
          const int mr = int(min64(kMaxRows, t.row_end - r));
          pick<W>(mr, np)(t.x + r * k + k0, k, wp, k * kPanel, kc, y0 + r * n, n, masks, first, bias);
        }
      }
    }
  }
}


// ---- Quantized weights (kLayoutQuantPanel16) ----

inline __m512 codes_u8(const uint8_t* c) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c))));
}
// 16 e4m3fn codes as f32 / 256: the sign to bit 15, exponent and mantissa to bits 13..7 of f16.
inline __m512 codes_fp8(const uint8_t* c) {
  const __m256i h = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
  const __m256i bits = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7F)), 7),
                                       _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x80)), 8));
  return _mm512_cvtph_ps(bits);
}
// w = fma(q, s, b) for affine codes, q * s for fp8 (b unused).
template <WeightQuant Q>
inline __m512 deq(__m512 q, __m512 s, __m512 b) {
  if constexpr (Q == WeightQuant::kFp8) return _mm512_mul_ps(q, s);
  else return _mm512_fmadd_ps(q, s, b);
}

// The in-register path: acc[MR][NP] over inputs [0, kc) of one scale group. c: codes of panel 0
// at the group's first input (cstride bytes between panels); s, b: the group's scales and biases
// of panel 0 (sstride floats between panels).
template <int MR, int NP, WeightQuant Q>
void qkernel(const float* x, int64_t ldx, const uint8_t* c, int64_t cstride, const float* s, const float* b,
             int64_t sstride, int64_t kc, float* y, int64_t ldy, const __mmask16* masks, bool first, const float* bias) {
  __m512 acc[MR][NP];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j)
      acc[r][j] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(masks[j], y + r * ldy + j * kPanel);
  __m512 sv[NP], bv[NP];
#pragma GCC unroll 8
  for (int j = 0; j < NP; ++j) {
    sv[j] = _mm512_loadu_ps(s + j * sstride);
    bv[j] = Q == WeightQuant::kFp8 ? _mm512_setzero_ps() : _mm512_loadu_ps(b + j * sstride);
  }
  if constexpr (Q == WeightQuant::kAffine4) {
    int64_t p = 0;
    for (; p + 1 < kc; p += 2) {
      __m512 w0[NP], w1[NP];
#pragma GCC unroll 8
      for (int j = 0; j < NP; ++j) {
        const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + j * cstride + (p / 2) * kPanel)));
        w0[j] = deq<Q>(_mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(0xF))), sv[j], bv[j]);
        w1[j] = deq<Q>(_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)), sv[j], bv[j]);
      }
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m512 x0 = _mm512_set1_ps(x[r * ldx + p]);
#pragma GCC unroll 8
        for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_fmadd_ps(x0, w0[j], acc[r][j]);
        const __m512 x1 = _mm512_set1_ps(x[r * ldx + p + 1]);
#pragma GCC unroll 8
        for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_fmadd_ps(x1, w1[j], acc[r][j]);
      }
    }
    if (p < kc) {  // an odd tail: the low nibbles only
      __m512 w0[NP];
#pragma GCC unroll 8
      for (int j = 0; j < NP; ++j) {
        const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + j * cstride + (p / 2) * kPanel)));
        w0[j] = deq<Q>(_mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(0xF))), sv[j], bv[j]);
      }
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m512 x0 = _mm512_set1_ps(x[r * ldx + p]);
#pragma GCC unroll 8
        for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_fmadd_ps(x0, w0[j], acc[r][j]);
      }
    }
  } else {
    for (int64_t p = 0; p < kc; ++p) {
      __m512 wv[NP];
#pragma GCC unroll 8
      for (int j = 0; j < NP; ++j) {
        const uint8_t* cp = c + j * cstride + p * kPanel;
        wv[j] = deq<Q>(Q == WeightQuant::kFp8 ? codes_fp8(cp) : codes_u8(cp), sv[j], bv[j]);
      }
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m512 xb = _mm512_set1_ps(x[r * ldx + p]);
#pragma GCC unroll 8
        for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_fmadd_ps(xb, wv[j], acc[r][j]);
      }
    }
  }
  if (bias != nullptr) {
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) {
      const __m512 bb = _mm512_maskz_loadu_ps(masks[j], bias + j * kPanel);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) acc[r][j] = _mm512_add_ps(acc[r][j], bb);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) _mm512_mask_storeu_ps(y + r * ldy + j * kPanel, masks[j], acc[r][j]);
}

// Panels per block of the in-register path: accumulators, scales, biases and weights in 32 zmm.
constexpr int qgroup_panels(int mr) { return mr == 1 ? 6 : mr == 2 ? 4 : mr <= 5 ? 3 : 2; }

using QKernelFn = void (*)(const float*, int64_t, const uint8_t*, int64_t, const float*, const float*, int64_t, int64_t,
                           float*, int64_t, const __mmask16*, bool, const float*);

template <WeightQuant Q, int MR>
QKernelFn qpick_np(int np) {
  switch (np) {
    case 1: return &qkernel<MR, 1, Q>;
    case 2: return &qkernel<MR, 2, Q>;
    case 3: if constexpr (qgroup_panels(MR) >= 3) return &qkernel<MR, 3, Q>; break;
    case 4: if constexpr (qgroup_panels(MR) >= 4) return &qkernel<MR, 4, Q>; break;
    case 5: if constexpr (qgroup_panels(MR) >= 5) return &qkernel<MR, 5, Q>; break;
    case 6: if constexpr (qgroup_panels(MR) >= 6) return &qkernel<MR, 6, Q>; break;
  }
  return nullptr;
}

template <WeightQuant Q>
QKernelFn qpick(int mr, int np) {
  switch (mr) {
    case 1: return qpick_np<Q, 1>(np);
    case 2: return qpick_np<Q, 2>(np);
    case 3: return qpick_np<Q, 3>(np);
    case 4: return qpick_np<Q, 4>(np);
    case 5: return qpick_np<Q, 5>(np);
    case 6: return qpick_np<Q, 6>(np);
    case 7: return qpick_np<Q, 7>(np);
    default: return qpick_np<Q, 8>(np);
  }
}

// Dequantizes np panels' inputs [k0, k0 + kc) into dst [np][kc][kPanel], one scale group at a time.
template <WeightQuant Q>
void deq_panels(const MatmulTile& t, int64_t P, int64_t k0, int64_t kc, int np, float* dst) {
  const auto* codes = static_cast<const uint8_t*>(t.w);
  for (int j = 0; j < np; ++j) {
    const uint8_t* c = codes + (P + j) * t.code_stride;
    float* d = dst + j * kc * kPanel;
    for (int64_t p0 = k0; p0 < k0 + kc;) {
      const int64_t g = p0 / t.group, p1 = min64(k0 + kc, (g + 1) * t.group);
      const int64_t si = ((P + j) * t.n_groups + g) * kPanel;
      const __m512 s = _mm512_loadu_ps(t.scales + si);
      const __m512 b = Q == WeightQuant::kFp8 ? _mm512_setzero_ps() : _mm512_loadu_ps(t.biases + si);
      for (int64_t p = p0; p < p1; ++p) {
        __m512 q;
        if constexpr (Q == WeightQuant::kAffine4) {
          const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + (p / 2) * kPanel)));
          q = _mm512_cvtepi32_ps(_mm512_and_si512(p % 2 ? _mm512_srli_epi32(v, 4) : v, _mm512_set1_epi32(0xF)));
        } else if constexpr (Q == WeightQuant::kFp8) {
          q = codes_fp8(c + p * kPanel);
        } else {
          q = codes_u8(c + p * kPanel);
        }
        _mm512_storeu_ps(d + (p - k0) * kPanel, deq<Q>(q, s, b));
      }
      p0 = p1;
    }
  }
}

template <WeightQuant Q>
void qtile(const MatmulTile& t) {
  const int64_t k = t.k, n = t.n;
  const auto* codes = static_cast<const uint8_t*>(t.w);
  const int mr_main = int(min64(kMaxRows, t.row_end - t.row_begin));
  if (t.scratch == nullptr) {
    const int npg = qgroup_panels(mr_main);
    const int64_t sstride = t.n_groups * kPanel;
    for (int64_t P = t.panel_begin; P < t.panel_end; P += npg) {
      const int np = int(min64(npg, t.panel_end - P));
      __mmask16 masks[kMaxGroupPanels];
      for (int j = 0; j < np; ++j) masks[j] = panel_mask(P + j, n);
      for (int64_t g = 0; g < t.n_groups; ++g) {
        const int64_t p0 = g * t.group, kc = min64(t.group, k - p0);
        const bool last = g + 1 == t.n_groups;
        const float* bias = last && t.bias != nullptr ? t.bias + P * kPanel : nullptr;
        const uint8_t* c = codes + P * t.code_stride + (Q == WeightQuant::kAffine4 ? p0 / 2 : p0) * kPanel;
        const float* s = t.scales + (P * t.n_groups + g) * kPanel;
        const float* b = t.biases != nullptr ? t.biases + (P * t.n_groups + g) * kPanel : nullptr;
        for (int64_t r = t.row_begin; r < t.row_end; r += kMaxRows) {
          const int mr = int(min64(kMaxRows, t.row_end - r));
          qpick<Q>(mr, np)(t.x + r * k + p0, k, c, t.code_stride, s, b, sstride, kc, t.y + r * n + P * kPanel, n, masks,
                           g == 0, bias);
        }
      }
    }
    return;
  }
  const int npg = group_panels(mr_main);
  for (int64_t k0 = 0; k0 < k; k0 += t.kc) {
    const int64_t kc = min64(t.kc, k - k0);
    const bool first = k0 == 0, last = k0 + kc == k;
    for (int64_t P = t.panel_begin; P < t.panel_end; P += npg) {
      const int np = int(min64(npg, t.panel_end - P));
      __mmask16 masks[kMaxGroupPanels];
      for (int j = 0; j < np; ++j) masks[j] = panel_mask(P + j, n);
      const float* bias = last && t.bias != nullptr ? t.bias + P * kPanel : nullptr;
      deq_panels<Q>(t, P, k0, kc, np, t.scratch);
      for (int64_t r = t.row_begin; r < t.row_end; r += kMaxRows) {
        const int mr = int(min64(kMaxRows, t.row_end - r));
        pick<float>(mr, np)(t.x + r * k + k0, k, t.scratch, kc * kPanel, kc, t.y + r * n + P * kPanel, n, masks, first, bias);
      }
    }
  }
}

}  // namespace

void qmatmul_tile_avx512(const MatmulTile& t) {
  switch (t.quant) {
    case WeightQuant::kAffine8: qtile<WeightQuant::kAffine8>(t); break;
    case WeightQuant::kAffine4: qtile<WeightQuant::kAffine4>(t); break;
    case WeightQuant::kFp8: qtile<WeightQuant::kFp8>(t); break;
    case WeightQuant::kNone: break;
  }
}

void matmul_tile_avx512(const MatmulTile& t) {
  if (t.w_dtype == DType::kBF16)
    tile<uint16_t>(t);
  else
    tile<float>(t);
}

}  // namespace strata::cpu::detail

#pragma GCC pop_options
