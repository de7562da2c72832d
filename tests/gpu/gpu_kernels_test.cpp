// Every CUDA kernel against backend/reference on fresh random data: max-norm relative error
// <= 1e-2 where the output is bf16, <= 1e-5 where it is f32. Needs a GPU.
#include <gtest/gtest.h>

#include <numeric>

#include "backend/cuda/device_memory.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/reference/reference_ops.h"
#include "gpu_test_util.h"

namespace strata::cuda {
namespace {

using namespace strata::gpu_test;

constexpr double kBf16Tol = 1e-2;
constexpr double kF32Tol = 1e-5;

class GpuKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
    rng_.seed(fresh_seed());
  }
  std::mt19937 rng_;
};

TEST_F(GpuKernels, GemmBf16MatchesReference) {
  auto ws = DeviceArena::create(32 << 20, "workspace");
  ASSERT_TRUE(ws.ok()) << ws.error().to_string();
  auto wsp = (*ws)->take(32 << 20, "workspace");
  ASSERT_TRUE(wsp.ok());
  auto gemm = Gemm::create(*wsp, 32 << 20);
  ASSERT_TRUE(gemm.ok()) << gemm.error().to_string();
  struct Shape { int64_t m, n, k; };
  for (const Shape s : {Shape{1, 1000, 512}, Shape{7, 384, 256}, Shape{130, 520, 1024}, Shape{512, 256, 64}}) {
    const Bf16Data x = random_bf16(rng_, size_t(s.m * s.k), 1.0f);
    const Bf16Data w = random_bf16(rng_, size_t(s.n * s.k), 0.1f);
    std::vector<float> ref(size_t(s.m * s.n));
    reference::matmul(x.f.data(), s.m, s.k, DType::kBF16, w.bits.data(), s.n, nullptr, ref.data());
    DeviceBuffer<uint16_t> dx(x.bits.size()), dw(w.bits.size()), dy16(ref.size());
    DeviceBuffer<float> dy32(ref.size());
    dx.upload(x.bits);
    dw.upload(w.bits);
    dy16.poison();
    dy32.poison();
    (*gemm)->run(nullptr, dx.p, dw.p, dy32.p, GemmOut::kF32, s.m, s.n, s.k);
    (*gemm)->run(nullptr, dx.p, dw.p, dy16.p, GemmOut::kBF16, s.m, s.n, s.k);
    EXPECT_LE(max_norm_rel(dy32.download(), ref), kF32Tol) << s.m << "x" << s.n << "x" << s.k << " f32 out";
    EXPECT_LE(max_norm_rel(bf16_to_floats(dy16.download()), ref), kBf16Tol) << s.m << "x" << s.n << "x" << s.k << " bf16 out";
  }
}

// The weight-stream GEMV of decode (1-4 rows), directly and through Gemm, against the
// reference; k values that leave a tail past the unrolled loop.
TEST_F(GpuKernels, GemvBf16MatchesReference) {
  struct Shape { int64_t m, n, k; };
  for (const Shape s : {Shape{1, 1000, 512}, Shape{2, 4097, 4104}, Shape{3, 300, 14336}, Shape{4, 77, 8}, Shape{1, 128, 1032}}) {
    const Bf16Data x = random_bf16(rng_, size_t(s.m * s.k), 1.0f);
    const Bf16Data w = random_bf16(rng_, size_t(s.n * s.k), 0.1f);
    std::vector<float> ref(size_t(s.m * s.n));
    reference::matmul(x.f.data(), s.m, s.k, DType::kBF16, w.bits.data(), s.n, nullptr, ref.data());
    DeviceBuffer<uint16_t> dx(x.bits.size()), dw(w.bits.size()), dy16(ref.size());
    DeviceBuffer<float> dy32(ref.size());
    dx.upload(x.bits);
    dw.upload(w.bits);
    ASSERT_TRUE(gemv_supports(dx.p, dw.p, s.m, s.k));
    dy16.poison();
    dy32.poison();
    launch_gemv_bf16(dx.p, dw.p, dy32.p, true, s.m, s.n, s.k, nullptr);
    launch_gemv_bf16(dx.p, dw.p, dy16.p, false, s.m, s.n, s.k, nullptr);
    EXPECT_LE(max_norm_rel(dy32.download(), ref), kF32Tol) << s.m << "x" << s.n << "x" << s.k << " f32 out";
    EXPECT_LE(max_norm_rel(bf16_to_floats(dy16.download()), ref), kBf16Tol) << s.m << "x" << s.n << "x" << s.k << " bf16 out";
    // Two warps per row (each half of k; k % 16 != 0 falls back to one).
    GemvArgs a{};
    a.x = dx.p;
    a.w = dw.p;
    a.y = dy32.p;
    a.m = s.m;
    a.n = s.n;
    a.k = s.k;
    a.in = GemvIn::kPlain;
    a.out = GemvOut::kF32;
    a.warps_per_row = 2;
    dy32.poison();
    launch_gemv(a, nullptr);
    EXPECT_LE(max_norm_rel(dy32.download(), ref), kF32Tol) << s.m << "x" << s.n << "x" << s.k << " f32 out, 2 warps per row";
  }
}

