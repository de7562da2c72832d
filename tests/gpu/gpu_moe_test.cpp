// The family kernels (family_kernels.h) and the MoE kernels (moe.h) against plain host code on
// random data: routing against the CPU's route_topk (model/layers/moe.h), the grouping's
// invariants, the whole expert chain (group, grouped GEMMs, gated activation, combine)
// against a host loop over the same bf16 values, the sandwich norm and the soft-cap, and
// Gemma 4's kernels (value norm, per-layer input combine and gate, scaled residual, norm sum).
// Max-norm relative error <= 1e-2 where bf16 rounds. Needs a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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
  // Up to 256 experts the warp-per-token kernel, past that the thread-per-token reference.
  for (const Shape& sh : {Shape{1, 8, 2, true, false}, Shape{37, 8, 2, false, false}, Shape{300, 64, 8, true, false},
                          Shape{19, 128, 8, true, true}, Shape{5, 4, 4, true, false}, Shape{4096, 128, 8, true, false},
                          Shape{77, 256, 8, true, true}, Shape{33, 60, 4, false, false}, Shape{9, 512, 10, true, false}}) {
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
    // The reference kernel on the same logits: the same experts, weights within rounding.
    DeviceBuffer<float> r_w(size_t(sh.n) * sh.k);
    DeviceBuffer<int32_t> r_ids(size_t(sh.n) * sh.k);
    MoeRouteArgs ref_args{d_logits.p, r_ids.p, r_w.p, sh.n, sh.experts, sh.k, sh.renorm ? 1 : 0, sh.scale ? d_scale.p : nullptr};
    ref_args.reference = 1;
    launch_moe_route(ref_args, nullptr);
    EXPECT_EQ(r_ids.download(), d_ids.download()) << "n " << sh.n << " experts " << sh.experts << " k " << sh.k;
    EXPECT_LE(max_norm_rel(r_w.download(), d_w.download()), 1e-6) << "n " << sh.n << " experts " << sh.experts;
  }
}

// The combine's vector kernel against the scalar reference (the same sums in the same order:
// the same bits) and a host loop, with k up to past one load batch and ragged slot rows.
TEST_F(GpuMoe, CombineVectorMatchesTheReference) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  struct Shape {
    int32_t n, experts, k, hidden;
  };
  for (const Shape& sh : {Shape{1, 8, 2, 64}, Shape{300, 128, 8, 2048}, Shape{17, 64, 11, 520}, Shape{5, 16, 16, 36},
                          Shape{9, 8, 3, 30}}) {
    const size_t nk = size_t(sh.n) * sh.k;
    std::vector<int32_t> ids(nk), slot_row(nk);
    std::vector<int32_t> perm(size_t(sh.experts));
    std::iota(perm.begin(), perm.end(), 0);
    for (int32_t t = 0; t < sh.n; ++t) {
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int32_t j = 0; j < sh.k; ++j) ids[size_t(t) * sh.k + j] = perm[size_t(j)];
    }
    std::iota(slot_row.begin(), slot_row.end(), 0);
    std::shuffle(slot_row.begin(), slot_row.end(), rng);
    const auto weights = random_f32(rng, nk, 0.0f, 1.0f);
    const auto y = random_f32(rng, nk * sh.hidden, -2.0f, 2.0f);
    DeviceBuffer<int32_t> d_ids(nk), d_slot(nk);
    DeviceBuffer<float> d_wt(nk), d_y(y.size()), d_out(size_t(sh.n) * sh.hidden), d_ref(size_t(sh.n) * sh.hidden);
    d_ids.upload(ids);
    d_slot.upload(slot_row);
    d_wt.upload(weights);
    d_y.upload(y);
    d_out.poison();
    d_ref.poison();
    MoeCombineArgs args{d_y.p, d_ids.p, d_wt.p, d_slot.p, d_out.p, sh.n, sh.k, sh.hidden};
    launch_moe_combine(args, nullptr);
    args.out = d_ref.p;
    args.reference = 1;
    launch_moe_combine(args, nullptr);
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    const auto got = d_out.download(), ref = d_ref.download();
    EXPECT_EQ(std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)), 0) << "n " << sh.n << " k " << sh.k << " hidden " << sh.hidden;
    std::vector<float> host(got.size(), 0.0f);
    for (int32_t t = 0; t < sh.n; ++t) {
      std::vector<int32_t> order(size_t(sh.k));
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int32_t p, int32_t q) { return ids[size_t(t) * sh.k + p] < ids[size_t(t) * sh.k + q]; });
      for (int32_t h = 0; h < sh.hidden; ++h) {
        double acc = 0.0;
        for (const int32_t j : order) {
          const size_t slot = size_t(t) * sh.k + j;
          acc += double(y[size_t(slot_row[slot]) * sh.hidden + h]) * weights[slot];
        }
        host[size_t(t) * sh.hidden + h] = float(acc);
      }
    }
    EXPECT_LE(max_norm_rel(got, host), 1e-5) << "n " << sh.n << " k " << sh.k << " hidden " << sh.hidden;
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

