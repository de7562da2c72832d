#include "model/layers/embedding.h"

#include "backend/cpu/cpu_ops.h"
#include "core/check.h"

namespace strata {

void EmbeddingTable::gather(ThreadPool& pool, const int32_t* ids, int64_t n, float scale, float* out) const {
  pool.parallel_for(n, [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t id = ids[t];
      STRATA_CHECK(id >= 0 && id < rows, "token id out of the vocabulary");
      float* o = out + t * cols;
      if (packed != nullptr) {
        cpu::weight_row(*packed, id, o);
        for (int64_t c = 0; c < cols; ++c) o[c] *= scale;
      } else if (dtype == DType::kF32) {
        const float* r = static_cast<const float*>(data) + id * cols;
        for (int64_t c = 0; c < cols; ++c) o[c] = r[c] * scale;
      } else if (dtype == DType::kBF16) {
        const bf16_t* r = static_cast<const bf16_t*>(data) + id * cols;
        for (int64_t c = 0; c < cols; ++c) o[c] = bf16_to_f32(r[c]) * scale;
      } else {
        const f16_t* r = static_cast<const f16_t*>(data) + id * cols;
        for (int64_t c = 0; c < cols; ++c) o[c] = f16_to_f32(r[c]) * scale;
      }
    }
  });
}

}  // namespace strata
