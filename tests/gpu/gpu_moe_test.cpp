// The family kernels (family_kernels.h) and the MoE kernels (moe.h) against plain host code on
// random data: routing against the CPU's route_topk (model/layers/moe.h), the grouping's
// invariants, the whole expert chain (group, grouped GEMMs, gated activation, combine)
// against a host loop over the same bf16 values, the sandwich norm and the soft-cap.
// Max-norm relative error <= 1e-2 where bf16 rounds. Needs a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "backend/cuda/family_kernels.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/moe.h"
#include "gpu_test_util.h"
#include "model/layers/moe.h"

namespace strata::cuda {
namespace {

using namespace strata::gpu_test;

class GpuMoe : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  }
};

float silu(float x) { return x / (1.0f + std::exp(-x)); }
float gelu_tanh(float x) { return 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x))); }

TEST_F(GpuMoe, RouteMatchesTheCpuRouting) {
  const uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  struct Shape {
    int32_t n, experts, k;
    bool renorm, scale;
  };
  for (const Shape& sh : {Shape{1, 8, 2, true, false}, Shape{37, 8, 2, false, false}, Shape{300, 64, 8, true, false},
                          Shape{19, 128, 8, true, true}, Shape{5, 4, 4, true, false}}) {
    const auto logits = random_f32(rng, size_t(sh.n) * sh.experts, -4.0f, 4.0f);
    const auto scale = random_f32(rng, size_t(sh.experts), 0.5f, 2.0f);
    DeviceBuffer<float> d_logits(logits.size()), d_scale(scale.size()), d_w(size_t(sh.n) * sh.k);
    DeviceBuffer<int32_t> d_ids(size_t(sh.n) * sh.k);
    d_logits.upload(logits);
    d_scale.upload(scale);
    d_w.poison();
    launch_moe_route({d_logits.p, d_ids.p, d_w.p, sh.n, sh.experts, sh.k, sh.renorm ? 1 : 0, sh.scale ? d_scale.p : nullptr},
                     nullptr);
    std::vector<int32_t> ids(size_t(sh.n) * sh.k);
    std::vector<float> w(ids.size());
    route_topk(logits.data(), sh.n, sh.experts, sh.k, sh.renorm, ids.data(), w.data());
    if (sh.scale) {
      for (size_t i = 0; i < w.size(); ++i) w[i] *= scale[size_t(ids[i])];
    }
    EXPECT_EQ(d_ids.download(), ids) << "n " << sh.n << " experts " << sh.experts << " k " << sh.k;
    EXPECT_LE(max_norm_rel(d_w.download(), w), 1e-5) << "n " << sh.n << " experts " << sh.experts;
  }
}

// Routing with ties (equal logits): the lower id comes first, as in route_topk.
TEST_F(GpuMoe, RouteTiesTakeTheLowerId) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 0.0f, 3.0f, 2.0f};
  DeviceBuffer<float> d_logits(logits.size()), d_w(3);
  DeviceBuffer<int32_t> d_ids(3);
  d_logits.upload(logits);
  launch_moe_route({d_logits.p, d_ids.p, d_w.p, 1, 6, 3, 1, nullptr}, nullptr);
  EXPECT_EQ(d_ids.download(), (std::vector<int32_t>{1, 2, 4}));
}

struct ExpertCase {
  int32_t n, experts, k, hidden, inter;
  Act act;
};