// The fused GEMV modes of decode against the unfused arithmetic on the reference: an RMSNorm'd
// input given as bf16(u * w) plus partial sums of squares, the residual epilogue (x += y +
// bias, the next norm's bf16(x * w) and per-block sums of squares), the gated activation over
// gate and up rows.
TEST_F(GpuKernels, GemvFusedModesMatchReference) {
  struct Shape { int64_t m, n, k; };
  for (const Shape s : {Shape{1, 1000, 512}, Shape{2, 4097, 1032}, Shape{3, 300, 4104}, Shape{4, 77, 8}, Shape{1, 130, 14336}}) {
    for (const int one_plus_w : {0, 1}) {
      // Every load depth of the weight stream (LaunchTuning::gemv_unroll), in turn.
      LaunchTuning tune;
      tune.gemv_unroll = one_plus_w ? 16 : (s.n % 2 == 0 ? 8 : 4);  // 16 takes effect at one activation row
      tune.gemv_preload = s.m != 2;  // the first step's weights loaded before the wait, or not
      // L2 prefetches before the wait (no effect on the results): every row's first 4 KB in
      // every mode, and in the residual mode below whole rows with the spread and two ahead ranges.
      const bool l2 = one_plus_w != 0;
      tune.gemv_prefetch_bytes = l2 ? 4096 : 0;
      // The norm's partial sums summed per block or per warp; the gated rows at 4 loads or at
      // the others' depth.
      tune.gemv_norm_block = s.n % 2 == one_plus_w;
      tune.gemv_gated_unroll = s.m == 1 ? 4 : 0;
      set_launch_tuning(tune);
      const std::string what = std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) + " one_plus_w " +
                               std::to_string(one_plus_w) + " unroll " + std::to_string(tune.gemv_unroll) + " preload " +
                               std::to_string(tune.gemv_preload) + " L2 prefetch " + std::to_string(l2) +
                               " norm per block " + std::to_string(tune.gemv_norm_block) + " gated unroll " +
                               std::to_string(tune.gemv_gated_unroll);
      // Norm-scaled input: u rows, norm weight; the host splits each row's sum of squares into
      // 3 uneven parts.
      const auto u = random_f32(rng_, size_t(s.m * s.k), -2.0f, 2.0f);
      const auto nw = random_f32(rng_, size_t(s.k), 0.5f, 1.5f);
      std::vector<uint16_t> uw(u.size());
      std::vector<float> ss(size_t(s.m) * 3, 0.0f);
      for (int64_t r = 0; r < s.m; ++r) {
        for (int64_t i = 0; i < s.k; ++i) {
          const float v = u[size_t(r * s.k + i)];
          const float w = one_plus_w ? 1.0f + nw[size_t(i)] : nw[size_t(i)];
          uw[size_t(r * s.k + i)] = f32_to_bf16(v * w);
          ss[size_t(r * 3 + (i < s.k / 5 ? 0 : (i < s.k / 2 ? 1 : 2)))] += v * v;
        }
      }
      std::vector<float> h(u.size());
      reference::rms_norm(u.data(), nw.data(), h.data(), s.m, s.k, 1e-5f, one_plus_w != 0);
      const Bf16Data w = random_bf16(rng_, size_t(2 * s.n * s.k), 0.1f);  // gate rows, then up rows
      std::vector<float> ref(size_t(s.m * s.n)), ref2(size_t(s.m * 2 * s.n));
      reference::matmul(h.data(), s.m, s.k, DType::kBF16, w.bits.data(), s.n, nullptr, ref.data());
      reference::matmul(h.data(), s.m, s.k, DType::kBF16, w.bits.data(), 2 * s.n, nullptr, ref2.data());
      DeviceBuffer<uint16_t> dx(uw.size()), dw(w.bits.size()), dy16(ref.size());
      DeviceBuffer<float> dss(ss.size()), dy32(ref.size());
      dx.upload(uw);
      dw.upload(w.bits);
      dss.upload(ss);
      dy32.poison();
      GemvArgs a{};
      a.x = dx.p;
      a.w = dw.p;
      a.y = dy32.p;
      a.m = s.m;
      a.n = s.n;
      a.k = s.k;
      a.in = GemvIn::kNormScaled;
      a.out = GemvOut::kF32;
      a.in_ss = dss.p;
      a.in_ss_parts = 3;
      a.in_eps = 1e-5f;
      a.warps_per_row = one_plus_w ? 2 : 1;  // the decode QKV's split rows (k % 16 == 0)
      launch_gemv(a, nullptr);
      EXPECT_LE(max_norm_rel(dy32.download(), ref), kBf16Tol) << what << " norm-scaled f32 out, warps per row "
                                                              << a.warps_per_row;

      // Gated activation on the same input.
      std::vector<float> g(ref.size()), up(ref.size()), act_ref(ref.size());
      for (int64_t r = 0; r < s.m; ++r) {
        for (int64_t i = 0; i < s.n; ++i) {
          g[size_t(r * s.n + i)] = ref2[size_t(r * 2 * s.n + i)];
          up[size_t(r * s.n + i)] = ref2[size_t(r * 2 * s.n + s.n + i)];
        }
      }
      for (const Act act : {Act::kSilu, Act::kGeluTanh}) {
        reference::gated_act(g.data(), up.data(), act_ref.data(), int64_t(g.size()),
                             act == Act::kSilu ? cpu::Activation::kSilu : cpu::Activation::kGeluTanh);
        dy16.poison();
        a.y = dy16.p;
        a.out = GemvOut::kGatedAct;
        a.act = act;
        launch_gemv(a, nullptr);
        EXPECT_LE(max_norm_rel(bf16_to_floats(dy16.download()), act_ref), kBf16Tol) << what << " gated act";
      }

      // Residual epilogue on a plain input: x += x_in . w^T + bias, then the next norm's input.
      const Bf16Data xin = random_bf16(rng_, size_t(s.m * s.k), 1.0f);
      const auto res = random_f32(rng_, size_t(s.m * s.n), -2.0f, 2.0f);
      const auto bias = random_f32(rng_, size_t(s.n), -0.5f, 0.5f);
      const auto nw2 = random_f32(rng_, size_t(s.n), 0.5f, 1.5f);
      std::vector<float> y(ref.size()), res_ref(ref.size()), nout_ref(ref.size());
      std::vector<double> ss_ref(size_t(s.m), 0.0);
      reference::matmul(xin.f.data(), s.m, s.k, DType::kBF16, w.bits.data(), s.n, nullptr, y.data());
      for (int64_t r = 0; r < s.m; ++r) {
        for (int64_t i = 0; i < s.n; ++i) {
          const size_t j = size_t(r * s.n + i);
          res_ref[j] = res[j] + (y[j] + bias[size_t(i)]);
          nout_ref[j] = res_ref[j] * (one_plus_w ? 1.0f + nw2[size_t(i)] : nw2[size_t(i)]);
          ss_ref[size_t(r)] += double(res_ref[j]) * res_ref[j];
        }
      }
      const int64_t parts = gemv_blocks(s.n);
      DeviceBuffer<uint16_t> dxin(xin.bits.size()), dnout(ref.size());
      DeviceBuffer<float> dres(res.size()), dbias(bias.size()), dnw2(nw2.size()), dssout(size_t(s.m * parts));
      dxin.upload(xin.bits);
      dres.upload(res);
      dbias.upload(bias);
      dnw2.upload(nw2);
      dnout.poison();
      dssout.poison();
      GemvArgs r{};
      r.x = dxin.p;
      r.w = dw.p;
      r.y = dres.p;
      r.m = s.m;
      r.n = s.n;
      r.k = s.k;
      r.in = GemvIn::kPlain;
      r.out = GemvOut::kResidual;
      r.bias = dbias.p;
      r.norm_w = dnw2.p;
      r.norm_one_plus_w = one_plus_w;
      r.norm_out = dnout.p;
      r.ss_out = dssout.p;
      if (l2) {
        r.prefetch_bytes = s.k * 2;
        r.prefetch_spread = true;
        r.ahead[0] = dw.p;  // the gate and up halves of w, as the decode layer's o_proj pulls gate/up's
        r.ahead[1] = dw.p + s.n * s.k;
        r.ahead_bytes = s.n * s.k * 2;
      }
      launch_gemv(r, nullptr);
      EXPECT_LE(max_norm_rel(dres.download(), res_ref), kF32Tol) << what << " residual";
      EXPECT_LE(max_norm_rel(bf16_to_floats(dnout.download()), nout_ref), kBf16Tol) << what << " next norm input";
      const auto parts_got = dssout.download();
      std::vector<float> ss_got(size_t(s.m)), ss_want(size_t(s.m));
      for (int64_t rr = 0; rr < s.m; ++rr) {
        double sum = 0.0;
        for (int64_t b = 0; b < parts; ++b) sum += parts_got[size_t(rr * parts + b)];
        ss_got[size_t(rr)] = float(sum);
        ss_want[size_t(rr)] = float(ss_ref[size_t(rr)]);
      }
      EXPECT_LE(max_norm_rel(ss_got, ss_want), kF32Tol) << what << " sums of squares";
    }
  }
  set_launch_tuning(LaunchTuning{});
}

