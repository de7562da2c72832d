// Gated-DeltaNet kernels: cpu against the scalar reference, the chunked (prefill) form against
// the recurrent (decode) one at every SIMD level, and state carried across calls against one
// call over the whole span.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/conv1d.h"
#include "backend/cpu/delta_net.h"
#include "backend/reference/conv1d.h"
#include "backend/reference/delta_net.h"
#include "backend_test_util.h"

namespace strata {
namespace {

std::vector<float> random_vec(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// max|got - ref| / max|ref|
double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  EXPECT_EQ(got.size(), ref.size());
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, double(std::fabs(got[i] - ref[i])));
    scale = std::max(scale, double(std::fabs(ref[i])));
  }
  return scale > 0.0 ? diff / scale : diff;
}

// ---------------------------------------------------------------- conv1d

struct ConvCase {
  int32_t channels = 40, kernel = 4;
  std::vector<float> weight, bias, state0;
};

ConvCase make_conv(std::mt19937& rng, bool with_bias) {
  ConvCase c;
  c.weight = random_vec(size_t(c.channels * c.kernel), rng);
  if (with_bias) c.bias = random_vec(size_t(c.channels), rng);
  c.state0 = random_vec(size_t((c.kernel - 1) * c.channels), rng);
  return c;
}

// Runs the conv over x [n, x_stride] in the given call lengths, returns (outputs, final state).
template <class Fn>
std::pair<std::vector<float>, std::vector<float>> run_conv(const ConvCase& c, const std::vector<float>& x,
                                                           int64_t x_stride, const std::vector<int>& splits, Fn fn) {
  int n = 0;
  for (int s : splits) n += s;
  std::vector<float> y(size_t(n) * c.channels), state = c.state0;
  int t0 = 0;
  for (int len : splits) {
    cpu::CausalConv1dArgs a{};
    a.x = x.data() + size_t(t0) * x_stride;
    a.y = y.data() + size_t(t0) * c.channels;
    a.state = state.data();
    a.weight = c.weight.data();
    a.bias = c.bias.empty() ? nullptr : c.bias.data();
    a.x_stride = x_stride;
    a.n_tokens = len;
    a.channels = c.channels;
    a.kernel = c.kernel;
    a.silu = true;
    fn(a);
    t0 += len;
  }
  return {y, state};
}

TEST(CausalConv1d, ReferenceMatchesDirectFormula) {
  std::mt19937 rng(1);
  ConvCase c = make_conv(rng, true);
  const int n = 6;
  auto x = random_vec(size_t(n) * c.channels, rng);
  auto [y, state] = run_conv(c, x, c.channels, {n}, [](const auto& a) { reference::causal_conv1d(a); });
  // out[t, ch] = silu(bias + sum_j w[ch, j] * in[t - 3 + j]) with in[-3..-1] from the state.
  for (int t = 0; t < n; ++t)
    for (int ch = 0; ch < c.channels; ++ch) {
      double acc = c.bias[ch];
      for (int j = 0; j < c.kernel; ++j) {
        const int src = t - (c.kernel - 1) + j;
        const float in = src >= 0 ? x[size_t(src) * c.channels + ch] : c.state0[size_t(c.kernel - 1 + src) * c.channels + ch];
        acc += double(c.weight[size_t(ch) * c.kernel + j]) * in;
      }
      const double want = acc / (1.0 + std::exp(-acc));
      EXPECT_NEAR(y[size_t(t) * c.channels + ch], want, 1e-5);
    }
  // The new state is the last three inputs.
  for (int j = 0; j < c.kernel - 1; ++j)
    for (int ch = 0; ch < c.channels; ++ch)
      EXPECT_EQ(state[size_t(j) * c.channels + ch], x[size_t(n - 3 + j) * c.channels + ch]);
}

