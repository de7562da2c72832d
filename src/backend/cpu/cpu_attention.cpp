// paged_attention: parallel over (query token, kv head) pairs. Each query's output is reduced
// over its visible keys in position order by code that sees only that query, so chunking a
// sequence's queries into calls, or the thread count, cannot change a bit of it.
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_simd_kernels.h"
#include "backend/reference/reference_ops.h"
#include "core/check.h"

namespace strata::cpu {

void paged_attention(ThreadPool& pool, const PagedAttentionArgs& a) {
  STRATA_CHECK(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0, "paged_attention: n_heads % n_kv_heads != 0");
  const detail::SimdKernels* k = nullptr;
  switch (detail::simd_level()) {
    case detail::SimdLevel::kAvx512Bf16:
    case detail::SimdLevel::kAvx512: k = &detail::simd_kernels_avx512(); break;
    case detail::SimdLevel::kAvx2: k = &detail::simd_kernels_avx2(); break;
    case detail::SimdLevel::kScalar: break;
  }
  if (k == nullptr) {
    pool.parallel_for(a.n_q, [&](int64_t b, int64_t e, int) {
      for (int64_t t = b; t < e; ++t) {
        PagedAttentionArgs one = a;
        one.q = a.q + t * a.n_heads * a.head_dim;
        one.out = a.out + t * a.n_heads * a.head_dim_v;
        one.n_q = 1;
        one.pos0 = a.pos0 + int32_t(t);
        reference::paged_attention(one);
      }
    });
    return;
  }
  const int64_t scratch_floats = detail::attention_scratch_floats(a);
  pool.parallel_for(int64_t(a.n_q) * a.n_kv_heads, [&](int64_t b, int64_t e, int) {
    // Per-thread buffer, grown to the longest context seen and reused afterwards.
    thread_local std::vector<float> scratch;
    if (scratch.size() < size_t(scratch_floats)) scratch.resize(size_t(scratch_floats));
    for (int64_t i = b; i < e; ++i)
      k->attention_group(a, int32_t(i / a.n_kv_heads), int32_t(i % a.n_kv_heads), scratch.data());
  });
}

}  // namespace strata::cpu