// The embedding with the first norm's input: bf16(row * w) and the row's sum of squares.
TEST_F(GpuKernels, EmbeddingWithNormInput) {
  const int32_t vocab = 500, hidden = 4096, n = 3;
  const Bf16Data table = random_bf16(rng_, size_t(vocab) * hidden, 1.0f);
  const auto nw = random_f32(rng_, size_t(hidden), 0.5f, 1.5f);
  const std::vector<int32_t> ids = {7, 499, 7};
  const float scale = 0.5f;
  const size_t rows = static_cast<size_t>(n);
  std::vector<float> ref(rows * hidden), nref(ref.size()), ssref(rows);
  for (int t = 0; t < n; ++t) {
    double ss = 0.0;
    for (int c = 0; c < hidden; ++c) {
      const float v = table.f[size_t(ids[size_t(t)]) * hidden + c] * scale;
      ref[size_t(t) * hidden + c] = v;
      nref[size_t(t) * hidden + c] = v * nw[size_t(c)];
      ss += double(v) * v;
    }
    ssref[size_t(t)] = float(ss);
  }
  DeviceBuffer<uint16_t> dt(table.bits.size()), dn(ref.size());
  DeviceBuffer<int32_t> di(ids.size());
  DeviceBuffer<float> dout(ref.size()), dw(nw.size()), dss(rows);
  dt.upload(table.bits);
  di.upload(ids);
  dw.upload(nw);
  dout.poison();
  dn.poison();
  dss.poison();
  EmbedArgs a{dt.p, di.p, dout.p, n, hidden, scale};
  a.norm_w = dw.p;
  a.norm_out = dn.p;
  a.ss_out = dss.p;
  launch_embed(a, nullptr);
  EXPECT_LE(max_norm_rel(dout.download(), ref), kF32Tol);
  EXPECT_LE(max_norm_rel(bf16_to_floats(dn.download()), nref), kBf16Tol);
  EXPECT_LE(max_norm_rel(dss.download(), ssref), kF32Tol);
}

