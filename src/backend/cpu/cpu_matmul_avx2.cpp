// AVX2 + FMA matmul tiles: the AVX-512 scheme with each 16-column panel held in two ymm.
// Same per-element fma order as every other level. Kept free of library templates (see
// cpu_matmul_avx512.cpp for why).
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_matmul_tile.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace strata::cpu::detail {

namespace {

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

inline __m256 load_w(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load_w(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Lane masks for the two halves of panel P (all ones where the column exists).
struct PanelMask {
  __m256i half[2];
  bool full;
};

inline PanelMask panel_mask(int64_t P, int64_t n) {
  const int64_t valid = n - P * kPanel;
  PanelMask m;
  m.full = valid >= kPanel;
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  m.half[0] = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(valid)), lane);
  m.half[1] = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(valid - 8)), lane);
  return m;
}

inline __m256 load_y(const float* p, const PanelMask& m, int h) {
  return m.full ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, m.half[h]);
}
inline void store_y(float* p, const PanelMask& m, int h, __m256 v) {
  if (m.full)
    _mm256_storeu_ps(p, v);
  else
    _mm256_maskstore_ps(p, m.half[h], v);
}

template <int MR, int NP, typename W>
void kernel(const float* x, int64_t ldx, const W* w, int64_t wstride, int64_t kc, float* y, int64_t ldy,
            const PanelMask* masks, bool first, const float* bias) {
  __m256 acc[MR][NP][2];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j)
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h)
        acc[r][j][h] = first ? _mm256_setzero_ps() : load_y(y + r * ldy + j * kPanel + h * 8, masks[j], h);
  for (int64_t p = 0; p < kc; ++p) {
    __m256 wv[NP][2];
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) {
      wv[j][0] = load_w(w + j * wstride + p * kPanel);
      wv[j][1] = load_w(w + j * wstride + p * kPanel + 8);
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 b = _mm256_broadcast_ss(x + r * ldx + p);
#pragma GCC unroll 8
      for (int j = 0; j < NP; ++j) {
        acc[r][j][0] = _mm256_fmadd_ps(b, wv[j][0], acc[r][j][0]);
        acc[r][j][1] = _mm256_fmadd_ps(b, wv[j][1], acc[r][j][1]);
      }
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NP; ++j) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256 bv = bias != nullptr ? load_y(bias + j * kPanel + h * 8, masks[j], h) : _mm256_setzero_ps();
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m256 v = bias != nullptr ? _mm256_add_ps(acc[r][j][h], bv) : acc[r][j][h];
        store_y(y + r * ldy + j * kPanel + h * 8, masks[j], h, v);
      }
    }
  }
}

// 16 ymm: up to 12 accumulators next to the weight vectors.
constexpr int group_panels(int mr) { return mr == 1 ? 4 : mr == 2 ? 3 : mr == 3 ? 2 : 1; }
constexpr int kMaxRows = 6;

template <typename W>
using KernelFn = void (*)(const float*, int64_t, const W*, int64_t, int64_t, float*, int64_t, const PanelMask*, bool,
                          const float*);

template <typename W, int MR>
KernelFn<W> pick_np(int np) {
  switch (np) {
    case 1: return &kernel<MR, 1, W>;
    case 2: if constexpr (group_panels(MR) >= 2) return &kernel<MR, 2, W>; break;
    case 3: if constexpr (group_panels(MR) >= 3) return &kernel<MR, 3, W>; break;
    case 4: if constexpr (group_panels(MR) >= 4) return &kernel<MR, 4, W>; break;
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
    default: return pick_np<W, 6>(np);
  }
}

void widen_panels(const uint16_t* src, int64_t k, int64_t k0, int64_t kc, int np, float* dst) {
  for (int j = 0; j < np; ++j) {
    const uint16_t* s = src + j * k * kPanel + k0 * kPanel;
    float* d = dst + j * kc * kPanel;
    for (int64_t p = 0; p < kc * kPanel; p += 8) _mm256_storeu_ps(d + p, load_w(s + p));
  }
}

