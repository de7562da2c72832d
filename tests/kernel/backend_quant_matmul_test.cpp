// The CPU's dequantize-in-kernel matmul (int8 / int4 group-affine, e4m3 with group scales)
// against reference::quant_matmul at every SIMD level this CPU supports, on random shapes with
// ragged panels, a short last group and odd k. Tolerance: none. Every level dequantizes an
// element exactly as the reference does and fma-accumulates along k in the same order from 0,
// and an fma rounds identically everywhere, so the results are bitwise equal; a second check in
// double against the dequantized matrix guards the reference itself (bound: k * 2^-24 relative
// to the sum of |x * w|, the f32 summation error).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/cpu_ops.h"
#include "backend/reference/quant_matmul.h"
#include "backend_test_util.h"

namespace strata {
namespace {

using test::random_floats;

struct QuantCase {
  int64_t m, k, n;
  int32_t group;
};

struct Source {
  std::vector<uint8_t> codes;
  std::vector<float> scales, biases;
  cpu::QuantWeightSource view;
};

Source random_source(WeightQuant q, int64_t n, int64_t k, int32_t group, uint64_t seed) {
  Source s;
  std::mt19937_64 rng(seed);
  s.codes.resize(size_t(n * k));
  for (auto& c : s.codes) {
    if (q == WeightQuant::kAffine4) c = uint8_t(rng() % 16);
    else if (q == WeightQuant::kAffine8) c = uint8_t(rng() % 256);
    else do c = uint8_t(rng() % 256); while ((c & 0x7F) == 0x7F);  // e4m3fn NaN codes are not weights
  }
  const int64_t groups = (k + group - 1) / group;
  s.scales = random_floats(size_t(n * groups), seed + 1, 0.001f, 0.1f);
  if (q != WeightQuant::kFp8) s.biases = random_floats(size_t(n * groups), seed + 2, -0.5f, 0.5f);
  s.view.quant = q;
  s.view.codes = s.codes.data();
  s.view.scales = s.scales.data();
  s.view.biases = q == WeightQuant::kFp8 ? nullptr : s.biases.data();
  s.view.group = group;
  return s;
}

const char* quant_name(WeightQuant q) {
  switch (q) {
    case WeightQuant::kAffine8: return "affine8";
    case WeightQuant::kAffine4: return "affine4";
    case WeightQuant::kFp8: return "fp8";
    case WeightQuant::kNone: break;
  }
  return "none";
}

const QuantCase kCases[] = {{1, 64, 16, 32},   {1, 70, 33, 32},    {2, 31, 5, 16},    {3, 128, 17, 128},
                            {8, 256, 47, 64},  {9, 300, 64, 128},  {16, 1030, 40, 64}, {17, 520, 70, 32},
                            {40, 96, 130, 32}, {100, 257, 33, 64}, {600, 72, 40, 128}, {33, 700, 200, 128}};

TEST(BackendQuantMatmul, EqualsReferenceBitwiseAtEveryLevel) {
  ThreadPool pool(2);
  uint64_t seed = 100;
  for (WeightQuant q : {WeightQuant::kAffine8, WeightQuant::kAffine4, WeightQuant::kFp8}) {
    for (const QuantCase& c : kCases) {
      seed += 7;
      const Source src = random_source(q, c.n, c.k, c.group, seed);
      const auto x = random_floats(size_t(c.m * c.k), seed + 3);
      const auto bias = random_floats(size_t(c.n), seed + 4);
      const bool with_bias = (seed & 1) != 0;
      std::vector<float> want(size_t(c.m * c.n));
      reference::quant_matmul(x.data(), c.m, c.k, src.view, c.n, with_bias ? bias.data() : nullptr, want.data());
      const std::string label = std::string(quant_name(q)) + " m=" + std::to_string(c.m) + " k=" + std::to_string(c.k) +
                                " n=" + std::to_string(c.n) + " group=" + std::to_string(c.group);
      // The reference in double against the dequantized matrix.
      for (int64_t i = 0; i < c.m; i += std::max<int64_t>(1, c.m / 3)) {
        for (int64_t j = 0; j < c.n; ++j) {
          double exact = with_bias ? bias[size_t(j)] : 0.0, mag = std::fabs(exact);
          for (int64_t p = 0; p < c.k; ++p) {
            const double t = double(x[size_t(i * c.k + p)]) * double(reference::quant_weight(src.view, c.k, j, p));
            exact += t;
            mag += std::fabs(t);
          }
          ASSERT_LE(std::fabs(double(want[size_t(i * c.n + j)]) - exact), double(c.k + 1) * 0x1p-24 * mag) << label;
        }
      }
      const WeightMatrix w = cpu::pack_quant_weight(src.view, c.n, c.k);
      ASSERT_TRUE(w.quantized());
      for (auto level : test::simd_levels()) {
        test::SimdCap cap(level);
        std::vector<float> got(want.size(), NAN);
        cpu::matmul(pool, x.data(), c.m, w, with_bias ? bias.data() : nullptr, got.data());
        EXPECT_TRUE(test::bitwise_equal(got.data(), want.data(), got.size()))
            << label << " " << test::level_name(level)
            << " max rel error " << test::max_rel_error(got.data(), want.data(), got.size());
      }
    }
  }
}

TEST(BackendQuantMatmul, RowOfABatchEqualsTheRowAlone) {
  // m = 40 takes the dequantize-to-scratch path, m = 1 the in-register one: same values.
  ThreadPool pool(2);
  for (WeightQuant q : {WeightQuant::kAffine8, WeightQuant::kAffine4, WeightQuant::kFp8}) {
    const int64_t m = 40, k = 300, n = 70;
    const Source src = random_source(q, n, k, 64, 900 + uint64_t(q));
    const WeightMatrix w = cpu::pack_quant_weight(src.view, n, k);
    const auto x = random_floats(size_t(m * k), 901);
    std::vector<float> all(static_cast<size_t>(m * n)), one(static_cast<size_t>(n));
    cpu::matmul(pool, x.data(), m, w, nullptr, all.data());
    for (int64_t i : {0, 7, 39}) {
      cpu::matmul(pool, x.data() + i * k, 1, w, nullptr, one.data());
      EXPECT_TRUE(test::bitwise_equal(one.data(), all.data() + i * n, size_t(n))) << quant_name(q) << " row " << i;
    }
  }
}

TEST(BackendQuantMatmul, WeightRowAndBytes) {
  for (WeightQuant q : {WeightQuant::kAffine8, WeightQuant::kAffine4, WeightQuant::kFp8}) {
    const int64_t n = 37, k = 90;
    const int32_t group = 32;
    const Source src = random_source(q, n, k, group, 500 + uint64_t(q));
    const WeightMatrix w = cpu::pack_quant_weight(src.view, n, k);
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t r : {0, 15, 16, 36}) {
      cpu::weight_row(w, r, row.data());
      for (int64_t p = 0; p < k; ++p) ASSERT_EQ(row[size_t(p)], reference::quant_weight(src.view, k, r, p)) << quant_name(q);
    }
    // 3 panels of 16 rows; codes one byte (or a nibble) per element, then f32 scales (and biases)
    // per (row, group) of 3 groups.
    const int64_t code_bytes = q == WeightQuant::kAffine4 ? 48 * 45 : 48 * 90;
    const int64_t scale_bytes = 48 * 3 * 4 * (q == WeightQuant::kFp8 ? 1 : 2);
    EXPECT_EQ(cpu::weight_bytes(w), code_bytes + scale_bytes) << quant_name(q);
  }
}

}  // namespace
}  // namespace strata
