// matmul over panel-packed weights. Every output element is accumulated with one fused
// multiply-add per k in natural order, starting from 0, then the bias is added: the same
// sequence whatever m, the tiling or the thread split, so results are batch-invariant.
#include <cmath>
#include <string>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_ops.h"
#include "core/check.h"

namespace strata::cpu {

using detail::kPanel;

namespace {

template <typename W>
float widen(W v);
template <>
inline float widen<float>(float v) { return v; }
template <>
inline float widen<bf16_t>(bf16_t v) { return bf16_to_f32(v); }

template <typename W>
void matmul_panels_scalar(const float* x, int64_t m, int64_t k, int64_t n, const W* wp, const float* bias, float* y,
                          int64_t p_begin, int64_t p_end) {
  for (int64_t P = p_begin; P < p_end; ++P) {
    const W* panel = wp + P * k * kPanel;
    const int64_t cols = std::min(kPanel, n - P * kPanel);
    for (int64_t i = 0; i < m; ++i) {
      float acc[kPanel] = {};
      const float* xr = x + i * k;
      for (int64_t p = 0; p < k; ++p) {
        const float xv = xr[p];
        for (int64_t l = 0; l < kPanel; ++l) acc[l] = std::fma(xv, widen(panel[p * kPanel + l]), acc[l]);
      }
      float* yr = y + i * n + P * kPanel;
      for (int64_t l = 0; l < cols; ++l) yr[l] = bias ? acc[l] + bias[P * kPanel + l] : acc[l];
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

}  // namespace

void matmul(ThreadPool& pool, const float* x, int64_t m, const WeightMatrix& w, const float* bias, float* y) {
  if (m <= 0) return;
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
  STRATA_CHECK(w.layout == detail::kLayoutPanel16, "matmul: unknown weight layout " + std::to_string(w.layout));
  pool.parallel_for(detail::panel_count(n), [&](int64_t b, int64_t e, int) {
    if (w.dtype == DType::kBF16)
      matmul_panels_scalar(x, m, k, n, static_cast<const bf16_t*>(w.data), bias, y, b, e);
    else
      matmul_panels_scalar(x, m, k, n, static_cast<const float*>(w.data), bias, y, b, e);
  });
}

}  // namespace strata::cpu
