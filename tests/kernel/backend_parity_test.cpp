// Every cpu:: kernel against its reference:: twin on random data, at every SIMD level this
// CPU supports. Tolerance: relative max-norm error 1e-5 in f32 unless stated.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_ops.h"
#include "backend/reference/reference_ops.h"
#include "backend_test_util.h"

namespace strata {
namespace {

using test::max_rel_error;
using test::random_floats;

constexpr double kTol = 1e-5;

std::vector<uint16_t> to_half_bits(const std::vector<float>& v, DType t) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = t == DType::kBF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
  return out;
}

struct MatmulShape {
  int64_t m, k, n;
};

void check_matmul(ThreadPool& pool, DType dt, MatmulShape s, bool with_bias, uint64_t seed) {
  const auto x = random_floats(size_t(s.m * s.k), seed);
  const auto wf = random_floats(size_t(s.n * s.k), seed + 1);
  const auto bias = random_floats(size_t(s.n), seed + 2);
  std::vector<uint16_t> wh;
  const void* wsrc = wf.data();
  if (dt != DType::kF32) {
    wh = to_half_bits(wf, dt);
    wsrc = wh.data();
  }
  std::vector<float> want(size_t(s.m * s.n)), got(size_t(s.m * s.n), NAN);
  reference::matmul(x.data(), s.m, s.k, dt, wsrc, s.n, with_bias ? bias.data() : nullptr, want.data());
  const WeightMatrix w = cpu::pack_weight(dt, wsrc, s.n, s.k);
  cpu::matmul(pool, x.data(), s.m, w, with_bias ? bias.data() : nullptr, got.data());
  EXPECT_LE(max_rel_error(got.data(), want.data(), got.size()), kTol)
      << dtype_name(dt) << " m=" << s.m << " k=" << s.k << " n=" << s.n << " bias=" << with_bias;
}

TEST(BackendParity, Matmul) {
  ThreadPool pool(2);
  const MatmulShape shapes[] = {{1, 1, 1},    {1, 17, 1},    {2, 31, 5},     {3, 16, 16},   {4, 100, 33},
                                {5, 1024, 48}, {7, 64, 17},  {8, 129, 47},   {9, 257, 64},  {13, 70, 130},
                                {31, 300, 31}, {64, 256, 96}, {100, 33, 200}, {600, 72, 40}, {513, 1030, 70}};
  for (auto level : test::simd_levels()) {
    test::SimdCap cap(level);
    SCOPED_TRACE(test::level_name(level));
    uint64_t seed = 10;
    for (const auto& s : shapes) {
      for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
        check_matmul(pool, dt, s, (seed & 1) != 0, seed);
        seed += 3;
      }
    }
  }
}

TEST(BackendParity, MatmulLargePrefill) {
  ThreadPool pool(2);
  check_matmul(pool, DType::kBF16, {512, 1024, 256}, false, 77);
  check_matmul(pool, DType::kF32, {300, 1500, 100}, true, 78);
}

TEST(BackendParity, MatmulPlainRowMajorWeight) {
  // A hand-made layout-0 matrix (no packing) must also be accepted.
  ThreadPool pool(2);
  const int64_t m = 5, k = 37, n = 21;
  const auto x = random_floats(size_t(m * k), 1);
  const auto wf = random_floats(size_t(n * k), 2);
  WeightMatrix w;
  w.dtype = DType::kF32;
  w.rows = n;
  w.cols = k;
  w.data = wf.data();
  std::vector<float> want(size_t(m * n)), got(size_t(m * n));
  reference::matmul(x.data(), m, k, DType::kF32, wf.data(), n, nullptr, want.data());
  cpu::matmul(pool, x.data(), m, w, nullptr, got.data());
  EXPECT_LE(max_rel_error(got.data(), want.data(), got.size()), kTol);
}