// Random routing (distinct experts per token), random bf16 activations and experts; the device
// chain against a host loop in f32 over the same bf16 values (with the device's bf16
// rounding of the gate/up projections and of the activation).
void check_expert_chain(const ExpertCase& c, std::mt19937& rng) {
  const int64_t K = int64_t(c.n) * c.k;
  const size_t nk = static_cast<size_t>(K), ne = static_cast<size_t>(c.experts);
  std::vector<int32_t> ids(nk);
  std::vector<float> weights(nk);
  std::vector<int32_t> perm(ne);
  std::iota(perm.begin(), perm.end(), 0);
  std::uniform_real_distribution<float> uw(0.1f, 1.0f);
  for (int32_t t = 0; t < c.n; ++t) {
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int32_t j = 0; j < c.k; ++j) {
      ids[size_t(t * c.k + j)] = perm[size_t(j)];
      weights[size_t(t * c.k + j)] = uw(rng);
    }
  }
  const Bf16Data x = random_bf16(rng, size_t(c.n) * c.hidden, 1.0f);
  const Bf16Data gu = random_bf16(rng, size_t(c.experts) * 2 * c.inter * c.hidden, 0.2f);
  const Bf16Data dn = random_bf16(rng, size_t(c.experts) * c.hidden * c.inter, 0.2f);

  DeviceBuffer<int32_t> d_ids(nk), d_offsets(ne + 1), d_sorted(nk), d_slot_row(nk);
  DeviceBuffer<float> d_w(nk), d_y(nk * c.hidden), d_out(static_cast<size_t>(c.n) * c.hidden);
  DeviceBuffer<uint16_t> d_x(x.bits.size()), d_gu(gu.bits.size()), d_dn(dn.bits.size());
  DeviceBuffer<uint16_t> d_gate_up(nk * 2 * c.inter), d_act(nk * c.inter);
  d_ids.upload(ids);
  d_w.upload(weights);
  d_x.upload(x.bits);
  d_gu.upload(gu.bits);
  d_dn.upload(dn.bits);
  d_out.poison();
  launch_moe_group({d_ids.p, int32_t(K), c.experts, d_offsets.p, d_sorted.p, d_slot_row.p}, nullptr);
  launch_grouped_gemm({d_x.p, d_sorted.p, c.k, d_gu.p, d_offsets.p, d_gate_up.p, 0, c.experts, c.n, 2 * c.inter, c.hidden},
                      nullptr);
  launch_gated_act({d_gate_up.p, d_act.p, int32_t(K), c.inter, c.act}, nullptr);
  launch_grouped_gemm({d_act.p, nullptr, 1, d_dn.p, d_offsets.p, d_y.p, 1, c.experts, c.n, c.hidden, c.inter}, nullptr);
  launch_moe_combine({d_y.p, d_ids.p, d_w.p, d_slot_row.p, d_out.p, c.n, c.k, c.hidden}, nullptr);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());

  // Grouping: offsets ascend to K, every slot sits in exactly one row, in its expert's range.
  const auto offsets = d_offsets.download();
  const auto sorted = d_sorted.download();
  const auto slot_row = d_slot_row.download();
  ASSERT_EQ(offsets[0], 0);
  ASSERT_EQ(offsets[size_t(c.experts)], K);
  for (int32_t e = 0; e < c.experts; ++e) {
    ASSERT_LE(offsets[size_t(e)], offsets[size_t(e) + 1]);
    for (int32_t r = offsets[size_t(e)]; r < offsets[size_t(e) + 1]; ++r) {
      ASSERT_EQ(ids[size_t(sorted[size_t(r)])], e) << "row " << r;
      ASSERT_EQ(slot_row[size_t(sorted[size_t(r)])], r);
    }
  }

  std::vector<float> ref(size_t(c.n) * c.hidden, 0.0f);
  std::vector<float> a(static_cast<size_t>(c.inter));
  for (int32_t t = 0; t < c.n; ++t) {
    std::vector<int32_t> order(size_t(c.k));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t p, int32_t q) { return ids[size_t(t * c.k + p)] < ids[size_t(t * c.k + q)]; });
    const float* xt = &x.f[size_t(t) * c.hidden];
    for (int32_t j : order) {
      const int32_t e = ids[size_t(t * c.k + j)];
      const float* wg = &gu.f[size_t(e) * 2 * c.inter * c.hidden];
      for (int32_t i = 0; i < c.inter; ++i) {
        double sg = 0.0, su = 0.0;
        for (int32_t h = 0; h < c.hidden; ++h) {
          sg += double(xt[h]) * wg[size_t(i) * c.hidden + h];
          su += double(xt[h]) * wg[size_t(c.inter + i) * c.hidden + h];
        }
        const float gate = bf16_to_f32(f32_to_bf16(float(sg))), up = bf16_to_f32(f32_to_bf16(float(su)));
        a[size_t(i)] = bf16_to_f32(f32_to_bf16((c.act == Act::kSilu ? silu(gate) : gelu_tanh(gate)) * up));
      }
      const float* wd = &dn.f[size_t(e) * c.hidden * c.inter];
      for (int32_t h = 0; h < c.hidden; ++h) {
        double s = 0.0;
        for (int32_t i = 0; i < c.inter; ++i) s += double(a[size_t(i)]) * wd[size_t(h) * c.inter + i];
        ref[size_t(t) * c.hidden + h] += float(s) * weights[size_t(t * c.k + j)];
      }
    }
  }
  EXPECT_LE(max_norm_rel(d_out.download(), ref), 1e-2)
      << "n " << c.n << " experts " << c.experts << " k " << c.k << " hidden " << c.hidden << " inter " << c.inter;
}