template <typename W>
void tile(const MatmulTile& t) {
  const int64_t k = t.k, n = t.n;
  const int mr_main = int(min64(kMaxRows, t.row_end - t.row_begin));
  const int npg = group_panels(mr_main);
  const W* w = static_cast<const W*>(t.w);
  const bool widen = t.scratch != nullptr && sizeof(W) == 2;
  for (int64_t k0 = 0; k0 < k; k0 += t.kc) {
    const int64_t kc = min64(t.kc, k - k0);
    const bool first = k0 == 0, last = k0 + kc == k;
    for (int64_t P = t.panel_begin; P < t.panel_end; P += npg) {
      const int np = int(min64(npg, t.panel_end - P));
      PanelMask masks[4];
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


// ---- Quantized weights (kLayoutQuantPanel16): each 16-lane panel as two halves of 8 ----

inline __m256i u8x8(const uint8_t* c) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c))); }
inline __m256 codes_u8(const uint8_t* c) { return _mm256_cvtepi32_ps(u8x8(c)); }
// 8 e4m3fn codes as f32 / 256 (see cpu_internal.h).
inline __m256 codes_fp8(const uint8_t* c) {
  const __m128i h = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c)));
  const __m128i bits = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7F)), 7),
                                    _mm_slli_epi16(_mm_and_si128(h, _mm_set1_epi16(0x80)), 8));
  return _mm256_cvtph_ps(bits);
}
template <WeightQuant Q>
inline __m256 deq(__m256 q, const float* s, const float* b) {
  if constexpr (Q == WeightQuant::kFp8) return _mm256_mul_ps(q, _mm256_loadu_ps(s));
  else return _mm256_fmadd_ps(q, _mm256_loadu_ps(s), _mm256_loadu_ps(b));
}
// Half h (lanes 8h..8h+7) of panel codes c at input p, dequantized with scales s / biases b of the half.
template <WeightQuant Q>
inline __m256 qload(const uint8_t* c, int64_t p, int h, const float* s, const float* b) {
  if constexpr (Q == WeightQuant::kAffine4) {
    const __m256i v = u8x8(c + (p / 2) * kPanel + h * 8);
    const __m256i q = _mm256_and_si256(p % 2 ? _mm256_srli_epi32(v, 4) : v, _mm256_set1_epi32(0xF));
    return deq<Q>(_mm256_cvtepi32_ps(q), s, b);
  } else if constexpr (Q == WeightQuant::kFp8) {
    return deq<Q>(codes_fp8(c + p * kPanel + h * 8), s, b);
  } else {
    return deq<Q>(codes_u8(c + p * kPanel + h * 8), s, b);
  }
}

// The in-register path over inputs [0, kc) of one scale group (see cpu_matmul_avx512.cpp).
template <int MR, int NP, WeightQuant Q>
void qkernel(const float* x, int64_t ldx, const uint8_t* c, int64_t cstride, const float* s, const float* b,
             int64_t sstride, int64_t kc, float* y, int64_t ldy, const PanelMask* masks, bool first, const float* bias) {
  __m256 acc[MR][NP][2];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j)
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h)
        acc[r][j][h] = first ? _mm256_setzero_ps() : load_y(y + r * ldy + j * kPanel + h * 8, masks[j], h);
  for (int64_t p = 0; p < kc; ++p) {
    __m256 wv[NP][2];
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j)
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h)
        wv[j][h] = qload<Q>(c + j * cstride, p, h, s + j * sstride + h * 8, b == nullptr ? nullptr : b + j * sstride + h * 8);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 xb = _mm256_broadcast_ss(x + r * ldx + p);
#pragma GCC unroll 8
      for (int j = 0; j < NP; ++j) {
        acc[r][j][0] = _mm256_fmadd_ps(xb, wv[j][0], acc[r][j][0]);
        acc[r][j][1] = _mm256_fmadd_ps(xb, wv[j][1], acc[r][j][1]);
      }
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NP; ++j) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256 bv = bias != nullptr ? load_y(bias + j * kPanel + h * 8, masks[j], h) : _mm256_setzero_ps();
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m256 v = bias != nullptr ? _mm256_add_ps(acc[r][j][h], bv) : acc[r][j][h];
        store_y(y + r * ldy + j * kPanel + h * 8, masks[j], h, v);
      }
    }
  }
}

using QKernelFn = void (*)(const float*, int64_t, const uint8_t*, int64_t, const float*, const float*, int64_t, int64_t,
                           float*, int64_t, const PanelMask*, bool, const float*);

