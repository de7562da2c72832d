#include "backend/cpu/delta_net.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/delta_net_internal.h"

namespace strata::cpu {

namespace {

float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

const detail::DeltaRuleKernels& delta_rule_kernels() {
  switch (detail::simd_level()) {
    case detail::SimdLevel::kAvx512Bf16:
    case detail::SimdLevel::kAvx512: return detail::delta_rule_kernels_avx512();
    case detail::SimdLevel::kAvx2: return detail::delta_rule_kernels_avx2();
    case detail::SimdLevel::kScalar: break;
  }
  return detail::delta_rule_kernels_scalar();
}

}  // namespace

void l2_norm_heads(ThreadPool& pool, float* x, int64_t n_tokens, int64_t n_heads, int64_t dim, int64_t token_stride,
                   float eps) {
  pool.parallel_for(n_tokens * n_heads, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      float* v = x + (r / n_heads) * token_stride + (r % n_heads) * dim;
      const float inv = 1.0f / std::sqrt(dot(v, v, dim) + eps);
      for (int64_t i = 0; i < dim; ++i) v[i] *= inv;
    }
  }, 8);
}

void delta_net_gates(const float* a, const float* b, int64_t ab_stride, const float* a_log, const float* dt_bias,
                     float* g, float* beta, int64_t n_tokens, int64_t n_heads) {
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t h = 0; h < n_heads; ++h) {
      g[t * n_heads + h] = -std::exp(a_log[h]) * softplus(a[t * ab_stride + h] + dt_bias[h]);
      beta[t * n_heads + h] = 1.0f / (1.0f + std::exp(-b[t * ab_stride + h]));
    }
}

void gated_delta_rule_recurrent(ThreadPool& pool, const GatedDeltaRuleArgs& a) {
  const detail::DeltaRuleKernels& k = delta_rule_kernels();
  pool.parallel_for(a.n_v_heads, [&](int64_t h0, int64_t h1, int) {
    thread_local std::vector<float> mem;  // per worker, kept across steps
    mem.resize(size_t(a.d_v));
    for (int64_t h = h0; h < h1; ++h) k.recurrent_head(a, h, mem.data());
  });
}

void gated_delta_rule_chunked(ThreadPool& pool, const GatedDeltaRuleArgs& a, int32_t chunk) {
  const detail::DeltaRuleKernels& k = delta_rule_kernels();
  const size_t floats = size_t(detail::chunked_layout(a, chunk).total);
  pool.parallel_for(a.n_v_heads, [&](int64_t h0, int64_t h1, int) {
    thread_local std::vector<float> scratch;  // per worker, kept across steps
    if (scratch.size() < floats) scratch.resize(floats);
    for (int64_t h = h0; h < h1; ++h) k.chunked_head(a, h, chunk, scratch.data());
  });
}

namespace {

// Rows [t0, t1) of the call as a call of their own (the state is carried in place).
GatedDeltaRuleArgs rows(const GatedDeltaRuleArgs& a, int64_t t0, int64_t t1) {
  GatedDeltaRuleArgs r = a;
  r.q = a.q + t0 * a.qkv_stride;
  r.k = a.k + t0 * a.qkv_stride;
  r.v = a.v + t0 * a.qkv_stride;
  r.g = a.g + t0 * a.n_v_heads;
  r.beta = a.beta + t0 * a.n_v_heads;
  r.out = a.out + t0 * a.n_v_heads * a.d_v;
  r.n_tokens = int32_t(t1 - t0);
  r.pos0 = int32_t(a.pos0 + t0);
  return r;
}

}  // namespace

// The span splits into a head (rows before its first block boundary, when it starts mid-block),
// whole blocks, and a tail (the rows of its last block, from that block's start). Whole blocks
// and a tail of kChunkedMinTokens rows or more run chunked, the head and a shorter tail
// recurrent: a chunk pads its rows to 32, so below 16 rows the recurrent form is the faster
// (bench_delta_rule, Qwen3-Next shape, 2 threads: 8 rows 1.2 ms recurrent vs 1.6 ms chunked,
// 16 rows 2.3 vs 1.7 ms; bench/RESULTS.md has 2048 rows).
void gated_delta_rule(ThreadPool& pool, const GatedDeltaRuleArgs& a) {
  const int64_t n = a.n_tokens, off = int64_t(a.pos0) % kDeltaChunk;
  const int64_t head = off == 0 ? 0 : std::min<int64_t>(n, kDeltaChunk - off);
  const int64_t tail = (n - head) % kDeltaChunk;
  const int64_t chunked_end = tail >= kChunkedMinTokens ? n : n - tail;
  if (head > 0) gated_delta_rule_recurrent(pool, rows(a, 0, head));
  if (chunked_end > head) gated_delta_rule_chunked(pool, rows(a, head, chunked_end));
  if (n > chunked_end) gated_delta_rule_recurrent(pool, rows(a, chunked_end, n));
}

void gated_rms_norm(ThreadPool& pool, const float* x, const float* z, int64_t z_stride, const float* w, float* y,
                    int64_t n_tokens, int64_t n_heads, int64_t dim, float eps) {
  pool.parallel_for(n_tokens * n_heads, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xv = x + r * dim;
      const float* zv = z + (r / n_heads) * z_stride + (r % n_heads) * dim;
      float* yv = y + r * dim;
      const float inv = 1.0f / std::sqrt(dot(xv, xv, dim) / float(dim) + eps);
      for (int64_t i = 0; i < dim; ++i) yv[i] = xv[i] * inv * w[i] * (zv[i] / (1.0f + std::exp(-zv[i])));
    }
  }, 8);
}

}  // namespace strata::cpu