TEST(BackendParity, PackF16EqualsF32Widening) {
  ThreadPool pool(1);
  const int64_t rows = 37, cols = 45;
  auto wf = random_floats(size_t(rows * cols), 5, -4.0f, 4.0f);
  const auto wh = to_half_bits(wf, DType::kF16);
  std::vector<float> widened(wh.size());
  for (size_t i = 0; i < wh.size(); ++i) widened[i] = f16_to_f32(wh[i]);
  const WeightMatrix a = cpu::pack_weight(DType::kF16, wh.data(), rows, cols);
  const WeightMatrix b = cpu::pack_weight(DType::kF32, widened.data(), rows, cols);
  ASSERT_EQ(a.dtype, DType::kF32);
  ASSERT_EQ(a.layout, b.layout);
  std::vector<float> ra(static_cast<size_t>(cols)), rb(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    cpu::weight_row(a, r, ra.data());
    cpu::weight_row(b, r, rb.data());
    ASSERT_TRUE(test::bitwise_equal(ra.data(), rb.data(), ra.size())) << "row " << r;
    ASSERT_TRUE(test::bitwise_equal(ra.data(), widened.data() + r * cols, ra.size())) << "row " << r;
  }
  const auto x = random_floats(size_t(3 * cols), 6);
  std::vector<float> ya(size_t(3 * rows)), yb(size_t(3 * rows));
  cpu::matmul(pool, x.data(), 3, a, nullptr, ya.data());
  cpu::matmul(pool, x.data(), 3, b, nullptr, yb.data());
  EXPECT_TRUE(test::bitwise_equal(ya.data(), yb.data(), ya.size()));
}

TEST(BackendParity, WeightRowRecoversBf16Source) {
  const int64_t rows = 50, cols = 19;
  const auto wh = to_half_bits(random_floats(size_t(rows * cols), 8), DType::kBF16);
  const WeightMatrix w = cpu::pack_weight(DType::kBF16, wh.data(), rows, cols);
  EXPECT_EQ(w.dtype, DType::kBF16);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    cpu::weight_row(w, r, row.data());
    for (int64_t p = 0; p < cols; ++p) ASSERT_EQ(row[size_t(p)], bf16_to_f32(wh[size_t(r * cols + p)]));
  }
}

TEST(BackendParity, RmsNorm) {
  ThreadPool pool(2);
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {3, 7}, {5, 1024}, {17, 33}, {2, 4099}, {64, 128}};
  for (auto level : test::simd_levels()) {
    test::SimdCap cap(level);
    SCOPED_TRACE(test::level_name(level));
    uint64_t seed = 100;
    for (auto [rows, dim] : shapes) {
      for (int mode = 0; mode < 3; ++mode) {
        const auto x = random_floats(size_t(rows * dim), seed++, -3.0f, 3.0f);
        const auto w = random_floats(size_t(dim), seed++);
        const float* wp = mode == 0 ? nullptr : w.data();
        std::vector<float> want(x.size()), got = x;
        reference::rms_norm(x.data(), wp, want.data(), rows, dim, 1e-6f, mode == 2);
        cpu::rms_norm(pool, got.data(), wp, got.data(), rows, dim, 1e-6f, mode == 2);  // in place
        EXPECT_LE(max_rel_error(got.data(), want.data(), got.size()), kTol) << rows << "x" << dim << " mode " << mode;
      }
    }
  }
}

TEST(BackendParity, GatedAct) {
  ThreadPool pool(2);
  for (auto level : test::simd_levels()) {
    test::SimdCap cap(level);
    SCOPED_TRACE(test::level_name(level));
    uint64_t seed = 200;
    for (int64_t n : {1, 15, 16, 17, 1000, 100003}) {
      for (auto act : {cpu::Activation::kSilu, cpu::Activation::kGeluTanh}) {
        const auto gate = random_floats(size_t(n), seed++, -12.0f, 12.0f);
        const auto up = random_floats(size_t(n), seed++, -2.0f, 2.0f);
        std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
        reference::gated_act(gate.data(), up.data(), want.data(), n, act);
        cpu::gated_act(pool, gate.data(), up.data(), got.data(), n, act);
        // Elementwise relative error, so small outputs are checked too.
        double worst = 0.0;
        for (int64_t i = 0; i < n; ++i)
          worst = std::max(worst, std::fabs(double(got[size_t(i)]) - want[size_t(i)]) /
                                      std::max(1e-3, std::fabs(double(want[size_t(i)]))));
        EXPECT_LE(worst, kTol) << "n=" << n << " act=" << int(act);
      }
    }
  }
}

