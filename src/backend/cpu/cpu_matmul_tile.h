// The per-SIMD-level matmul tile functions behind cpu::matmul. A tile is a range of rows of
// x times a range of weight panels (layout kLayoutPanel16). Every level computes each output
// element as fma(x[i,p], w[j,p], acc) for p = 0..k-1 in order from acc = 0, then adds the bias,
// so all levels and all tilings give bitwise-identical results.
#pragma once

#include <cstdint>

#include "backend/weight.h"
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
  // Quantized weights (layout kLayoutQuantPanel16): w holds the codes. Null scratch asks for the
  // in-register path (dequantize, then fma, one scale group at a time); with scratch a k-block
  // of panels is dequantized once and shared by every row group. Both give the same values.
  WeightQuant quant;
  int64_t code_stride;   // bytes of codes per panel
  const float* scales;   // [n_panels, n_groups, kPanel]
  const float* biases;   // same, or null (kFp8)
  int64_t group;         // inputs per scale group
  int64_t n_groups;
};

void matmul_tile_scalar(const MatmulTile& t);
void matmul_tile_avx2(const MatmulTile& t);
void matmul_tile_avx512(const MatmulTile& t);
void qmatmul_tile_scalar(const MatmulTile& t);
void qmatmul_tile_avx2(const MatmulTile& t);
void qmatmul_tile_avx512(const MatmulTile& t);

// The f32 value of an e4m3fn code as the SIMD kernels decode it: through f16 bits, the value
// / 256 (NaN codes excepted; checkpoints hold none).
inline uint16_t fp8_e4m3_as_f16_bits(uint8_t c) { return uint16_t(((c & 0x7Fu) << 7) | ((c & 0x80u) << 8)); }

}  // namespace strata::cpu::detail
