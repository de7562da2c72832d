// RoPE inverse frequencies per rope_type, checked against the defining formulas and the
// properties transformers' modeling_rope_utils guarantees.
#include <gtest/gtest.h>

#include <cmath>

#include "model/rope.h"

namespace strata {
namespace {

RopeConfig rope(const std::string& type, double theta = 10000.0) {
  RopeConfig r;
  r.type = type;
  r.theta = theta;
  return r;
}

std::vector<double> plain(double theta, int dim) {
  std::vector<double> f;
  for (int i = 0; i < dim / 2; ++i) f.push_back(1.0 / std::pow(theta, 2.0 * i / dim));
  return f;
}

TEST(Rope, Default) {
  auto t = compute_rope(rope("default"), 64, 4096);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->rot_dim, 64);
  const auto ref = plain(10000.0, 64);
  ASSERT_EQ(t->inv_freq.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(t->inv_freq[i], ref[i], 1e-6 * ref[i] + 1e-12);
  EXPECT_EQ(t->attn_factor, 1.0f);
}

TEST(Rope, PartialRotary) {
  RopeConfig r = rope("default");
  r.partial_rotary_factor = 0.25;
  auto t = compute_rope(r, 32, 4096);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->rot_dim, 8);
  const auto ref = plain(10000.0, 8);
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(t->inv_freq[i], ref[i], 1e-6 * ref[i]);
}

TEST(Rope, Linear) {
  RopeConfig r = rope("linear");
  r.factor = 4.0;
  auto t = compute_rope(r, 16, 4096);
  ASSERT_TRUE(t.ok());
  const auto ref = plain(10000.0, 16);
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(t->inv_freq[i], ref[i] / 4.0, 1e-6 * ref[i]);
}

TEST(Rope, DynamicEqualsDefaultUpToMaxPosition) {
  RopeConfig r = rope("dynamic");
  r.factor = 2.0;
  auto p = RopeProvider::create(r, 16, 64);
  ASSERT_TRUE(p.ok());
  const auto ref = plain(10000.0, 16);
  const RopeTable& inside = p->table(64);
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(inside.inv_freq[i], ref[i], 1e-6 * ref[i]);
  // Past max_position the base grows: theta * (factor * L / max - (factor - 1))^(dim / (dim - 2)).
  const RopeTable& past = p->table(128);
  const double theta = 10000.0 * std::pow(2.0 * 128 / 64 - 1.0, 16.0 / 14.0);
  const auto grown = plain(theta, 16);
  for (size_t i = 0; i < grown.size(); ++i) EXPECT_NEAR(past.inv_freq[i], grown[i], 1e-5 * grown[i]);
  EXPECT_LT(past.inv_freq[7], inside.inv_freq[7]);
}

TEST(Rope, YarnRampAndMscale) {
  RopeConfig r = rope("yarn", 1000000.0);
  r.factor = 4.0;
  r.original_max_position = 32;
  const int dim = 32;
  auto t = compute_rope(r, dim, 4096);
  ASSERT_TRUE(t.ok());
  EXPECT_NEAR(t->attn_factor, 0.1 * std::log(4.0) + 1.0, 1e-6);
  // Correction range from beta_fast = 32, beta_slow = 1 rotations over 32 positions.
  auto corr = [&](double rot) { return dim * std::log(32.0 / (rot * 2 * M_PI)) / (2 * std::log(1e6)); };
  const double low = std::max(0.0, std::floor(corr(32.0)));
  const double high = std::min(double(dim - 1), std::ceil(corr(1.0)));
  const auto ref = plain(1e6, dim);
  for (int i = 0; i < dim / 2; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double want = ref[size_t(i)] / 4.0 * ramp + ref[size_t(i)] * (1.0 - ramp);
    EXPECT_NEAR(t->inv_freq[size_t(i)], want, 1e-5 * want) << i;
  }
  r.attention_factor = 1.5;
  auto t2 = compute_rope(r, dim, 4096);
  ASSERT_TRUE(t2.ok());
  EXPECT_FLOAT_EQ(t2->attn_factor, 1.5f);
}

TEST(Rope, Llama3Bands) {
  RopeConfig r = rope("llama3", 500000.0);
  r.factor = 8.0;
  r.original_max_position = 64;
  auto t = compute_rope(r, 16, 4096);
  ASSERT_TRUE(t.ok());
  const auto ref = plain(500000.0, 16);
  const double low_wl = 64.0 / 1.0, high_wl = 64.0 / 4.0;
  int n_high = 0, n_low = 0, n_mid = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double wl = 2 * M_PI / ref[i];
    if (wl < high_wl) {
      EXPECT_NEAR(t->inv_freq[i], ref[i], 1e-6 * ref[i]);
      ++n_high;
    } else if (wl > low_wl) {
      EXPECT_NEAR(t->inv_freq[i], ref[i] / 8.0, 1e-6 * ref[i]);
      ++n_low;
    } else {
      const double s = (64.0 / wl - 1.0) / (4.0 - 1.0);
      EXPECT_NEAR(t->inv_freq[i], (1 - s) * ref[i] / 8.0 + s * ref[i], 1e-5 * ref[i]);
      ++n_mid;
    }
  }
  EXPECT_GT(n_high, 0);
  EXPECT_GT(n_low, 0);
}

TEST(Rope, ProportionalKeepsHeadDimWithZeroTail) {
  RopeConfig r = rope("proportional", 1000000.0);
  r.partial_rotary_factor = 0.25;
  auto t = compute_rope(r, 64, 4096);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->rot_dim, 64);
  ASSERT_EQ(t->inv_freq.size(), 32u);
  for (int i = 0; i < 8; ++i) {
    EXPECT_NEAR(t->inv_freq[size_t(i)], 1.0 / std::pow(1e6, 2.0 * i / 64), 1e-6) << i;
  }
  for (int i = 8; i < 32; ++i) EXPECT_EQ(t->inv_freq[size_t(i)], 0.0f) << i;
}

TEST(Rope, RejectsOddRotaryDim) {
  RopeConfig r = rope("default");
  r.partial_rotary_factor = 0.3;
  EXPECT_FALSE(compute_rope(r, 10, 4096).ok());
}

}  // namespace
}  // namespace strata
