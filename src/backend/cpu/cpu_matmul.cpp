// matmul: splits the output into tiles across the pool and hands each tile to the SIMD level's
// tile function (cpu_matmul_tile.h). Tiling, k-blocking and the level change only speed: each
// output element is always fma-accumulated along k in natural order from 0, then biased.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_matmul_tile.h"
#include "backend/cpu/cpu_ops.h"
#include "core/check.h"

namespace strata::cpu {

namespace detail {

namespace {

template <typename W>
float widen(W v);
template <>
inline float widen<float>(float v) { return v; }
template <>
inline float widen<bf16_t>(bf16_t v) { return bf16_to_f32(v); }

template <typename W>
void tile_scalar(const MatmulTile& t) {
  const W* w = static_cast<const W*>(t.w);
  for (int64_t P = t.panel_begin; P < t.panel_end; ++P) {
    const W* panel = w + P * t.k * kPanel;
    const int64_t cols = std::min(kPanel, t.n - P * kPanel);
    for (int64_t i = t.row_begin; i < t.row_end; ++i) {
      float acc[kPanel] = {};
      const float* xr = t.x + i * t.k;
      for (int64_t p = 0; p < t.k; ++p) {
        const float xv = xr[p];
        for (int64_t l = 0; l < kPanel; ++l) acc[l] = std::fma(xv, widen(panel[p * kPanel + l]), acc[l]);
      }
      float* yr = t.y + i * t.n + P * kPanel;
      for (int64_t l = 0; l < cols; ++l) yr[l] = t.bias ? acc[l] + t.bias[P * kPanel + l] : acc[l];
    }
  }
}

template <typename W>
void matmul_rowmajor_scalar(const float* x, int64_t m, int64_t k, int64_t n, const W* w, const float* bias, float* y,
                            int64_t j_begin, int64_t j_end) {
  for (int64_t j = j_begin; j < j_end; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      float acc = 0.0f;
      for (int64_t p = 0; p < k; ++p) acc = std::fma(x[i * k + p], widen(w[j * k + p]), acc);
      y[i * n + j] = bias ? acc + bias[j] : acc;
    }
  }
}

// Rows at or below this count stream the weights once, without k-blocking: the decode regime.
constexpr int64_t kSmallM = 16;
// k-block for larger m: the weight block of a panel group stays in L2 across all row groups.
constexpr int64_t kBlockK = 256;

}  // namespace

void matmul_tile_scalar(const MatmulTile& t) {
  if (t.w_dtype == DType::kBF16)
    tile_scalar<bf16_t>(t);
  else
    tile_scalar<float>(t);
}

}  // namespace detail

void matmul(ThreadPool& pool, const float* x, int64_t m, const WeightMatrix& w, const float* bias, float* y) {
  using namespace detail;
  if (m <= 0) return;
  if (w.quantized()) {
    quant_matmul(pool, x, m, w, bias, y);
    return;
  }
  const int64_t k = w.cols, n = w.rows;
  STRATA_CHECK(w.dtype == DType::kF32 || w.dtype == DType::kBF16, "matmul: weight dtype must be f32 or bf16");
  if (w.layout == 0) {
    pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
      if (w.dtype == DType::kBF16)
        matmul_rowmajor_scalar(x, m, k, n, static_cast<const bf16_t*>(w.data), bias, y, b, e);
      else
        matmul_rowmajor_scalar(x, m, k, n, static_cast<const float*>(w.data), bias, y, b, e);
    });
    return;
  }
  STRATA_CHECK(w.layout == kLayoutPanel16, "matmul: unknown weight layout " + std::to_string(w.layout));

  void (*tile_fn)(const MatmulTile&) = &matmul_tile_scalar;
  switch (simd_level()) {
    case SimdLevel::kAvx512Bf16:
    case SimdLevel::kAvx512: tile_fn = &matmul_tile_avx512; break;
    case SimdLevel::kAvx2: tile_fn = &matmul_tile_avx2; break;
    case SimdLevel::kScalar: break;
  }

  const int64_t n_panels = panel_count(n);
  const bool small_m = m <= kSmallM;
  MatmulTile base{};
  base.x = x;
  base.k = k;
  base.n = n;
  base.w_dtype = w.dtype;
  base.w = w.data;
  base.bias = bias;
  base.y = y;
  base.kc = small_m ? k : kBlockK;

  auto run = [&](int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
    MatmulTile t = base;
    t.row_begin = r0;
    t.row_end = r1;
    t.panel_begin = p0;
    t.panel_end = p1;
    if (!small_m && w.dtype == DType::kBF16) {
      // Per-thread widening buffer, grown once and reused by every later call.
      thread_local std::vector<float> scratch;
      const size_t need = size_t(kBlockK * kPanel * kMaxGroupPanels);
      if (scratch.size() < need) scratch.resize(need);
      t.scratch = scratch.data();
    }
    tile_fn(t);
  };

  if (n_panels >= 2 * pool.size() || m < 2 * kSmallM) {
    // Split the columns: each thread streams its own share of the weights once.
    pool.parallel_for(n_panels, [&](int64_t b, int64_t e, int) { run(0, m, b, e); });
  } else {
    // Few panels, many rows: split the rows (in groups of 8 so register blocks stay full).
    pool.parallel_for(m, [&](int64_t b, int64_t e, int) { run(b, e, 0, n_panels); }, 8);
  }
}

}  // namespace strata::cpu