TEST(CausalConv1d, CpuMatchesReferenceAndSplitsMatchOneCall) {
  std::mt19937 rng(2);
  ThreadPool pool(3);
  for (bool bias : {false, true}) {
    ConvCase c = make_conv(rng, bias);
    const int n = 40;
    const int64_t stride = c.channels + 7;  // inputs are a slice of a wider projection row
    auto x = random_vec(size_t(n) * stride, rng);
    auto ref = run_conv(c, x, stride, {n}, [](const auto& a) { reference::causal_conv1d(a); });
    auto cpu_one = run_conv(c, x, stride, {n}, [&](const auto& a) { cpu::causal_conv1d(pool, a); });
    EXPECT_LE(rel_err(cpu_one.first, ref.first), 1e-6);
    EXPECT_LE(rel_err(cpu_one.second, ref.second), 0.0);
    std::vector<int> by_token(n, 1);
    for (const std::vector<int>& splits : {std::vector<int>{17, 23}, std::vector<int>{1, 2, 37}, by_token}) {
      auto cpu_split = run_conv(c, x, stride, splits, [&](const auto& a) { cpu::causal_conv1d(pool, a); });
      EXPECT_LE(rel_err(cpu_split.first, cpu_one.first), 1e-6);
      EXPECT_EQ(cpu_split.second, cpu_one.second);
      auto ref_split = run_conv(c, x, stride, splits, [](const auto& a) { reference::causal_conv1d(a); });
      EXPECT_LE(rel_err(ref_split.first, ref.first), 1e-7);
    }
  }
}

// ---------------------------------------------------------------- small kernels

TEST(DeltaNetSmallKernels, CpuMatchesReference) {
  std::mt19937 rng(3);
  ThreadPool pool(2);
  const int64_t T = 9, H = 3, D = 16, stride = 3 * H * D + 5;
  auto x = random_vec(size_t(T * stride), rng, -2.0f, 2.0f);
  auto xr = x, xc = x;
  reference::l2_norm_heads(xr.data(), T, H, D, stride, 1e-6f);
  cpu::l2_norm_heads(pool, xc.data(), T, H, D, stride, 1e-6f);
  EXPECT_LE(rel_err(xc, xr), 1e-6);
  for (int64_t t = 0; t < T; ++t)  // unit norm per head, untouched past the heads
    for (int64_t h = 0; h < H; ++h) {
      double ss = 0.0;
      for (int64_t i = 0; i < D; ++i) ss += double(xr[t * stride + h * D + i]) * xr[t * stride + h * D + i];
      EXPECT_NEAR(ss, 1.0, 1e-5);
      EXPECT_EQ(xr[t * stride + H * D], x[t * stride + H * D]);
    }

  auto ab = random_vec(size_t(T * 2 * H), rng, -25.0f, 25.0f);  // crosses softplus' linear threshold
  auto a_log = random_vec(size_t(H), rng, -1.0f, 2.0f), dt_bias = random_vec(size_t(H), rng);
  std::vector<float> gr(T * H), br(T * H), gc(T * H), bc(T * H);
  reference::delta_net_gates(ab.data() + H, ab.data(), 2 * H, a_log.data(), dt_bias.data(), gr.data(), br.data(), T, H);
  cpu::delta_net_gates(ab.data() + H, ab.data(), 2 * H, a_log.data(), dt_bias.data(), gc.data(), bc.data(), T, H);
  EXPECT_LE(rel_err(gc, gr), 1e-6);
  EXPECT_LE(rel_err(bc, br), 1e-6);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const double a = ab[t * 2 * H + H + h] + dt_bias[h];
      const double sp = a > 20.0 ? a : std::log1p(std::exp(a));
      EXPECT_NEAR(gr[t * H + h], -std::exp(a_log[h]) * sp, 1e-4 * std::max(1.0, double(std::fabs(gr[t * H + h]))));
      EXPECT_LE(gr[t * H + h], 0.0f);
    }

  auto core = random_vec(size_t(T * H * D), rng);
  auto z = random_vec(size_t(T * stride), rng, -3.0f, 3.0f);
  auto w = random_vec(size_t(D), rng);
  std::vector<float> yr(core.size()), yc(core.size());
  reference::gated_rms_norm(core.data(), z.data() + 7, stride, w.data(), yr.data(), T, H, D, 1e-6f);
  cpu::gated_rms_norm(pool, core.data(), z.data() + 7, stride, w.data(), yc.data(), T, H, D, 1e-6f);
  EXPECT_LE(rel_err(yc, yr), 1e-6);
}