TEST(BackendParity, ElementwiseHelpers) {
  ThreadPool pool(2);
  for (auto level : test::simd_levels()) {
    test::SimdCap cap(level);
    SCOPED_TRACE(test::level_name(level));
    uint64_t seed = 250;
    for (int64_t n : {1, 7, 16, 33, 40000}) {
      const auto a = random_floats(size_t(n), seed++, -9.0f, 9.0f);
      const auto b = random_floats(size_t(n), seed++, -3.0f, 3.0f);
      std::vector<float> want(a.size()), got(a.size());
      reference::add(a.data(), b.data(), want.data(), n);
      got = a;
      cpu::add(pool, got.data(), b.data(), got.data(), n);  // in place, as a residual add
      EXPECT_EQ(got, want) << "add n=" << n;
      reference::mul(a.data(), b.data(), want.data(), n);
      cpu::mul(pool, a.data(), b.data(), got.data(), n);
      EXPECT_EQ(got, want) << "mul n=" << n;
      for (auto act : {cpu::Activation::kSilu, cpu::Activation::kGeluTanh}) {
        reference::activation(a.data(), want.data(), n, act);
        cpu::activation(pool, a.data(), got.data(), n, act);
        double worst = 0.0;
        for (size_t i = 0; i < got.size(); ++i)
          worst = std::max(worst, std::fabs(double(got[i]) - want[i]) / std::max(1e-3, std::fabs(double(want[i]))));
        EXPECT_LE(worst, kTol) << "activation n=" << n << " act=" << int(act);
      }
    }
    for (auto [rows, dim] : {std::pair<int64_t, int64_t>{1, 1}, {3, 5}, {4, 64}, {9, 1000}, {2, 151936}}) {
      const auto x = random_floats(size_t(rows * dim), seed++, -20.0f, 20.0f);
      std::vector<float> want(x.size()), got = x;
      reference::softmax(x.data(), want.data(), rows, dim);
      cpu::softmax(pool, got.data(), got.data(), rows, dim);
      EXPECT_LE(max_rel_error(got.data(), want.data(), got.size()), kTol) << "softmax " << rows << "x" << dim;
      // Each row sums to one.
      for (int64_t r = 0; r < rows; ++r) {
        double s = 0.0;
        for (int64_t i = 0; i < dim; ++i) s += got[size_t(r * dim + i)];
        EXPECT_NEAR(s, 1.0, 1e-5) << "row " << r;
      }
    }
  }
}

TEST(BackendParity, Rope) {
  ThreadPool pool(2);
  struct Shape {
    int64_t n_tokens, n_heads, head_dim, rot_dim;
  };
  const Shape shapes[] = {{1, 1, 8, 8}, {3, 2, 16, 16}, {7, 4, 64, 64}, {5, 3, 128, 32}, {9, 2, 256, 256},
                          {4, 8, 128, 128}, {2, 5, 80, 40}, {6, 1, 64, 16}};
  for (auto level : test::simd_levels()) {
    test::SimdCap cap(level);
    SCOPED_TRACE(test::level_name(level));
    uint64_t seed = 300;
    for (const auto& s : shapes) {
      for (float attn_factor : {1.0f, 1.25f}) {
        auto x = random_floats(size_t(s.n_tokens * s.n_heads * s.head_dim), seed++);
        std::vector<int32_t> pos(size_t(s.n_tokens));
        std::mt19937 rng(uint32_t(seed++));
        for (auto& p : pos) p = int32_t(rng() % 40000);
        std::vector<float> inv_freq(size_t(s.rot_dim / 2));
        for (size_t i = 0; i < inv_freq.size(); ++i)
          inv_freq[i] = std::pow(1000000.0f, -2.0f * float(i) / float(s.rot_dim));
        auto want = x, got = x;
        reference::rope(want.data(), s.n_tokens, s.n_heads, s.head_dim, s.rot_dim, pos.data(), inv_freq.data(),
                        attn_factor);
        cpu::rope(pool, got.data(), s.n_tokens, s.n_heads, s.head_dim, s.rot_dim, pos.data(), inv_freq.data(),
                  attn_factor);
        EXPECT_LE(max_rel_error(got.data(), want.data(), got.size()), kTol)
            << s.n_tokens << "x" << s.n_heads << "x" << s.head_dim << " rot " << s.rot_dim;
        // Dims past rot_dim are untouched.
        for (int64_t r = 0; r < s.n_tokens * s.n_heads; ++r)
          for (int64_t d = s.rot_dim; d < s.head_dim; ++d)
            ASSERT_EQ(got[size_t(r * s.head_dim + d)], x[size_t(r * s.head_dim + d)]);
      }
    }
  }
}

