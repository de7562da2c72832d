// rms_norm, gated_act, rope and the element-wise helpers: split over rows (or element ranges) across the pool; each
// row's arithmetic depends only on that row, so results do not depend on the split.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_simd_kernels.h"
#include "backend/reference/reference_ops.h"

namespace strata::cpu {

namespace {

const detail::SimdKernels* simd_table() {
  switch (detail::simd_level()) {
    case detail::SimdLevel::kAvx512Bf16:
    case detail::SimdLevel::kAvx512: return &detail::simd_kernels_avx512();
    case detail::SimdLevel::kAvx2: return &detail::simd_kernels_avx2();
    case detail::SimdLevel::kScalar: break;
  }
  return nullptr;
}

}  // namespace

void rms_norm(ThreadPool& pool, const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
              bool one_plus_w) {
  const detail::SimdKernels* k = simd_table();
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, dim));
  pool.parallel_for(
      rows,
      [&](int64_t b, int64_t e, int) {
        if (k != nullptr)
          k->rms_norm(x + b * dim, w, y + b * dim, e - b, dim, eps, one_plus_w);
        else
          reference::rms_norm(x + b * dim, w, y + b * dim, e - b, dim, eps, one_plus_w);
      },
      grain);
}

void gated_act(ThreadPool& pool, const float* gate, const float* up, float* out, int64_t n, Activation act) {
  const detail::SimdKernels* k = simd_table();
  // Element i's value depends only on gate[i] and up[i]: any split gives the same numbers.
  pool.parallel_for(
      n,
      [&](int64_t b, int64_t e, int) {
        if (k != nullptr)
          k->gated_act(gate + b, up + b, out + b, e - b, act);
        else
          reference::gated_act(gate + b, up + b, out + b, e - b, act);
      },
      4096);
}

void add(ThreadPool& pool, const float* a, const float* b, float* out, int64_t n) {
  const detail::SimdKernels* k = simd_table();
  pool.parallel_for(
      n,
      [&](int64_t i0, int64_t i1, int) {
        if (k != nullptr)
          k->add(a + i0, b + i0, out + i0, i1 - i0);
        else
          reference::add(a + i0, b + i0, out + i0, i1 - i0);
      },
      16384);
}

void mul(ThreadPool& pool, const float* a, const float* b, float* out, int64_t n) {
  const detail::SimdKernels* k = simd_table();
  pool.parallel_for(
      n,
      [&](int64_t i0, int64_t i1, int) {
        if (k != nullptr)
          k->mul(a + i0, b + i0, out + i0, i1 - i0);
        else
          reference::mul(a + i0, b + i0, out + i0, i1 - i0);
      },
      16384);
}

void activation(ThreadPool& pool, const float* x, float* out, int64_t n, Activation act) {
  const detail::SimdKernels* k = simd_table();
  pool.parallel_for(
      n,
      [&](int64_t b, int64_t e, int) {
        if (k != nullptr)
          k->act_only(x + b, out + b, e - b, act);
        else
          reference::activation(x + b, out + b, e - b, act);
      },
      4096);
}

void softmax(ThreadPool& pool, const float* x, float* y, int64_t rows, int64_t dim) {
  const detail::SimdKernels* k = simd_table();
  pool.parallel_for(rows, [&](int64_t b, int64_t e, int) {
    if (k != nullptr)
      k->softmax(x + b * dim, y + b * dim, e - b, dim);
    else
      reference::softmax(x + b * dim, y + b * dim, e - b, dim);
  });
}

void rope(ThreadPool& pool, float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t rot_dim,
          const int32_t* positions, const float* inv_freq, float attn_factor) {
  const detail::SimdKernels* k = simd_table();
  const int64_t half = rot_dim / 2;
  pool.parallel_for(n_tokens, [&](int64_t b, int64_t e, int) {
    if (k == nullptr) {
      reference::rope(x + b * n_heads * head_dim, e - b, n_heads, head_dim, rot_dim, positions + b, inv_freq,
                      attn_factor);
      return;
    }
    // cos/sin once per token, shared by its heads; angles formed in f32 as the reference does.
    thread_local std::vector<float> cs;
    cs.resize(size_t(2 * half));
    for (int64_t t = b; t < e; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const float theta = float(positions[t]) * inv_freq[i];
        cs[size_t(i)] = std::cos(theta) * attn_factor;
        cs[size_t(half + i)] = std::sin(theta) * attn_factor;
      }
      k->rope_token(x + t * n_heads * head_dim, n_heads, head_dim, rot_dim, cs.data(), cs.data() + half);
    }
  });
}

}  // namespace strata::cpu