TEST_F(GpuMoe, ExpertChainMatchesHostLoop) {
  const uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  for (const ExpertCase& c : {ExpertCase{1, 8, 2, 64, 48, Act::kSilu}, ExpertCase{3, 8, 2, 64, 48, Act::kSilu},
                              ExpertCase{70, 8, 2, 64, 48, Act::kSilu}, ExpertCase{130, 16, 4, 96, 40, Act::kGeluTanh},
                              ExpertCase{257, 4, 4, 72, 136, Act::kSilu}}) {
    check_expert_chain(c, rng);
  }
}

TEST_F(GpuMoe, SandwichAddNormMatchesHostLoop) {
  const uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  for (const int32_t dim : {64, 100, 2304}) {
    for (const int32_t opw : {0, 1}) {
      const int32_t rows = 7;
      auto x = random_f32(rng, size_t(rows) * dim, -2.0f, 2.0f);
      const auto br = random_f32(rng, size_t(rows) * dim, -3.0f, 3.0f);
      const auto bias = random_f32(rng, size_t(dim), -0.5f, 0.5f);
      const auto wb = random_f32(rng, size_t(dim), -1.0f, 1.0f);
      const auto w = random_f32(rng, size_t(dim), -1.0f, 1.0f);
      DeviceBuffer<float> d_x(x.size()), d_br(br.size()), d_bias(bias.size()), d_wb(wb.size()), d_w(w.size());
      DeviceBuffer<uint16_t> d_out(x.size());
      d_x.upload(x);
      d_br.upload(br);
      d_bias.upload(bias);
      d_wb.upload(wb);
      d_w.upload(w);
      d_out.poison();
      launch_sandwich_add_norm({d_x.p, d_br.p, d_bias.p, d_wb.p, d_w.p, d_out.p, rows, dim, 1e-6f, opw}, nullptr);
      std::vector<float> out(x.size());
      for (int32_t r = 0; r < rows; ++r) {
        float* xr = &x[size_t(r) * dim];
        double ss = 0.0;
        for (int32_t c = 0; c < dim; ++c) {
          const double b = br[size_t(r) * dim + c] + bias[size_t(c)];
          ss += b * b;
        }
        const double inv_b = 1.0 / std::sqrt(ss / dim + 1e-6);
        ss = 0.0;
        for (int32_t c = 0; c < dim; ++c) {
          const double b = br[size_t(r) * dim + c] + bias[size_t(c)];
          xr[c] += float(b * inv_b * (opw ? 1.0f + wb[size_t(c)] : wb[size_t(c)]));
          ss += double(xr[c]) * xr[c];
        }
        const double inv = 1.0 / std::sqrt(ss / dim + 1e-6);
        for (int32_t c = 0; c < dim; ++c) out[size_t(r) * dim + c] = float(xr[c] * inv * (opw ? 1.0f + w[size_t(c)] : w[size_t(c)]));
      }
      EXPECT_LE(max_norm_rel(d_x.download(), x), 1e-5) << "dim " << dim << " one_plus_w " << opw;
      EXPECT_LE(max_norm_rel(bf16_to_floats(d_out.download()), out), 1e-2) << "dim " << dim << " one_plus_w " << opw;
    }
  }
}

TEST_F(GpuMoe, SoftcapMatchesHostLoop) {
  const uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  const auto v = random_f32(rng, 100003, -200.0f, 200.0f);
  DeviceBuffer<float> d(v.size());
  d.upload(v);
  launch_softcap(d.p, int64_t(v.size()), 30.0f, nullptr);
  std::vector<float> ref(v.size());
  for (size_t i = 0; i < v.size(); ++i) ref[i] = 30.0f * std::tanh(v[i] / 30.0f);
  EXPECT_LE(max_norm_rel(d.download(), ref), 1e-5);
}

}  // namespace
}  // namespace strata::cuda
