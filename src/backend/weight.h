// WeightMatrix: a linear layer's weight W [rows = n_out, cols = n_in] as the kernels want it.
// Built once at load by pack_weight (cpu_ops.h) from the checkpoint's row-major bytes; bf16
// stays bf16 in memory, f16 is widened to f32 (no f16 kernel), f32 stays f32. A quantized
// weight (pack_quant_weight) keeps its codes and per-group scales in memory and is dequantized
// inside the matmul kernels.
#pragma once

#include <cstdint>
#include <memory>

#include "tensor/dtype.h"

namespace strata {

// How a quantized weight's codes read as values; `scale` and `bias` belong to the element's
// row and group (group = input index / WeightMatrix::group).
enum class WeightQuant : uint8_t {
  kNone,
  kAffine8,  // w = fma(q, scale, bias), q an unsigned 8-bit code
  kAffine4,  // w = fma(q, scale, bias), q an unsigned 4-bit code
  kFp8,      // w = e4m3fn(q) * scale (no bias)
};

struct WeightMatrix {
  DType dtype = DType::kF32;  // storage type after packing: kF32, kBF16; quantized: kU8, kI4, kF8E4M3
  int64_t rows = 0;           // n_out
  int64_t cols = 0;           // n_in
  int32_t layout = 0;         // backend-defined packing id (0 = plain row-major)
  const void* data = nullptr; // packed bytes, owned by `storage` (or by a mapping that outlives it)
  std::shared_ptr<void> storage;
  // Quantized weights only (quant != kNone): codes in `data`, scales and biases in the layout's
  // order, all owned by `storage`.
  WeightQuant quant = WeightQuant::kNone;
  int32_t group = 0;              // input elements per scale group (the last group may be short)
  const float* scales = nullptr;  // one per (row, group)
  const float* biases = nullptr;  // one per (row, group); null for kFp8

  bool quantized() const { return quant != WeightQuant::kNone; }
  int64_t n_groups() const { return group > 0 ? (cols + group - 1) / group : 0; }

  bool empty() const { return data == nullptr; }
};

}  // namespace strata
