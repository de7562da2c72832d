// Batch invariance: a row's output must be bitwise identical whether it is computed alone,
// inside batches of other sizes at other positions, or with another thread count; an
// attention query's output must not depend on how the sequence's queries were chunked.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_ops.h"
#include "backend_test_util.h"

namespace strata {
namespace {

using test::bitwise_equal;
using test::random_floats;

void check_matmul_invariance(DType dt, int64_t k, int64_t n, bool with_bias) {
  const int64_t m_full = 600;
  const auto x = random_floats(size_t(m_full * k), 11);
  const auto wf = random_floats(size_t(n * k), 12);
  const auto bias = random_floats(size_t(n), 13);
  std::vector<uint16_t> wb(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16(wf[i]);
  const WeightMatrix w = cpu::pack_weight(dt, dt == DType::kBF16 ? static_cast<const void*>(wb.data()) : wf.data(),
                                          n, k);
  const float* b = with_bias ? bias.data() : nullptr;

  ThreadPool pool2(2);
  std::vector<float> full(size_t(m_full * n));
  cpu::matmul(pool2, x.data(), m_full, w, b, full.data());

  // Batches of these sizes, each placed so that the probed rows land at varied positions.
  const int64_t batch_sizes[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 64, 129, 511};
  ThreadPool pool1(1), pool3(3);
  ThreadPool* pools[] = {&pool1, &pool2, &pool3};
  int which = 0;
  for (int64_t bs : batch_sizes) {
    for (int64_t start : {int64_t(0), int64_t(37), m_full - bs}) {
      if (start + bs > m_full) continue;
      ThreadPool& pool = *pools[which++ % 3];
      std::vector<float> y(size_t(bs * n), NAN);
      cpu::matmul(pool, x.data() + start * k, bs, w, b, y.data());
      ASSERT_TRUE(bitwise_equal(y.data(), full.data() + start * n, y.size()))
          << dtype_name(dt) << " k=" << k << " n=" << n << " batch " << bs << " at " << start << " threads "
          << pool.size();
    }
  }
}

TEST(BackendBatchInvariance, MatmulF32) {
  for (auto level : test::simd_levels()) {
    test::SimdCap cap(level);
    SCOPED_TRACE(test::level_name(level));
    check_matmul_invariance(DType::kF32, 1024, 96, false);
    check_matmul_invariance(DType::kF32, 77, 33, true);
  }
}

TEST(BackendBatchInvariance, MatmulBf16) {
  for (auto level : test::simd_levels()) {
    test::SimdCap cap(level);
    SCOPED_TRACE(test::level_name(level));
    check_matmul_invariance(DType::kBF16, 1024, 80, true);
    check_matmul_invariance(DType::kBF16, 300, 1, false);
  }
}

TEST(BackendBatchInvariance, MatmulSameAcrossSimdLevels) {
  // Every level performs the same fused multiply-adds in the same order, so the numbers agree
  // bitwise: a server's answers do not depend on the CPU it lands on.
  const int64_t m = 19, k = 203, n = 45;
  const auto x = random_floats(size_t(m * k), 21);
  const auto wf = random_floats(size_t(n * k), 22);
  const WeightMatrix w = cpu::pack_weight(DType::kF32, wf.data(), n, k);
  ThreadPool pool(2);
  std::vector<float> first;
  for (auto level : test::simd_levels()) {
    test::SimdCap cap(level);
    std::vector<float> y(size_t(m * n));
    cpu::matmul(pool, x.data(), m, w, nullptr, y.data());
    if (first.empty())
      first = y;
    else
      EXPECT_TRUE(bitwise_equal(y.data(), first.data(), y.size())) << test::level_name(level);
  }
}

TEST(BackendBatchInvariance, RowKernels) {
  const int64_t rows = 40, dim = 1000, n_heads = 4, head_dim = 250;
  const auto x = random_floats(size_t(rows * dim), 31, -3.0f, 3.0f);
  const auto w = random_floats(size_t(dim), 32);
  const auto up = random_floats(size_t(rows * dim), 33);
  std::vector<int32_t> pos(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) pos[size_t(i)] = int32_t(1000 + 7 * i);
  std::vector<float> inv_freq(size_t(head_dim / 2));
  for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * float(i) / float(head_dim));
  for (auto level : test::simd_levels()) {
    test::SimdCap cap(level);
    SCOPED_TRACE(test::level_name(level));
    ThreadPool pool2(2), pool1(1);
    std::vector<float> norm_full(x.size()), act_full(x.size()), rope_full = x;
    cpu::rms_norm(pool2, x.data(), w.data(), norm_full.data(), rows, dim, 1e-5f, false);
    cpu::gated_act(pool2, x.data(), up.data(), act_full.data(), rows * dim, cpu::Activation::kGeluTanh);
    cpu::rope(pool2, rope_full.data(), rows, n_heads, head_dim, head_dim, pos.data(), inv_freq.data(), 1.0f);
    for (int64_t r : {int64_t(0), int64_t(13), rows - 1}) {
      std::vector<float> one(static_cast<size_t>(dim));
      cpu::rms_norm(pool1, x.data() + r * dim, w.data(), one.data(), 1, dim, 1e-5f, false);
      EXPECT_TRUE(bitwise_equal(one.data(), norm_full.data() + r * dim, one.size())) << "rms_norm row " << r;
      // gated_act on a sub-range that starts at an odd offset.
      const int64_t off = r * dim + 3;
      cpu::gated_act(pool1, x.data() + off, up.data() + off, one.data(), dim - 3, cpu::Activation::kGeluTanh);
      EXPECT_TRUE(bitwise_equal(one.data(), act_full.data() + off, size_t(dim - 3))) << "gated_act row " << r;
      std::vector<float> rot(x.begin() + r * dim, x.begin() + (r + 1) * dim);
      cpu::rope(pool1, rot.data(), 1, n_heads, head_dim, head_dim, pos.data() + r, inv_freq.data(), 1.0f);
      EXPECT_TRUE(bitwise_equal(rot.data(), rope_full.data() + r * dim, rot.size())) << "rope row " << r;
    }
  }
}

// Runs attention for queries [t0, t0 + n) of a sequence whose KV already holds them.
void attention_chunk(ThreadPool& pool, const test::PagedKv& kv, const std::vector<float>& q, int32_t t0, int32_t n,
                     int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, int32_t window, float softcap,
                     std::vector<float>& out) {
  cpu::PagedAttentionArgs a{};
  a.q = q.data() + size_t(t0) * n_heads * head_dim;
  a.out = out.data() + size_t(t0) * n_heads * head_dim;
  a.k_pool = kv.k_pool.data();
  a.v_pool = kv.v_pool.data();
  a.block_table = kv.block_table.data();
  a.block_size = kv.block_size;
  a.n_q = n;
  a.pos0 = t0;
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv_heads;
  a.head_dim = head_dim;
  a.head_dim_v = head_dim;
  a.scale = 1.0f / std::sqrt(float(head_dim));
  a.softcap = softcap;
  a.window = window;
  cpu::paged_attention(pool, a);
}

TEST(BackendBatchInvariance, AttentionChunking) {
  const int32_t n_tok = 40, n_heads = 8, n_kv_heads = 2;
  for (auto level : test::simd_levels()) {
    test::SimdCap cap(level);
    SCOPED_TRACE(test::level_name(level));
    for (int32_t head_dim : {8, 64, 128, 256}) {
      for (auto [window, softcap] : {std::pair{0, 0.0f}, std::pair{9, 30.0f}}) {
        const test::PagedKv kv(n_tok, 16, n_kv_heads, head_dim, head_dim, 50 + head_dim);
        const auto q = random_floats(size_t(n_tok) * n_heads * head_dim, 60 + head_dim, -2.0f, 2.0f);
        const size_t n_out = size_t(n_tok) * n_heads * head_dim;
        ThreadPool pool2(2), pool1(1), pool3(3);
        std::vector<float> at_once(n_out), split(n_out, NAN), single(n_out, NAN);
        attention_chunk(pool2, kv, q, 0, n_tok, n_heads, n_kv_heads, head_dim, window, softcap, at_once);
        attention_chunk(pool3, kv, q, 0, 17, n_heads, n_kv_heads, head_dim, window, softcap, split);
        attention_chunk(pool1, kv, q, 17, 23, n_heads, n_kv_heads, head_dim, window, softcap, split);
        for (int32_t t = 0; t < n_tok; ++t)
          attention_chunk(t % 2 ? pool1 : pool2, kv, q, t, 1, n_heads, n_kv_heads, head_dim, window, softcap, single);
        EXPECT_TRUE(bitwise_equal(at_once.data(), split.data(), n_out)) << "17+23, head_dim " << head_dim;
        EXPECT_TRUE(bitwise_equal(at_once.data(), single.data(), n_out)) << "1 by 1, head_dim " << head_dim;
      }
    }
  }
}

TEST(BackendBatchInvariance, AttentionPrefillTilesMatchSingleQueries) {
  // Long full-attention prefills run tiles of consecutive queries that share key and value
  // loads; every query must still get the bits it gets alone (one query per call), across
  // head dims, GQA group sizes, soft-cap, a non-zero start position and SIMD levels.
  const int32_t n_tok = 203, n_heads = 8;
  for (auto level : test::simd_levels()) {
    test::SimdCap cap(level);
    SCOPED_TRACE(test::level_name(level));
    for (int32_t head_dim : {8, 64, 128, 256}) {
      for (int32_t n_kv_heads : {2, 8}) {
        for (float softcap : {0.0f, 30.0f}) {
          for (int32_t pos0 : {0, 37}) {
            const int32_t n_ctx = pos0 + n_tok;
            const test::PagedKv kv(n_ctx, 16, n_kv_heads, head_dim, head_dim, 80 + head_dim + n_kv_heads);
            const auto q = random_floats(size_t(n_ctx) * n_heads * head_dim, 90 + head_dim, -2.0f, 2.0f);
            const size_t n_out = size_t(n_ctx) * n_heads * head_dim;
            ThreadPool pool2(2), pool1(1);
            std::vector<float> at_once(n_out, 0.0f), single(n_out, 0.0f);
            attention_chunk(pool2, kv, q, pos0, n_tok, n_heads, n_kv_heads, head_dim, 0, softcap, at_once);
            for (int32_t t = pos0; t < n_ctx; ++t)
              attention_chunk(pool1, kv, q, t, 1, n_heads, n_kv_heads, head_dim, 0, softcap, single);
            EXPECT_TRUE(bitwise_equal(at_once.data(), single.data(), n_out))
                << "head_dim " << head_dim << " kv heads " << n_kv_heads << " softcap " << softcap << " pos0 " << pos0;
          }
        }
      }
    }
  }
}

TEST(BackendBatchInvariance, AttentionLongContextDecodeMatchesPrefill) {
  // 700 tokens span many key segments: prefill computes whole queries per task, decode
  // splits a query's segments across threads and folds them afterwards; bits must agree.
  const int32_t n_tok = 700, n_heads = 4, n_kv_heads = 2, head_dim = 64;
  for (auto level : test::simd_levels()) {
    test::SimdCap cap(level);
    SCOPED_TRACE(test::level_name(level));
    for (auto [window, softcap] : {std::pair{0, 0.0f}, std::pair{300, 20.0f}}) {
      const test::PagedKv kv(n_tok, 16, n_kv_heads, head_dim, head_dim, 70);
      const auto q = random_floats(size_t(n_tok) * n_heads * head_dim, 71, -2.0f, 2.0f);
      const size_t n_out = size_t(n_tok) * n_heads * head_dim;
      ThreadPool pool2(2), pool3(3), pool1(1);
      std::vector<float> at_once(n_out), pieces(n_out, NAN);
      attention_chunk(pool2, kv, q, 0, n_tok, n_heads, n_kv_heads, head_dim, window, softcap, at_once);
      attention_chunk(pool3, kv, q, 0, 650, n_heads, n_kv_heads, head_dim, window, softcap, pieces);
      attention_chunk(pool2, kv, q, 650, 3, n_heads, n_kv_heads, head_dim, window, softcap, pieces);
      for (int32_t t = 653; t < n_tok; ++t)
        attention_chunk(t % 3 == 0 ? pool1 : pool3, kv, q, t, 1, n_heads, n_kv_heads, head_dim, window, softcap,
                        pieces);
      EXPECT_TRUE(bitwise_equal(at_once.data(), pieces.data(), n_out)) << "window " << window;
    }
  }
}

}  // namespace
}  // namespace strata