// ---------------------------------------------------------------- gated delta rule

struct DeltaCase {
  int32_t n_tokens, n_k_heads, n_v_heads, d_k, d_v;
  int64_t stride;                 // floats per token of the packed q|k|v rows
  std::vector<float> qkv, g, beta, state0;
};

DeltaCase make_delta(std::mt19937& rng, int32_t n, int32_t nk, int32_t nv, int32_t dk, int32_t dv, float g_lo) {
  DeltaCase c{n, nk, nv, dk, dv, int64_t(2 * nk * dk + nv * dv + 3), {}, {}, {}, {}};
  c.qkv = random_vec(size_t(n) * c.stride, rng);
  reference::l2_norm_heads(c.qkv.data(), n, 2 * nk, dk, c.stride, 1e-6f);  // q and k heads
  c.g = random_vec(size_t(n) * nv, rng, g_lo, 0.0f);
  c.beta = random_vec(size_t(n) * nv, rng, 0.0f, 1.0f);
  c.state0 = random_vec(size_t(nv) * dk * dv, rng, -0.5f, 0.5f);
  return c;
}

// Runs the rule over the case in calls of the given lengths; returns (outputs, final state).
template <class Fn>
std::pair<std::vector<float>, std::vector<float>> run_delta(const DeltaCase& c, const std::vector<int>& splits, Fn fn,
                                                            int32_t pos0 = 0) {
  std::vector<float> out(size_t(c.n_tokens) * c.n_v_heads * c.d_v), state = c.state0;
  int t0 = 0;
  for (int len : splits) {
    cpu::GatedDeltaRuleArgs a{};
    a.q = c.qkv.data() + size_t(t0) * c.stride;
    a.k = a.q + c.n_k_heads * c.d_k;
    a.v = a.k + c.n_k_heads * c.d_k;
    a.qkv_stride = c.stride;
    a.g = c.g.data() + size_t(t0) * c.n_v_heads;
    a.beta = c.beta.data() + size_t(t0) * c.n_v_heads;
    a.state = state.data();
    a.out = out.data() + size_t(t0) * c.n_v_heads * c.d_v;
    a.n_tokens = len;
    a.n_k_heads = c.n_k_heads;
    a.n_v_heads = c.n_v_heads;
    a.d_k = c.d_k;
    a.d_v = c.d_v;
    a.pos0 = pos0 + t0;
    a.scale = 1.0f / std::sqrt(float(c.d_k));
    fn(a);
    t0 += len;
  }
  EXPECT_EQ(t0, c.n_tokens);
  return {out, state};
}

TEST(GatedDeltaRule, ReferenceMatchesHandComputedSteps) {
  // One head, d_k = d_v = 2. Zero state, one token: S = beta k v^T, o = scale (q.k) beta v.
  std::vector<float> q{0.6f, 0.8f}, k{1.0f, 0.0f}, v{2.0f, -1.0f}, g{std::log(0.5f)}, beta{0.25f};
  std::vector<float> state(4, 0.0f), out(2);
  std::vector<float> qkv{q[0], q[1], k[0], k[1], v[0], v[1]};
  cpu::GatedDeltaRuleArgs a{qkv.data(), qkv.data() + 2, qkv.data() + 4, 6, g.data(), beta.data(), state.data(),
                            out.data(), 1, 1, 1, 2, 2, 0, 0.5f};
  reference::gated_delta_rule(a);
  EXPECT_NEAR(out[0], 0.5f * 0.6f * 0.25f * 2.0f, 1e-7);
  EXPECT_NEAR(out[1], 0.5f * 0.6f * 0.25f * -1.0f, 1e-7);
  EXPECT_NEAR(state[0], 0.5f, 1e-7);   // S[0][0] = beta k0 v0
  EXPECT_NEAR(state[1], -0.25f, 1e-7);
  EXPECT_EQ(state[2], 0.0f);
  // Second token, same k and v: S <- 0.5 S; u = beta (v - S^T k) = 0.25 (v - 0.5 * 0.25 v).
  reference::gated_delta_rule(a);
  const float u0 = 0.25f * (2.0f - 0.25f), s00 = 0.25f + u0;
  EXPECT_NEAR(state[0], s00, 1e-6);
  EXPECT_NEAR(out[0], 0.5f * 0.6f * s00, 1e-6);
}