TEST_F(GpuKernels, EmbeddingGather) {
  const int32_t vocab = 1000, hidden = 320, n = 17;
  const Bf16Data table = random_bf16(rng_, size_t(vocab) * hidden, 1.0f);
  std::vector<int32_t> ids(n);
  std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
  for (auto& id : ids) id = pick(rng_);
  const float scale = 1.7f;
  std::vector<float> ref(size_t(n) * hidden);
  for (int t = 0; t < n; ++t)
    for (int c = 0; c < hidden; ++c) ref[size_t(t) * hidden + c] = table.f[size_t(ids[t]) * hidden + c] * scale;
  DeviceBuffer<uint16_t> dt(table.bits.size());
  DeviceBuffer<int32_t> di(ids.size());
  DeviceBuffer<float> dout(ref.size());
  dt.upload(table.bits);
  di.upload(ids);
  dout.poison();
  launch_embed({dt.p, di.p, dout.p, n, hidden, scale}, nullptr);
  EXPECT_LE(max_norm_rel(dout.download(), ref), kF32Tol);
}

TEST_F(GpuKernels, AddRmsNormFusedAndRowMapped) {
  for (const int32_t dim : {64, 1000, 1002, 4096}) {  // 1002: the scalar path
    for (const int one_plus_w : {0, 1}) {
      const int32_t rows = 9;
      auto x = random_f32(rng_, size_t(rows) * dim, -2.0f, 2.0f);
      auto br = random_f32(rng_, x.size(), -1.0f, 1.0f);
      auto bias = random_f32(rng_, size_t(dim), -0.5f, 0.5f);
      auto w = random_f32(rng_, size_t(dim), 0.5f, 1.5f);
      std::vector<float> sum(x.size()), ref(x.size());
      for (size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + (br[i] + bias[i % size_t(dim)]);
      reference::rms_norm(sum.data(), w.data(), ref.data(), rows, dim, 1e-6f, one_plus_w != 0);
      DeviceBuffer<float> dx(x.size()), dbr(br.size()), dbias(bias.size()), dw(w.size());
      DeviceBuffer<uint16_t> dout(x.size());
      dx.upload(x);
      dbr.upload(br);
      dbias.upload(bias);
      dw.upload(w);
      dout.poison();
      launch_add_rms_norm({dx.p, dbr.p, dbias.p, dw.p, nullptr, dout.p, rows, dim, 1e-6f, one_plus_w}, nullptr);
      EXPECT_LE(max_norm_rel(dx.download(), sum), kF32Tol) << "residual, dim " << dim;
      EXPECT_LE(max_norm_rel(bf16_to_floats(dout.download()), ref), kBf16Tol) << "norm, dim " << dim;

      // Row-mapped: rows 8, 0, 3 of the updated x, x untouched.
      const std::vector<int32_t> map = {8, 0, 3};
      std::vector<float> ref_m;
      for (int32_t r : map) ref_m.insert(ref_m.end(), ref.begin() + r * dim, ref.begin() + (r + 1) * dim);
      DeviceBuffer<int32_t> dmap(map.size());
      DeviceBuffer<uint16_t> dout_m(ref_m.size());
      dmap.upload(map);
      dout_m.poison();
      launch_add_rms_norm({dx.p, nullptr, nullptr, dw.p, dmap.p, dout_m.p, 3, dim, 1e-6f, one_plus_w}, nullptr);
      EXPECT_LE(max_norm_rel(bf16_to_floats(dout_m.download()), ref_m), kBf16Tol) << "row map, dim " << dim;
      EXPECT_LE(max_norm_rel(dx.download(), sum), 0.0) << "row-mapped norm must not write x";
    }
  }
}

// RoPE alone (full and partial rotary), then with bias and q/k norm, plus the KV pool writes.
TEST_F(GpuKernels, QkvPostRopeNormAndKvWrite) {
  struct Case { int32_t hd, rot, nh, nkv; bool bias, norm; float attn_factor; };
  for (const Case c : {Case{64, 64, 4, 2, false, false, 1.0f}, Case{128, 32, 8, 2, false, false, 1.0f},
                       Case{128, 128, 6, 3, true, true, 1.3f}, Case{256, 64, 2, 1, true, false, 1.0f}}) {
    const int32_t n = 11, bs = 4, n_blocks = 8;
    const int32_t rows = (c.nh + 2 * c.nkv) * c.hd;
    auto qkv = random_f32(rng_, size_t(n) * rows, -2.0f, 2.0f);
    auto bias = random_f32(rng_, size_t(rows), -0.5f, 0.5f);
    auto qn = random_f32(rng_, size_t(c.hd), 0.5f, 1.5f);
    auto kn = random_f32(rng_, size_t(c.hd), 0.5f, 1.5f);
    std::vector<float> inv_freq(size_t(c.rot / 2));
    for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] = float(std::pow(10000.0, -2.0 * double(i) / c.rot));
    std::vector<int32_t> pos(n);
    std::uniform_int_distribution<int32_t> pp(0, 30000);
    for (auto& p : pos) p = pp(rng_);
    std::vector<int64_t> slots(n);
    std::vector<int32_t> perm(n_blocks * bs);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng_);
    for (int t = 0; t < n; ++t) slots[t] = perm[size_t(t)];
    slots[3] = -1;  // not stored

    // Reference: bias, norm per head, rope on q and k.
    std::vector<float> q(size_t(n) * c.nh * c.hd), k(size_t(n) * c.nkv * c.hd), v(k.size());
    for (int t = 0; t < n; ++t) {
      for (int j = 0; j < rows; ++j) {
        const float val = qkv[size_t(t) * rows + j] + (c.bias ? bias[size_t(j)] : 0.0f);
        if (j < c.nh * c.hd) q[size_t(t) * c.nh * c.hd + j] = val;
        else if (j < (c.nh + c.nkv) * c.hd) k[size_t(t) * c.nkv * c.hd + j - c.nh * c.hd] = val;
        else v[size_t(t) * c.nkv * c.hd + j - (c.nh + c.nkv) * c.hd] = val;
      }
    }
    if (c.norm) {
      reference::rms_norm(q.data(), qn.data(), q.data(), int64_t(n) * c.nh, c.hd, 1e-6f, false);
      reference::rms_norm(k.data(), kn.data(), k.data(), int64_t(n) * c.nkv, c.hd, 1e-6f, false);
    }
    reference::rope(q.data(), n, c.nh, c.hd, c.rot, pos.data(), inv_freq.data(), c.attn_factor);
    reference::rope(k.data(), n, c.nkv, c.hd, c.rot, pos.data(), inv_freq.data(), c.attn_factor);

    DeviceBuffer<float> dqkv(qkv.size()), dbias(bias.size()), dqn(qn.size()), dkn(kn.size()), dfreq(inv_freq.size());
    DeviceBuffer<int32_t> dpos(pos.size());
    DeviceBuffer<int64_t> dslots(slots.size());
    const size_t pool = size_t(n_blocks) * bs * c.nkv * c.hd;
    DeviceBuffer<uint16_t> dq(q.size()), dk(pool), dv(pool);
    dqkv.upload(qkv);
    dbias.upload(bias);
    dqn.upload(qn);
    dkn.upload(kn);
    dfreq.upload(inv_freq);
    dpos.upload(pos);
    dslots.upload(slots);
    dq.poison();
    dk.poison();
    dv.poison();
    QkvPostArgs a{};
    a.qkv = dqkv.p;
    a.bias = c.bias ? dbias.p : nullptr;
    a.q_norm = c.norm ? dqn.p : nullptr;
    a.k_norm = c.norm ? dkn.p : nullptr;
    a.positions = dpos.p;
    a.inv_freq = dfreq.p;
    a.slot_mapping = dslots.p;
    a.q_out = dq.p;
    a.k_pool = dk.p;
    a.v_pool = dv.p;
    a.n = n;
    a.n_heads = c.nh;
    a.n_kv_heads = c.nkv;
    a.head_dim = c.hd;
    a.rot_dim = c.rot;
    a.attn_factor = c.attn_factor;
    a.norm_eps = 1e-6f;
    launch_qkv_post(a, nullptr);
    EXPECT_LE(max_norm_rel(bf16_to_floats(dq.download()), q), kBf16Tol) << "q, head_dim " << c.hd << " rot " << c.rot;
    const auto kp = bf16_to_floats(dk.download()), vp = bf16_to_floats(dv.download());
    std::vector<float> got_k, got_v, ref_k, ref_v;
    const size_t row = size_t(c.nkv) * c.hd;
    for (int t = 0; t < n; ++t) {
      if (slots[t] < 0) continue;
      got_k.insert(got_k.end(), kp.begin() + slots[t] * row, kp.begin() + (slots[t] + 1) * row);
      got_v.insert(got_v.end(), vp.begin() + slots[t] * row, vp.begin() + (slots[t] + 1) * row);
      ref_k.insert(ref_k.end(), k.begin() + t * row, k.begin() + (t + 1) * row);
      ref_v.insert(ref_v.end(), v.begin() + t * row, v.begin() + (t + 1) * row);
    }
    EXPECT_LE(max_norm_rel(got_k, ref_k), kBf16Tol) << "k, head_dim " << c.hd;
    EXPECT_LE(max_norm_rel(got_v, ref_v), kBf16Tol) << "v, head_dim " << c.hd;
    // The skipped token's slot stays poisoned.
    const size_t skipped = size_t(perm[3]) * row;
    EXPECT_TRUE(std::isnan(kp[skipped])) << "slot of a token with slot -1 was written";
  }
}

