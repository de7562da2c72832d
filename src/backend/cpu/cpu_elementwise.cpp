// rms_norm, gated_act and rope: row-parallel; each row's arithmetic is the same whatever
// the split.
#include "backend/cpu/cpu_ops.h"
#include "backend/reference/reference_ops.h"

namespace strata::cpu {

void rms_norm(ThreadPool& pool, const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
              bool one_plus_w) {
  pool.parallel_for(rows, [&](int64_t b, int64_t e, int) {
    reference::rms_norm(x + b * dim, w, y + b * dim, e - b, dim, eps, one_plus_w);
  });
}

void gated_act(ThreadPool& pool, const float* gate, const float* up, float* out, int64_t n, Activation act) {
  pool.parallel_for(
      n, [&](int64_t b, int64_t e, int) { reference::gated_act(gate + b, up + b, out + b, e - b, act); }, 1024);
}

void rope(ThreadPool& pool, float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t rot_dim,
          const int32_t* positions, const float* inv_freq, float attn_factor) {
  pool.parallel_for(n_tokens, [&](int64_t b, int64_t e, int) {
    reference::rope(x + b * n_heads * head_dim, e - b, n_heads, head_dim, rot_dim, positions + b, inv_freq,
                    attn_factor);
  });
}

}  // namespace strata::cpu