TEST(GatedDeltaRule, RecurrentAndChunkedMatchReference) {
  std::mt19937 rng(4);
  ThreadPool pool(3);
  struct Shape { int32_t n, nk, nv, dk, dv; float g_lo; };
  for (const Shape& s : {Shape{1, 1, 1, 16, 16, -1.0f}, Shape{40, 2, 4, 16, 16, -1.0f}, Shape{150, 2, 4, 16, 24, -0.05f},
                         Shape{130, 3, 3, 32, 8, -3.0f}, Shape{200, 1, 2, 64, 64, -0.02f}}) {
    DeltaCase c = make_delta(rng, s.n, s.nk, s.nv, s.dk, s.dv, s.g_lo);
    auto ref = run_delta(c, {s.n}, [](const auto& a) { reference::gated_delta_rule(a); });
    auto rec = run_delta(c, {s.n}, [&](const auto& a) { cpu::gated_delta_rule_recurrent(pool, a); });
    auto chk = run_delta(c, {s.n}, [&](const auto& a) { cpu::gated_delta_rule_chunked(pool, a); });
    SCOPED_TRACE(testing::Message() << "n=" << s.n << " nk=" << s.nk << " nv=" << s.nv << " dk=" << s.dk);
    EXPECT_LE(rel_err(rec.first, ref.first), 1e-5);
    EXPECT_LE(rel_err(rec.second, ref.second), 1e-5);
    EXPECT_LE(rel_err(chk.first, ref.first), 1e-5);
    EXPECT_LE(rel_err(chk.second, ref.second), 1e-5);
    EXPECT_LE(rel_err(chk.first, rec.first), 1e-5);
    EXPECT_LE(rel_err(chk.second, rec.second), 1e-5);
    // Small chunks and a start off a chunk boundary exercise partial blocks.
    auto chk8 = run_delta(c, {s.n}, [&](const auto& a) { cpu::gated_delta_rule_chunked(pool, a, 8); }, 5);
    EXPECT_LE(rel_err(chk8.first, ref.first), 1e-5);
    EXPECT_LE(rel_err(chk8.second, ref.second), 1e-5);
  }
}

TEST(GatedDeltaRule, StateCarriedAcrossCallsMatchesOneCall) {
  std::mt19937 rng(5);
  ThreadPool pool(2);
  DeltaCase c = make_delta(rng, 40, 2, 4, 16, 16, -0.3f);
  auto ref = run_delta(c, {40}, [](const auto& a) { reference::gated_delta_rule(a); });
  std::vector<int> by_token(40, 1);
  for (const std::vector<int>& splits : {std::vector<int>{17, 23}, std::vector<int>{3, 30, 7}, by_token}) {
    auto ref_split = run_delta(c, splits, [](const auto& a) { reference::gated_delta_rule(a); });
    EXPECT_LE(rel_err(ref_split.first, ref.first), 1e-6);
    auto rec = run_delta(c, splits, [&](const auto& a) { cpu::gated_delta_rule_recurrent(pool, a); });
    EXPECT_LE(rel_err(rec.first, ref.first), 1e-5);
    EXPECT_LE(rel_err(rec.second, ref.second), 1e-5);
    auto chk = run_delta(c, splits, [&](const auto& a) { cpu::gated_delta_rule_chunked(pool, a, 16); });
    EXPECT_LE(rel_err(chk.first, ref.first), 1e-5);
    EXPECT_LE(rel_err(chk.second, ref.second), 1e-5);
    auto mixed = run_delta(c, splits, [&](const auto& a) { cpu::gated_delta_rule(pool, a); });
    EXPECT_LE(rel_err(mixed.first, ref.first), 1e-5);
    EXPECT_LE(rel_err(mixed.second, ref.second), 1e-5);
  }
}