TEST_F(GpuKernels, GatedActivation) {
  // 700: the scalar path; 14336: 8 outputs per thread.
  for (const int32_t inter : {700, 14336})
  for (const Act act : {Act::kSilu, Act::kGeluTanh}) {
    const int32_t n = 13;
    const Bf16Data gu = random_bf16(rng_, size_t(n) * 2 * inter, 4.0f);
    std::vector<float> g(size_t(n) * inter), u(g.size()), ref(g.size());
    for (int t = 0; t < n; ++t)
      for (int i = 0; i < inter; ++i) {
        g[size_t(t) * inter + i] = gu.f[size_t(t) * 2 * inter + i];
        u[size_t(t) * inter + i] = gu.f[size_t(t) * 2 * inter + inter + i];
      }
    reference::gated_act(g.data(), u.data(), ref.data(), int64_t(g.size()),
                         act == Act::kSilu ? cpu::Activation::kSilu : cpu::Activation::kGeluTanh);
    DeviceBuffer<uint16_t> dgu(gu.bits.size()), dout(ref.size());
    dgu.upload(gu.bits);
    dout.poison();
    launch_gated_act({dgu.p, dout.p, n, inter, act}, nullptr);
    EXPECT_LE(max_norm_rel(bf16_to_floats(dout.download()), ref), kBf16Tol) << (act == Act::kSilu ? "silu" : "gelu_tanh") << " inter " << inter;
  }
}