// The grouping on skewed ids (one expert taking a third of the slots, empty experts) up to
// 131072 slots and 4096 experts: offsets ascend to the slot count, and sorted_slot / slot_row
// are inverse permutations with every slot in its expert's range.
TEST_F(GpuMoe, GroupSortsEverySlotByExpert) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  struct Shape {
    int32_t n_slots, experts;
  };
  for (const Shape& sh : {Shape{1, 8}, Shape{37, 4}, Shape{1000, 128}, Shape{32768, 128}, Shape{131072, 256}, Shape{5001, 4096},
                          Shape{70000, 60}}) {
    std::vector<int32_t> ids(size_t(sh.n_slots));
    std::uniform_int_distribution<int32_t> any(0, sh.experts - 1);
    for (auto& v : ids) {
      v = any(rng);
      if (v % 5 == 1) v = 0;            // a popular expert
      if (v % 7 == 3 && v > 0) v -= 1;  // and some that get nothing
    }
    std::vector<int32_t> counts(size_t(sh.experts), 0);
    for (const int32_t v : ids) ++counts[size_t(v)];
    DeviceBuffer<int32_t> d_ids(ids.size()), off(size_t(sh.experts) + 1), sorted(ids.size()), slot_row(ids.size());
    d_ids.upload(ids);
    sorted.poison();
    slot_row.poison();
    launch_moe_group({d_ids.p, sh.n_slots, sh.experts, off.p, sorted.p, slot_row.p}, nullptr);
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    const auto offsets = off.download(), srt = sorted.download(), row = slot_row.download();
    ASSERT_EQ(offsets[0], 0);
    std::vector<char> seen(ids.size(), 0);
    for (int32_t e = 0; e < sh.experts; ++e) {
      ASSERT_EQ(offsets[size_t(e) + 1] - offsets[size_t(e)], counts[size_t(e)]) << "expert " << e;
      for (int32_t r = offsets[size_t(e)]; r < offsets[size_t(e) + 1]; ++r) {
        const int32_t s = srt[size_t(r)];
        ASSERT_TRUE(s >= 0 && s < sh.n_slots) << "row " << r;
        ASSERT_EQ(ids[size_t(s)], e) << "row " << r;
        ASSERT_EQ(row[size_t(s)], r);
        ASSERT_FALSE(seen[size_t(s)]) << "slot " << s << " twice";
        seen[size_t(s)] = 1;
      }
    }
  }
}

struct ExpertCase {
  int32_t n, experts, k, hidden, inter;
  Act act;
};

