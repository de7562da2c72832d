// Element-wise, normalization, rotary and attention kernels per SIMD level: a table of
// function pointers filled by cpu_simd_avx512.cpp / cpu_simd_avx2.cpp from one templated body
// (cpu_simd_body.inc). The public entry points in cpu_elementwise.cpp and cpu_attention.cpp
// split the work over the pool and pick the table of the dispatched level.
#pragma once

#include <cstdint>

#include "backend/cpu/cpu_ops.h"

namespace strata::cpu::detail {

struct SimdKernels {
  // rows x dim, see cpu::rms_norm.
  void (*rms_norm)(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps, bool one_plus_w);
  // n elements, see cpu::gated_act.
  void (*gated_act)(const float* gate, const float* up, float* out, int64_t n, Activation act);
  void (*add)(const float* a, const float* b, float* out, int64_t n);
  void (*mul)(const float* a, const float* b, float* out, int64_t n);
  // up == null: out = act(gate) (un-gated).
  void (*act_only)(const float* x, float* out, int64_t n, Activation act);
  void (*softmax)(const float* x, float* y, int64_t rows, int64_t dim);
  // Rotates one token's heads x [n_heads, head_dim] by precomputed cos_v / sin_v [rot_dim / 2]
  // (attn_factor already applied).
  void (*rope_token)(float* x, int64_t n_heads, int64_t head_dim, int64_t rot_dim, const float* cos_v,
                     const float* sin_v);
  // Attention of query token t for the query heads of kv head kvh. scratch holds at least
  // attention_scratch_floats(a) floats.
  void (*attention_group)(const PagedAttentionArgs& a, int32_t t, int32_t kvh, float* scratch);
};

// Floats of scratch attention_group needs for the longest query of `a`.
inline int64_t attention_scratch_floats(const PagedAttentionArgs& a) {
  const int64_t group = a.n_heads / a.n_kv_heads;
  const int64_t n_keys = int64_t(a.pos0) + a.n_q;
  return group * (n_keys + 16) + group * (int64_t(a.head_dim_v) + 16);
}

const SimdKernels& simd_kernels_avx512();
const SimdKernels& simd_kernels_avx2();

}  // namespace strata::cpu::detail