TEST_F(GpuKernels, ArgmaxLowestIndexWinsAndNanNeverWins) {
  const int32_t rows = 5, vocab = 128256;
  auto logits = random_f32(rng_, size_t(rows) * vocab, -10.0f, 10.0f);
  logits[size_t(1) * vocab + 77] = 50.0f;  // tie: the lower index must win
  logits[size_t(1) * vocab + 90000] = 50.0f;
  logits[size_t(2) * vocab + 5] = NAN;
  logits[size_t(3) * vocab + vocab - 1] = 99.0f;
  std::vector<int32_t> ref(rows);
  for (int r = 0; r < rows; ++r) {
    int32_t best = -1;
    for (int32_t c = 0; c < vocab; ++c) {
      const float v = logits[size_t(r) * vocab + c];
      if (!std::isnan(v) && (best < 0 || v > logits[size_t(r) * vocab + best])) best = c;
    }
    ref[size_t(r)] = best;
  }
  DeviceBuffer<float> dl(logits.size());
  DeviceBuffer<int32_t> dout(rows);
  dl.upload(logits);
  dout.poison();
  launch_argmax({dl.p, dout.p, rows, vocab}, nullptr);
  EXPECT_EQ(dout.download(), ref);
  EXPECT_EQ(ref[1], 77);
}

TEST_F(GpuKernels, DeviceMemoryFailuresAreErrors) {
  auto huge = DeviceArena::create(size_t(1) << 50, "test");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.error().code, ErrorCode::kResourceExhausted);
  auto arena = DeviceArena::create(4096, "test");
  ASSERT_TRUE(arena.ok());
  EXPECT_TRUE((*arena)->take(1000, "a").ok());
  auto over = (*arena)->take(4000, "b");
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.error().message.find("b needs 4000"), std::string::npos) << over.error().message;
  KvPoolLayout kl{2, 2, 64, 16};
  auto none = KvBlockPool::create(kl, kl.bytes_per_block() - 1);
  EXPECT_FALSE(none.ok());
  auto pool = KvBlockPool::create(kl, kl.bytes_per_block() * 10 + 5);
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ((*pool)->n_blocks(), 10);
}

}  // namespace
}  // namespace strata::cuda