// Random routing (distinct experts per token), random bf16 activations and experts; the device
// chain against a host loop in f32 over the same bf16 values (with the device's bf16
// rounding of the gate/up projections and of the activation).
void check_expert_chain(const ExpertCase& c, std::mt19937& rng, GroupedGemmPath path = GroupedGemmPath::kAuto) {
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
  GroupedGemmArgs gu_args{d_x.p, d_sorted.p, c.k, d_gu.p, d_offsets.p, d_gate_up.p, 0, c.experts, c.n, 2 * c.inter, c.hidden};
  gu_args.path = path;
  launch_grouped_gemm(gu_args, nullptr);
  launch_gated_act({d_gate_up.p, d_act.p, int32_t(K), c.inter, c.act}, nullptr);
  GroupedGemmArgs dn_args{d_act.p, nullptr, 1, d_dn.p, d_offsets.p, d_y.p, 1, c.experts, c.n, c.hidden, c.inter};
  dn_args.path = path;
  launch_grouped_gemm(dn_args, nullptr);
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
      << "path " << int(path) << " n " << c.n << " experts " << c.experts << " k " << c.k << " hidden " << c.hidden << " inter " << c.inter;
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

// The three grouped-GEMM kernels on the same shapes: the tiled one, the decode GEMV and the
// tensor-core one (rows past 8 per expert, a column tail, a group of one row, experts with no
// rows, groups past one 128-row tile).
TEST_F(GpuMoe, GroupedGemmPathsMatchTheHostLoop) {
  const uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  for (const ExpertCase& c : {ExpertCase{1, 128, 8, 256, 128, Act::kSilu}, ExpertCase{8, 128, 8, 256, 96, Act::kSilu},
                              ExpertCase{64, 16, 4, 136, 104, Act::kSilu}, ExpertCase{200, 8, 2, 64, 40, Act::kGeluTanh},
                              ExpertCase{300, 4, 2, 200, 88, Act::kSilu}}) {
    for (const GroupedGemmPath path : {GroupedGemmPath::kTiled, GroupedGemmPath::kGemv, GroupedGemmPath::kMma}) {
      SCOPED_TRACE("seed " + std::to_string(seed));
      check_expert_chain(c, rng, path);
    }
  }
}

// One grouped GEMM, y[r] = x[src(r)] . w[e]^T, of a path against a host loop in double over
// the same bf16 values, on the rows listed in check_rows (all rows when empty). Per element:
// |got - ref| <= 3e-5 * sum_k |x w| (f32 accumulation over k) plus 2^-8 |ref| when y is bf16
// (its rounding); a missed or repeated reduction chunk, a wrong row or expert is far outside.
struct GemmCase {
  int32_t n_experts;
  std::vector<int32_t> counts;  // rows per expert
  int64_t n, k;
  int32_t src_div;              // 0: y row r reads x row r; else x row sorted_src[r] / src_div
  int32_t out_f32;
};

struct GemmData {
  std::vector<uint16_t> x, w;      // bf16 bits
  std::vector<int32_t> offsets, src;
  int64_t x_rows = 0, rows = 0;
};

// A kernel under test: a path, and for kMma the block tile.
struct GemmKernel {
  GroupedGemmPath path;
  MmaTile tile;
};
constexpr GemmKernel kTiledRef{GroupedGemmPath::kTiled, MmaTile::k128x128};
constexpr GemmKernel kMmaVariants[] = {{GroupedGemmPath::kMma, MmaTile::k128x128},
                                       {GroupedGemmPath::kMma, MmaTile::k128x128w4},
                                       {GroupedGemmPath::kMma, MmaTile::k128x128w8},
                                       {GroupedGemmPath::kMma, MmaTile::k128x256}};

std::string kernel_name(const GemmKernel& k) {
  if (k.path != GroupedGemmPath::kMma) return "tiled";
  switch (k.tile) {
    case MmaTile::kAuto:
      return "mma/auto";
    case MmaTile::k128x128:
      return "mma/128x128";
    case MmaTile::k128x128w4:
      return "mma/128x128 alternating";
    case MmaTile::k128x128w8:
      return "mma/128x128, 8 warps";
    case MmaTile::k128x256:
      return "mma/128x256";
  }
  return "mma";
}

std::vector<float> run_grouped_gemm(const GemmCase& c, const GemmData& d, const GemmKernel& kernel, int32_t rows_per_expert) {
  DeviceBuffer<uint16_t> d_x(d.x.size()), d_w(d.w.size());
  DeviceBuffer<int32_t> d_off(d.offsets.size()), d_src(std::max<size_t>(1, d.src.size()));
  d_x.upload(d.x);
  d_w.upload(d.w);
  d_off.upload(d.offsets);
  if (!d.src.empty()) d_src.upload(d.src);
  const size_t out_n = size_t(d.rows) * size_t(c.n);
  DeviceBuffer<float> y32(c.out_f32 ? out_n : 1);
  DeviceBuffer<uint16_t> y16(c.out_f32 ? 1 : out_n);
  y32.poison();
  y16.poison();
  GroupedGemmArgs args{d_x.p, c.src_div > 0 ? d_src.p : nullptr, std::max(1, c.src_div), d_w.p, d_off.p,
                       c.out_f32 ? static_cast<void*>(y32.p) : static_cast<void*>(y16.p), c.out_f32, c.n_experts,
                       rows_per_expert, c.n, c.k};
  args.path = kernel.path;
  if (kernel.path == GroupedGemmPath::kMma) {
    launch_grouped_gemm_mma(args, nullptr, kernel.tile);
  } else {
    launch_grouped_gemm(args, nullptr);
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (c.out_f32) return y32.download();
  const auto bits = y16.download();
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = bf16_to_f32(bits[i]);
  return out;
}

GemmData make_gemm_data(const GemmCase& c, std::mt19937& rng) {
  GemmData d;
  d.offsets.assign(size_t(c.n_experts) + 1, 0);
  for (int32_t e = 0; e < c.n_experts; ++e) d.offsets[size_t(e) + 1] = d.offsets[size_t(e)] + c.counts[size_t(e)];
  d.rows = d.offsets.back();
  d.x_rows = c.src_div > 0 ? (d.rows + c.src_div - 1) / c.src_div : d.rows;
  if (c.src_div > 0) {
    d.src.resize(size_t(d.rows));
    std::iota(d.src.begin(), d.src.end(), 0);
    std::shuffle(d.src.begin(), d.src.end(), rng);
  }
  // splitmix64 of a counter: the Qwen3-shaped weights are 400M values.
  uint64_t state = rng();
  const auto uniform = [&state] {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return float(double((z ^ (z >> 31)) >> 40) * 0x1.0p-23 - 1.0);  // [-1, 1)
  };
  d.x.resize(size_t(d.x_rows * c.k));
  for (auto& v : d.x) v = f32_to_bf16(uniform());
  d.w.resize(size_t(c.n_experts) * size_t(c.n * c.k));
  for (auto& v : d.w) v = f32_to_bf16(0.2f * uniform());
  return d;
}

// Worst |got - ref| / bound over the checked rows (<= 1 passes); the first offender is reported.
double gemm_error_vs_host(const GemmCase& c, const GemmData& d, const std::vector<float>& got, std::vector<int64_t> check_rows,
                          std::string* where) {
  if (check_rows.empty()) {
    check_rows.resize(size_t(d.rows));
    std::iota(check_rows.begin(), check_rows.end(), 0);
  }
  std::vector<float> xf(size_t(c.k));
  double worst = 0.0;
  for (const int64_t r : check_rows) {
    int32_t e = 0;
    while (d.offsets[size_t(e) + 1] <= r) ++e;
    const int64_t s = c.src_div > 0 ? d.src[size_t(r)] / c.src_div : r;
    for (int64_t q = 0; q < c.k; ++q) xf[size_t(q)] = bf16_to_f32(d.x[size_t(s * c.k + q)]);
    const uint16_t* we = &d.w[size_t(e) * size_t(c.n * c.k)];
    for (int64_t col = 0; col < c.n; ++col) {
      double ref = 0.0, mag = 0.0;
      for (int64_t q = 0; q < c.k; ++q) {
        const double p = double(xf[size_t(q)]) * double(bf16_to_f32(we[size_t(col * c.k + q)]));
        ref += p;
        mag += std::fabs(p);
      }
      const double bound = 3e-5 * mag + (c.out_f32 ? 0.0 : std::ldexp(std::fabs(ref), -8)) + 1e-30;
      const double g = got[size_t(r * c.n + col)];
      const double err = std::isnan(g) ? INFINITY : std::fabs(g - ref) / bound;
      if (err > worst) {
        worst = err;
        *where = "row " + std::to_string(r) + " (expert " + std::to_string(e) + ") col " + std::to_string(col) + ": got " +
                 std::to_string(g) + " ref " + std::to_string(ref);
      }
    }
  }
  return worst;
}

// The tensor-core kernel (its four block tiles) and the tiled reference against the host loop: empty experts, groups
// of 1, 127, 128, 129 and several tiles, column tails (n % 128 != 0), reduction tails
// (k % 64 != 0), gathered and plain rows, bf16 and f32 outputs.
TEST_F(GpuMoe, GroupedGemmMmaMatchesTheHostLoop) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> cnt(0, 420);
  std::vector<int32_t> ragged(16);
  for (size_t e = 0; e < ragged.size(); ++e) ragged[e] = e % 3 == 1 ? 0 : cnt(rng);
  const std::vector<GemmCase> cases = {
      {8, {0, 1, 129, 0, 300, 17, 128, 127}, 136, 72, 2, 0},
      {8, {0, 1, 129, 0, 300, 17, 128, 127}, 136, 72, 0, 1},
      {16, ragged, 264, 520, 8, 0},
      {16, ragged, 256, 192, 0, 1},
      {4, {0, 0, 0, 5}, 8, 8, 1, 1},
      {3, {600, 0, 41}, 384, 1024, 4, 1},
  };
  for (const GemmCase& c : cases) {
    const GemmData d = make_gemm_data(c, rng);
    const int32_t rpe = *std::max_element(c.counts.begin(), c.counts.end());
    std::vector<GemmKernel> kernels(std::begin(kMmaVariants), std::end(kMmaVariants));
    kernels.push_back(kTiledRef);
    for (const GemmKernel& kernel : kernels) {
      const auto got = run_grouped_gemm(c, d, kernel, std::max(1, rpe));
      std::string where;
      const double err = gemm_error_vs_host(c, d, got, {}, &where);
      EXPECT_LE(err, 1.0) << kernel_name(kernel) << " experts " << c.n_experts << " n " << c.n << " k " << c.k << " div "
                          << c.src_div << " f32 " << c.out_f32 << ": " << where;
    }
  }
}

// The Qwen3-30B-A3B expert shapes at a 4096-token prefill (128 experts, top 8, hidden 2048,
// expert intermediate 768): gate|up (gathered rows, bf16 out) and down (f32 out), skewed routing
// with experts that get no token. The tensor-core kernel (its four block tiles) against the host loop on 384 rows
// (every expert's first and last row among them) and against the tiled reference on every row.
TEST_F(GpuMoe, GroupedGemmMmaMatchesAtQwen3MoeShape) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const int32_t tokens = 4096, E = 128, top_k = 8, hidden = 2048, inter = 768;
  std::vector<double> pref(static_cast<size_t>(E));
  for (int32_t e = 0; e < E; ++e) pref[size_t(e)] = e % 17 == 3 ? 0.0 : double((1 + e % 5) * (1 + e % 5));
  std::vector<int32_t> counts(size_t(E), 0);
  for (int32_t t = 0; t < tokens; ++t) {
    std::vector<double> p = pref;
    for (int32_t j = 0; j < top_k; ++j) {
      std::discrete_distribution<int32_t> pick(p.begin(), p.end());
      const int32_t e = pick(rng);
      ++counts[size_t(e)];
      p[size_t(e)] = 0.0;
    }
  }
  ASSERT_EQ(std::count(counts.begin(), counts.end(), 0), 8);
  for (const GemmCase& c : {GemmCase{E, counts, 2 * inter, hidden, top_k, 0}, GemmCase{E, counts, hidden, inter, 0, 1}}) {
    const GemmData d = make_gemm_data(c, rng);
    const auto tiled_out = run_grouped_gemm(c, d, kTiledRef, tokens);
    std::vector<int64_t> rows;
    for (int32_t e = 0; e < E; ++e) {
      if (counts[size_t(e)] == 0) continue;
      rows.push_back(d.offsets[size_t(e)]);
      rows.push_back(d.offsets[size_t(e) + 1] - 1);
    }
    std::uniform_int_distribution<int64_t> any_row(0, d.rows - 1);
    while (rows.size() < 384) rows.push_back(any_row(rng));
    for (const GemmKernel& kernel : kMmaVariants) {
      const auto mma_out = run_grouped_gemm(c, d, kernel, tokens);
      std::string where;
      EXPECT_LE(gemm_error_vs_host(c, d, mma_out, rows, &where), 1.0)
          << kernel_name(kernel) << " n " << c.n << " k " << c.k << ": " << where;
      // Against the tiled kernel everywhere: the f32 sums differ by rounding only; bf16 outputs
      // by at most one rounding step of either.
      EXPECT_LE(max_norm_rel(mma_out, tiled_out), c.out_f32 ? 1e-4 : 1e-2) << kernel_name(kernel) << " n " << c.n << " k " << c.k;
    }
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

// Gemma 4 kernels: plain host references, then the device against them.

// Host RMSNorm of n values in place (times w when given), in double.
void ref_rms_norm(float* v, int32_t n, const float* w, float eps, float pre_scale = 1.0f) {
  double ss = 0.0;
  for (int32_t i = 0; i < n; ++i) ss += double(v[i] * pre_scale) * double(v[i] * pre_scale);
  const double inv = 1.0 / std::sqrt(ss / n + eps);
  for (int32_t i = 0; i < n; ++i) v[i] = float(double(v[i] * pre_scale) * inv * (w ? w[i] : 1.0f));
}

TEST_F(GpuMoe, HeadRmsNormMatchesHostLoop) {
  const uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  struct Shape {
    int32_t n, heads, hd, pre, post;
    bool weighted;
  };
  for (const Shape& sh : {Shape{1, 1, 32, 64, 32, false}, Shape{9, 2, 64, 128, 0, false}, Shape{33, 4, 256, 512, 64, true}}) {
    const int32_t stride = sh.pre + sh.heads * sh.hd + sh.post;
    auto x = random_f32(rng, size_t(sh.n) * stride, -3.0f, 3.0f);
    const auto w = random_f32(rng, size_t(sh.hd), -1.0f, 1.0f);
    DeviceBuffer<float> d_x(x.size()), d_w(w.size());
    d_x.upload(x);
    d_w.upload(w);
    launch_head_rms_norm({d_x.p, sh.weighted ? d_w.p : nullptr, sh.n, stride, sh.pre, sh.heads, sh.hd, 1e-6f}, nullptr);
    for (int32_t t = 0; t < sh.n; ++t) {
      for (int32_t h = 0; h < sh.heads; ++h) ref_rms_norm(&x[size_t(t) * stride + sh.pre + size_t(h) * sh.hd], sh.hd, sh.weighted ? w.data() : nullptr, 1e-6f);
    }
    EXPECT_LE(max_norm_rel(d_x.download(), x), 1e-5) << "n " << sh.n << " heads " << sh.heads << " head_dim " << sh.hd;
  }
}

TEST_F(GpuMoe, PleCombineMatchesHostLoop) {
  const uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  for (const int32_t dim : {16, 256}) {
    const int32_t rows = 6 * 7;
    auto ctx = random_f32(rng, size_t(rows) * dim, -20.0f, 20.0f);
    const auto tok = random_f32(rng, size_t(rows) * dim, -2.0f, 2.0f);
    const auto w = random_f32(rng, size_t(dim), -1.0f, 1.0f);
    DeviceBuffer<float> d_ctx(ctx.size()), d_tok(tok.size()), d_w(w.size());
    d_ctx.upload(ctx);
    d_tok.upload(tok);
    d_w.upload(w);
    const float scale = 0.125f;
    launch_ple_combine({d_ctx.p, d_tok.p, d_w.p, rows, dim, scale, 1e-6f}, nullptr);
    for (int32_t r = 0; r < rows; ++r) {
      float* c = &ctx[size_t(r) * dim];
      ref_rms_norm(c, dim, w.data(), 1e-6f, scale);
      for (int32_t i = 0; i < dim; ++i) c[i] = float((double(c[i]) + tok[size_t(r) * dim + i]) / std::sqrt(2.0));
    }
    EXPECT_LE(max_norm_rel(d_ctx.download(), ctx), 1e-5) << "dim " << dim;
  }
}

TEST_F(GpuMoe, PleGateMatchesHostLoop) {
  const uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  const int32_t n = 11, dim = 16, layers = 6, layer = 4;
  const auto gate = random_f32(rng, size_t(n) * dim, -4.0f, 4.0f);
  const auto ple = random_f32(rng, size_t(n) * layers * dim, -2.0f, 2.0f);
  DeviceBuffer<float> d_gate(gate.size()), d_ple(ple.size());
  DeviceBuffer<uint16_t> d_out(size_t(n) * dim);
  d_gate.upload(gate);
  d_ple.upload(ple);
  d_out.poison();
  launch_ple_gate({d_gate.p, d_ple.p + layer * dim, d_out.p, n, dim, layers * dim, int32_t(Act::kGeluTanh)}, nullptr);
  std::vector<float> ref(size_t(n) * dim);
  for (int32_t t = 0; t < n; ++t) {
    for (int32_t i = 0; i < dim; ++i) ref[size_t(t) * dim + i] = gelu_tanh(gate[size_t(t) * dim + i]) * ple[size_t(t) * layers * dim + layer * dim + i];
  }
  EXPECT_LE(max_norm_rel(bf16_to_floats(d_out.download()), ref), 1e-2);
}

TEST_F(GpuMoe, ScaledResidualMatchesHostLoop) {
  const uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  for (const int32_t dim : {64, 100, 2560}) {
    for (const int32_t mode : {0, 1, 2}) {  // 0: no out, 1: raw bf16 out, 2: normed out
      const int32_t rows = 5;
      auto x = random_f32(rng, size_t(rows) * dim, -2.0f, 2.0f);
      const auto br = random_f32(rng, size_t(rows) * dim, -3.0f, 3.0f);
      const auto wb = random_f32(rng, size_t(dim), -1.0f, 1.0f);
      const auto w = random_f32(rng, size_t(dim), -1.0f, 1.0f);
      const float scale = mode == 1 ? 1.0f : 0.37f;
      DeviceBuffer<float> d_x(x.size()), d_br(br.size()), d_wb(wb.size()), d_w(w.size());
      DeviceBuffer<uint16_t> d_out(x.size());
      d_x.upload(x);
      d_br.upload(br);
      d_wb.upload(wb);
      d_w.upload(w);
      d_out.poison();
      launch_scaled_residual({d_x.p, d_br.p, d_wb.p, scale, mode == 2 ? d_w.p : nullptr, mode > 0 ? d_out.p : nullptr, rows, dim, 1e-6f},
                             nullptr);
      std::vector<float> out(x.size());
      for (int32_t r = 0; r < rows; ++r) {
        std::vector<float> b(br.begin() + size_t(r) * dim, br.begin() + size_t(r + 1) * dim);
        ref_rms_norm(b.data(), dim, wb.data(), 1e-6f);
        float* xr = &x[size_t(r) * dim];
        for (int32_t c = 0; c < dim; ++c) xr[c] = (xr[c] + b[size_t(c)]) * scale;
        std::copy_n(xr, dim, &out[size_t(r) * dim]);
        if (mode == 2) ref_rms_norm(&out[size_t(r) * dim], dim, w.data(), 1e-6f);
      }
      EXPECT_LE(max_norm_rel(d_x.download(), x), 1e-5) << "dim " << dim << " mode " << mode;
      if (mode > 0) {
        EXPECT_LE(max_norm_rel(bf16_to_floats(d_out.download()), out), 1e-2) << "dim " << dim << " mode " << mode;
      }
    }
  }
}

TEST_F(GpuMoe, NormSumMatchesHostLoop) {
  const uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  for (const int32_t dim : {64, 2816}) {
    const int32_t rows = 9;
    const auto a = random_f32(rng, size_t(rows) * dim, -2.0f, 2.0f);
    const auto b = random_f32(rng, size_t(rows) * dim, -5.0f, 5.0f);
    const auto wa = random_f32(rng, size_t(dim), -1.0f, 1.0f);
    const auto wb = random_f32(rng, size_t(dim), -1.0f, 1.0f);
    DeviceBuffer<float> d_a(a.size()), d_b(b.size()), d_wa(wa.size()), d_wb(wb.size());
    d_a.upload(a);
    d_b.upload(b);
    d_wa.upload(wa);
    d_wb.upload(wb);
    launch_norm_sum({d_a.p, d_wa.p, d_b.p, d_wb.p, d_a.p, rows, dim, 1e-6f}, nullptr);  // in place, as the decoder runs it
    std::vector<float> ref(a.size());
    for (int32_t r = 0; r < rows; ++r) {
      std::vector<float> ra(a.begin() + size_t(r) * dim, a.begin() + size_t(r + 1) * dim);
      std::vector<float> rb(b.begin() + size_t(r) * dim, b.begin() + size_t(r + 1) * dim);
      ref_rms_norm(ra.data(), dim, wa.data(), 1e-6f);
      ref_rms_norm(rb.data(), dim, wb.data(), 1e-6f);
      for (int32_t c = 0; c < dim; ++c) ref[size_t(r) * dim + c] = ra[size_t(c)] + rb[size_t(c)];
    }
    EXPECT_LE(max_norm_rel(d_a.download(), ref), 1e-5) << "dim " << dim;
  }
}

TEST_F(GpuMoe, ToBf16MatchesHostRounding) {
  const uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  const auto v = random_f32(rng, 70001, -300.0f, 300.0f);
  DeviceBuffer<float> d(v.size());
  DeviceBuffer<uint16_t> out(v.size());
  d.upload(v);
  out.poison();
  launch_to_bf16(d.p, out.p, int64_t(v.size()), nullptr);
  std::vector<uint16_t> ref(v.size());
  for (size_t i = 0; i < v.size(); ++i) ref[i] = f32_to_bf16(v[i]);
  EXPECT_EQ(out.download(), ref);
}

}  // namespace
}  // namespace strata::cuda
