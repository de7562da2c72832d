// EmbeddingTable: a token embedding [rows = vocab, cols = hidden] left in its checkpoint dtype
// (usually aliasing the mapping; a quantized table is dequantized to f32 at load, or kept as a
// quantized matrix); gather converts the rows it reads to f32.
#pragma once

#include <cstdint>
#include <memory>

#include "backend/weight.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "tensor/dtype.h"

namespace strata {

struct EmbeddingTable {
  DType dtype = DType::kF32;   // f32, bf16 or f16
  const void* data = nullptr;  // [rows, cols] in dtype
  int64_t rows = 0;            // vocabulary
  int64_t cols = 0;            // hidden
  std::shared_ptr<void> storage;  // owns `data` when the loader made it (a dequantized table); else null
  // A table kept quantized (cpu::pack_quant_weight): rows are dequantized as they are gathered
  // and `data` is null. dtype then reads kF32, the type of the rows gathered.
  std::shared_ptr<const WeightMatrix> packed;

  // out[t, :] = table[ids[t], :] * scale; ids must lie in [0, rows).
  void gather(ThreadPool& pool, const int32_t* ids, int64_t n, float scale, float* out /*[n, cols]*/) const;
};

}  // namespace strata