struct AttnCase {
  int32_t n_q, pos0, n_heads, n_kv_heads, head_dim, head_dim_v, block_size, window;
  float softcap;
};

void check_attention(ThreadPool& pool, const AttnCase& c, uint64_t seed) {
  const int32_t n_pos = c.pos0 + c.n_q;
  test::PagedKv kv(n_pos, c.block_size, c.n_kv_heads, c.head_dim, c.head_dim_v, seed);
  const auto q = random_floats(size_t(c.n_q) * c.n_heads * c.head_dim, seed + 7, -2.0f, 2.0f);
  std::vector<float> want(size_t(c.n_q) * c.n_heads * c.head_dim_v), got(want.size(), NAN);
  cpu::PagedAttentionArgs a{};
  a.q = q.data();
  a.k_pool = kv.k_pool.data();
  a.v_pool = kv.v_pool.data();
  a.block_table = kv.block_table.data();
  a.block_size = c.block_size;
  a.n_q = c.n_q;
  a.pos0 = c.pos0;
  a.n_heads = c.n_heads;
  a.n_kv_heads = c.n_kv_heads;
  a.head_dim = c.head_dim;
  a.head_dim_v = c.head_dim_v;
  a.scale = 1.0f / std::sqrt(float(c.head_dim));
  a.softcap = c.softcap;
  a.window = c.window;
  a.out = want.data();
  reference::paged_attention(a);
  a.out = got.data();
  cpu::paged_attention(pool, a);
  EXPECT_LE(max_rel_error(got.data(), want.data(), got.size()), kTol)
      << "n_q=" << c.n_q << " pos0=" << c.pos0 << " heads=" << c.n_heads << "/" << c.n_kv_heads
      << " hd=" << c.head_dim << "/" << c.head_dim_v << " bs=" << c.block_size << " window=" << c.window
      << " softcap=" << c.softcap;
}

TEST(BackendParity, PagedAttention) {
  ThreadPool pool(2);
  const AttnCase cases[] = {
      {1, 0, 1, 1, 8, 8, 16, 0, 0.0f},       {1, 37, 4, 2, 16, 16, 16, 0, 0.0f},
      {13, 0, 4, 1, 32, 32, 5, 0, 0.0f},     {13, 37, 8, 2, 64, 64, 16, 0, 0.0f},
      {5, 100, 2, 2, 128, 128, 16, 0, 30.0f}, {3, 60, 4, 4, 256, 256, 32, 0, 0.0f},
      {20, 10, 4, 2, 64, 64, 1, 7, 0.0f},     {9, 200, 6, 3, 128, 128, 16, 50, 50.0f},
      {4, 3, 2, 1, 24, 40, 3, 0, 0.0f},       {1, 513, 16, 8, 128, 128, 16, 0, 0.0f},
      {7, 0, 3, 3, 80, 80, 16, 4, 20.0f},     {64, 0, 2, 1, 256, 256, 16, 0, 0.0f},
      {2, 900, 4, 2, 64, 64, 16, 0, 0.0f},    {1, 1500, 8, 1, 128, 128, 32, 0, 30.0f},
      {3, 1000, 2, 1, 32, 32, 16, 600, 0.0f}, {40, 300, 4, 4, 16, 16, 7, 0, 0.0f},
  };
  for (auto level : test::simd_levels()) {
    test::SimdCap cap(level);
    SCOPED_TRACE(test::level_name(level));
    uint64_t seed = 400;
    for (const auto& c : cases) check_attention(pool, c, seed += 11);
  }
}

}  // namespace
}  // namespace strata
