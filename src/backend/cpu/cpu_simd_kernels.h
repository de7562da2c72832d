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
  // Paged attention, see cpu_simd_body.inc: a whole query; one key segment of a query into
  // part [n_heads][head_dim_v + 2]; the fold of a query's parts into its output.
  void (*attention_query)(const PagedAttentionArgs& a, int32_t t, float* scratch);
  void (*attention_part)(const PagedAttentionArgs& a, int32_t t, int64_t seg, float* scratch, float* part);
  void (*attention_merge)(const PagedAttentionArgs& a, int32_t t, const float* parts, int64_t n_seg, float* scratch);
  // Queries [t0, t0 + nq) (nq <= kAttnTile, a.window <= 0) with the same bits as
  // attention_query on each; scratch: attention_tile_scratch_floats.
  void (*attention_tile)(const PagedAttentionArgs& a, int32_t t0, int32_t nq, float* scratch);
};

// Keys per attention segment: a fixed constant, part of the numerics (see cpu_simd_body.inc).
constexpr int64_t kAttnSegment = 64;

// Floats of per-thread scratch the attention kernels need for `a`.
inline int64_t attention_scratch_floats(const PagedAttentionArgs& a) {
  return int64_t(a.n_heads) * (kAttnSegment + 16) + 2 * int64_t(a.n_heads) * (a.head_dim_v + 2);
}

// Consecutive queries per attention_tile call: each key and value row loaded feeds them all.
constexpr int32_t kAttnTile = 4;

inline int64_t attention_tile_scratch_floats(const PagedAttentionArgs& a) {
  return kAttnTile * attention_scratch_floats(a);
}

// Visible keys of query t and their segment count.
inline int64_t attention_keys(const PagedAttentionArgs& a, int32_t t) {
  const int64_t qpos = int64_t(a.pos0) + t;
  return a.window > 0 && qpos + 1 > a.window ? a.window : qpos + 1;
}
inline int64_t attention_segments(const PagedAttentionArgs& a, int32_t t) {
  return (attention_keys(a, t) + kAttnSegment - 1) / kAttnSegment;
}

const SimdKernels& simd_kernels_avx512();
const SimdKernels& simd_kernels_avx2();

}  // namespace strata::cpu::detail
