// The per-SIMD-level matmul tile functions behind cpu::matmul. A tile is a range of rows of
// x times a range of weight panels (layout kLayoutPanel16). Every level computes each output
// element as fma(x[i,p], w[j,p], acc) for p = 0..k-1 in order from acc = 0, then adds the bias,
// so all levels and all tilings give bitwise-identical results.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace strata::cpu::detail {

// Widest panel group any tile function converts into scratch at once.
constexpr int64_t kMaxGroupPanels = 8;

struct MatmulTile {
  const float* x;      // [m, k] activations
  int64_t k;           // inner dimension
  int64_t n;           // output columns (weight rows)
  DType w_dtype;       // kF32 or kBF16
  const void* w;       // packed panels [n_panels, k, kPanel]
  const float* bias;   // [n] or null
  float* y;            // [m, n]
  int64_t row_begin, row_end;      // rows of x / y in this tile
  int64_t panel_begin, panel_end;  // weight panels in this tile
  int64_t kc;          // k-block length; partial sums pass through y between blocks
  float* scratch;      // null, or kc * kPanel * kMaxGroupPanels floats: bf16 panels widened per block
};

void matmul_tile_scalar(const MatmulTile& t);
void matmul_tile_avx2(const MatmulTile& t);
void matmul_tile_avx512(const MatmulTile& t);

}  // namespace strata::cpu::detail