template <WeightQuant Q, int MR>
QKernelFn qpick_np(int np) {
  switch (np) {
    case 1: return &qkernel<MR, 1, Q>;
    case 2: if constexpr (group_panels(MR) >= 2) return &qkernel<MR, 2, Q>; break;
    case 3: if constexpr (group_panels(MR) >= 3) return &qkernel<MR, 3, Q>; break;
    case 4: if constexpr (group_panels(MR) >= 4) return &qkernel<MR, 4, Q>; break;
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
    default: return qpick_np<Q, 6>(np);
  }
}

template <WeightQuant Q>
void deq_panels(const MatmulTile& t, int64_t P, int64_t k0, int64_t kc, int np, float* dst) {
  const auto* codes = static_cast<const uint8_t*>(t.w);
  for (int j = 0; j < np; ++j) {
    const uint8_t* c = codes + (P + j) * t.code_stride;
    float* d = dst + j * kc * kPanel;
    for (int64_t p0 = k0; p0 < k0 + kc;) {
      const int64_t g = p0 / t.group, p1 = min64(k0 + kc, (g + 1) * t.group);
      const int64_t si = ((P + j) * t.n_groups + g) * kPanel;
      const float* s = t.scales + si;
      const float* b = t.biases != nullptr ? t.biases + si : nullptr;
      for (int64_t p = p0; p < p1; ++p)
        for (int h = 0; h < 2; ++h)
          _mm256_storeu_ps(d + (p - k0) * kPanel + h * 8, qload<Q>(c, p, h, s + h * 8, b == nullptr ? nullptr : b + h * 8));
      p0 = p1;
    }
  }
}

template <WeightQuant Q>
void qtile(const MatmulTile& t) {
  const int64_t k = t.k, n = t.n;
  const auto* codes = static_cast<const uint8_t*>(t.w);
  const int mr_main = int(min64(kMaxRows, t.row_end - t.row_begin));
  const int npg = group_panels(mr_main);
  if (t.scratch == nullptr) {
    const int64_t sstride = t.n_groups * kPanel;
    for (int64_t P = t.panel_begin; P < t.panel_end; P += npg) {
      const int np = int(min64(npg, t.panel_end - P));
      PanelMask masks[4];
      for (int j = 0; j < np; ++j) masks[j] = panel_mask(P + j, n);
      for (int64_t g = 0; g < t.n_groups; ++g) {
        const int64_t p0 = g * t.group, kc = min64(t.group, k - p0);
        const float* bias = g + 1 == t.n_groups && t.bias != nullptr ? t.bias + P * kPanel : nullptr;
        const float* s = t.scales + (P * t.n_groups + g) * kPanel;
        const float* b = t.biases != nullptr ? t.biases + (P * t.n_groups + g) * kPanel : nullptr;
        const uint8_t* c = codes + P * t.code_stride + (Q == WeightQuant::kAffine4 ? p0 / 2 : p0) * kPanel;
        for (int64_t r = t.row_begin; r < t.row_end; r += kMaxRows) {
          const int mr = int(min64(kMaxRows, t.row_end - r));
          qpick<Q>(mr, np)(t.x + r * k + p0, k, c, t.code_stride, s, b, sstride, kc, t.y + r * n + P * kPanel, n, masks,
                           g == 0, bias);
        }
      }
    }
    return;
  }
  for (int64_t k0 = 0; k0 < k; k0 += t.kc) {
    const int64_t kc = min64(t.kc, k - k0);
    const bool first = k0 == 0, last = k0 + kc == k;
    for (int64_t P = t.panel_begin; P < t.panel_end; P += npg) {
      const int np = int(min64(npg, t.panel_end - P));
      PanelMask masks[4];
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

void qmatmul_tile_avx2(const MatmulTile& t) {
  switch (t.quant) {
    case WeightQuant::kAffine8: qtile<WeightQuant::kAffine8>(t); break;
    case WeightQuant::kAffine4: qtile<WeightQuant::kAffine4>(t); break;
    case WeightQuant::kFp8: qtile<WeightQuant::kFp8>(t); break;
    case WeightQuant::kNone: break;
  }
}

void matmul_tile_avx2(const MatmulTile& t) {
  if (t.w_dtype == DType::kBF16)
    tile<uint16_t>(t);
  else
    tile<float>(t);
}

}  // namespace strata::cpu::detail

#pragma GCC pop_options
