// paged_attention: each query's visible keys are processed in fixed segments and folded in
// order (cpu_simd_body.inc). With many queries (prefill) a task is a tile of consecutive
// queries (a whole query when a sliding window gives them different segments); with few
// (decode) a task is one segment of one query and the folds follow, so long contexts still
// use every thread. Both schedules run the same arithmetic: a query's output bits do not
// depend on how its sequence was chunked into calls or on the thread count.
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_simd_kernels.h"
#include "backend/reference/reference_ops.h"
#include "core/check.h"

namespace strata::cpu {

namespace {

void attention_scalar(ThreadPool& pool, const PagedAttentionArgs& a) {
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

}  // namespace

void paged_attention(ThreadPool& pool, const PagedAttentionArgs& a) {
  STRATA_CHECK(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0, "paged_attention: n_heads % n_kv_heads != 0");
  if (a.n_q <= 0) return;
  const detail::SimdKernels* k = nullptr;
  switch (detail::simd_level()) {
    case detail::SimdLevel::kAvx512Bf16:
    case detail::SimdLevel::kAvx512: k = &detail::simd_kernels_avx512(); break;
    case detail::SimdLevel::kAvx2: k = &detail::simd_kernels_avx2(); break;
    case detail::SimdLevel::kScalar: break;
  }
  if (k == nullptr) {
    attention_scalar(pool, a);
    return;
  }
  const size_t scratch_floats = size_t(detail::attention_scratch_floats(a));
  auto thread_scratch = [scratch_floats]() {
    // Per-thread buffer, grown once and reused by later calls.
    thread_local std::vector<float> scratch;
    if (scratch.size() < scratch_floats) scratch.resize(scratch_floats);
    return scratch.data();
  };

  const int64_t n_tiles = (int64_t(a.n_q) + detail::kAttnTile - 1) / detail::kAttnTile;
  if (a.window <= 0 && n_tiles >= 2 * pool.size()) {
    // Tile-per-task: kAttnTile consecutive queries share each key and value load. Tiles are
    // taken from both ends, as queries are below.
    const size_t tile_floats = size_t(detail::attention_tile_scratch_floats(a));
    pool.parallel_for(n_tiles, [&](int64_t b, int64_t e, int) {
      thread_local std::vector<float> tile_scratch;
      if (tile_scratch.size() < tile_floats) tile_scratch.resize(tile_floats);
      for (int64_t i = b; i < e; ++i) {
        const int64_t tile = (i % 2 == 0) ? i / 2 : n_tiles - 1 - i / 2;
        const int32_t t0 = int32_t(tile * detail::kAttnTile);
        k->attention_tile(a, t0, std::min(detail::kAttnTile, a.n_q - t0), tile_scratch.data());
      }
    });
    return;
  }
  if (a.n_q >= 2 * pool.size()) {
    // Query-per-task. Later queries see more keys: task i takes queries from both ends
    // (0, n-1, 1, n-2, ...) so the static split hands every thread a similar load.
    const int32_t n = a.n_q;
    pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
      float* scratch = thread_scratch();
      for (int64_t i = b; i < e; ++i) {
        const int32_t t = (i % 2 == 0) ? int32_t(i / 2) : int32_t(n - 1 - i / 2);
        k->attention_query(a, t, scratch);
      }
    });
    return;
  }

  // Segment-per-task, then one fold per query.
  thread_local std::vector<int64_t> first_task;  // [n_q + 1]: task index of each query's first segment
  thread_local std::vector<float> parts;         // [n_tasks, n_heads, head_dim_v + 2]
  first_task.assign(size_t(a.n_q) + 1, 0);
  for (int32_t t = 0; t < a.n_q; ++t) first_task[size_t(t) + 1] = first_task[size_t(t)] + detail::attention_segments(a, t);
  const int64_t n_tasks = first_task[size_t(a.n_q)];
  const int64_t part_floats = int64_t(a.n_heads) * (a.head_dim_v + 2);
  if (parts.size() < size_t(n_tasks * part_floats)) parts.resize(size_t(n_tasks * part_floats));
  // Plain pointers: inside the workers the thread_local names would denote their own copies.
  const int64_t* first = first_task.data();
  float* part_buf = parts.data();
  pool.parallel_for(n_tasks, [&](int64_t b, int64_t e, int) {
    float* scratch = thread_scratch();
    int32_t t = int32_t(std::upper_bound(first, first + a.n_q + 1, b) - first) - 1;
    for (int64_t i = b; i < e; ++i) {
      while (i >= first[t + 1]) ++t;
      k->attention_part(a, t, i - first[t], scratch, part_buf + i * part_floats);
    }
  });
  pool.parallel_for(a.n_q, [&](int64_t b, int64_t e, int) {
    float* scratch = thread_scratch();
    for (int64_t t = b; t < e; ++t)
      k->attention_merge(a, int32_t(t), part_buf + first[t] * part_floats, first[t + 1] - first[t], scratch);
  });
}

}  // namespace strata::cpu
