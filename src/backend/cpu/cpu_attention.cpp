// paged_attention: parallel over query tokens; each (token, head) is reduced over keys in
// position order, independent of how the queries were chunked into calls.
#include "backend/cpu/cpu_ops.h"
#include "backend/reference/reference_ops.h"

namespace strata::cpu {

void paged_attention(ThreadPool& pool, const PagedAttentionArgs& a) {
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
}

}  // namespace strata::cpu
