// WeightMatrix: a linear layer's weight W [rows = n_out, cols = n_in] as the kernels want it.
// Built once at load by pack_weight (cpu_ops.h) from the checkpoint's row-major bytes; bf16
// stays bf16 in memory, f16 is widened to f32 (no f16 kernel), f32 stays f32.
#pragma once

#include <cstdint>
#include <memory>

#include "tensor/dtype.h"

namespace strata {

struct WeightMatrix {
  DType dtype = DType::kF32;  // storage type after packing: kF32 or kBF16
  int64_t rows = 0;           // n_out
  int64_t cols = 0;           // n_in
  int32_t layout = 0;         // backend-defined packing id (0 = plain row-major)
  const void* data = nullptr; // packed bytes, owned by `storage` (or by a mapping that outlives it)
  std::shared_ptr<void> storage;

  bool empty() const { return data == nullptr; }
};

}  // namespace strata