TEST(GatedDeltaRule, ThreadCountDoesNotChangeBits) {
  std::mt19937 rng(6);
  DeltaCase c = make_delta(rng, 70, 2, 4, 16, 16, -0.5f);
  ThreadPool one(1), three(3);
  auto a = run_delta(c, {70}, [&](const auto& x) { cpu::gated_delta_rule_chunked(one, x); });
  auto b = run_delta(c, {70}, [&](const auto& x) { cpu::gated_delta_rule_chunked(three, x); });
  EXPECT_EQ(a.first, b.first);
  EXPECT_EQ(a.second, b.second);
}

// The prefill form against the decode form at the model's head size, at every SIMD level:
// spans shorter than, equal to and longer than a chunk, starting on and off a chunk boundary,
// from a zero and from a random state, with mild and with steep decay.
// Bound: 1e-5 max-norm relative on outputs and final state, against both the f32 recurrent
// form and the f64 reference.
TEST(GatedDeltaRule, ChunkedMatchesRecurrentAtEveryLevel) {
  ThreadPool pool(2);
  std::mt19937 rng(11);
  for (int32_t n : {1, 17, 63, 64, 65, 130, 257}) {
    for (float g_lo : {-0.05f, -4.0f}) {
      for (bool zero_state : {false, true}) {
        DeltaCase c = make_delta(rng, n, 2, 4, 128, 128, g_lo);
        if (zero_state) std::fill(c.state0.begin(), c.state0.end(), 0.0f);
        for (int32_t pos0 : {0, 37}) {
          auto ref = run_delta(c, {n}, [](const auto& a) { reference::gated_delta_rule(a); }, pos0);
          for (cpu::detail::SimdLevel level : test::simd_levels()) {
            test::SimdCap cap(level);
            SCOPED_TRACE(testing::Message() << test::level_name(level) << " n=" << n << " g_lo=" << g_lo
                                            << " zero_state=" << zero_state << " pos0=" << pos0);
            auto rec = run_delta(c, {n}, [&](const auto& a) { cpu::gated_delta_rule_recurrent(pool, a); }, pos0);
            auto chk = run_delta(c, {n}, [&](const auto& a) { cpu::gated_delta_rule_chunked(pool, a); }, pos0);
            EXPECT_LE(rel_err(chk.first, rec.first), 1e-5);
            EXPECT_LE(rel_err(chk.second, rec.second), 1e-5);
            EXPECT_LE(rel_err(chk.first, ref.first), 1e-5);
            EXPECT_LE(rel_err(chk.second, ref.second), 1e-5);
            EXPECT_LE(rel_err(rec.first, ref.first), 1e-5);
            EXPECT_LE(rel_err(rec.second, ref.second), 1e-5);
            // The entry point picks one of the two; it must agree as well.
            auto entry = run_delta(c, {n}, [&](const auto& a) { cpu::gated_delta_rule(pool, a); }, pos0);
            EXPECT_LE(rel_err(entry.first, ref.first), 1e-5);
            EXPECT_LE(rel_err(entry.second, ref.second), 1e-5);
          }
        }
      }
    }
  }
}

// A wrong block would show up as an error of the order of the values, not of rounding: the
// chunked form must not agree with a run whose decays were perturbed (the test can fail).
TEST(GatedDeltaRule, ParityCheckDetectsAWrongDecay) {
  ThreadPool pool(2);
  std::mt19937 rng(12);
  DeltaCase c = make_delta(rng, 100, 2, 4, 32, 32, -0.5f);
  auto rec = run_delta(c, {100}, [&](const auto& a) { cpu::gated_delta_rule_recurrent(pool, a); });
  c.g[97 * 4 + 1] -= 0.1f;
  auto chk = run_delta(c, {100}, [&](const auto& a) { cpu::gated_delta_rule_chunked(pool, a); });
  EXPECT_GT(rel_err(chk.first, rec.first), 1e-3);
  EXPECT_GT(rel_err(chk.second, rec.second), 1e-3);
}

}  // namespace
}  // namespace strata
