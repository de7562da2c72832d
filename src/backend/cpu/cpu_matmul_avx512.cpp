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
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")
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

}  // namespace

void matmul_tile_avx512(const MatmulTile& t) {
  if (t.w_dtype == DType::kBF16)
    tile<uint16_t>(t);
  else
    tile<float>(t);
}

}  // namespace strata::cpu::detail

#pragma GCC pop_options
