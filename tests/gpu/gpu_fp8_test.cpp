// FP8 weights on the GPU (backend/cuda/fp8.h): the block quantizer against its definition, the
// FP8 GEMV (plain, gated-activation and residual outputs) and the block-scaled FP8 GEMM of
// gemm.h against a float64 reference computed on the host from the codes decoded by
// tensor/dtype.h's e4m3fn table (independent of the device's conversion). Needs a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "backend/cuda/fp8.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "gpu_test_util.h"
#include "tensor/dtype.h"

namespace strata::cuda {
namespace {

using namespace strata::gpu_test;

// Uniform values times a power of two per 128 x 128 block (rows x cols) from 1/8 to 8, so every
// block has its own scale and a scale read from the wrong block shows.
Bf16Data blocky_bf16(std::mt19937& rng, int64_t rows, int64_t cols, float scale, int64_t block_rows) {
  Bf16Data d = random_bf16(rng, size_t(rows * cols), scale);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int e = int((r / block_rows) * 3 + (c / 128) * 5) % 7 - 3;
      const size_t i = size_t(r * cols + c);
      d.bits[i] = f32_to_bf16(std::ldexp(d.f[i], e));
      d.f[i] = bf16_to_f32(d.bits[i]);
    }
  return d;
}

struct Fp8Matrix {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  std::vector<float> deq;  // codes decoded on the host times their block scale
};

// Quantizes w [n, k] on the device and decodes the result on the host; checks the definition
// (scale = block amax / 448, every code within e4m3's rounding of w / scale).
Fp8Matrix quantize(const Bf16Data& w, int64_t n, int64_t k, DeviceBuffer<uint16_t>& dw, DeviceBuffer<uint8_t>& dq,
                   DeviceBuffer<float>& ds) {
  dw.upload(w.bits);
  launch_quantize_fp8_blocks(dw.p, dq.p, ds.p, n, k, nullptr);
  Fp8Matrix m;
  m.codes = dq.download();
  m.scales = ds.download();
  m.deq.resize(size_t(n * k));
  const int64_t kb = fp8_blocks(k);
  std::vector<float> amax(m.scales.size(), 0.0f);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      float& a = amax[size_t((r / 128) * kb + c / 128)];
      a = std::max(a, std::fabs(w.f[size_t(r * k + c)]));
    }
  int64_t bad = 0;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const size_t b = size_t((r / 128) * kb + c / 128), i = size_t(r * k + c);
      const float s = m.scales[b];
      if (r % 128 == 0 && c % 128 == 0) EXPECT_FLOAT_EQ(s, amax[b] > 0 ? amax[b] / 448.0f : 1.0f) << r << "," << c;
      m.deq[i] = fp8_e4m3fn_to_f32(m.codes[i]) * s;
      // e4m3: 3 mantissa bits, half an ulp 2^-4 relative; subnormals below 2^-6 absolute 2^-10.
      const float want = w.f[i] / s;
      if (std::fabs(fp8_e4m3fn_to_f32(m.codes[i]) - want) > std::max(std::fabs(want) * 0.0625f, 0.001f)) ++bad;
    }
  EXPECT_EQ(bad, 0);
  return m;
}

TEST(GpuFp8, GemvMatchesTheDecodedWeights) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(fresh_seed());
  // Ragged shapes: rows past a whole block, k not a multiple of 128 (a partial last block).
  for (const auto [n, k] : {std::pair<int64_t, int64_t>{300, 1040}, {1024, 4096}, {128, 16}}) {
    for (const GemvOut out : {GemvOut::kF32, GemvOut::kGatedAct, GemvOut::kResidual}) {
      const int64_t rows = out == GemvOut::kGatedAct ? 2 * n : n;
      if (out == GemvOut::kGatedAct && n % 128 != 0) continue;  // gate and up stack whole blocks
      for (int64_t m = 1; m <= kGemvMaxRows; ++m) {
        const Bf16Data w = blocky_bf16(rng, rows, k, 0.05f, 128);
        const Bf16Data x = random_bf16(rng, size_t(m * k), 1.0f);
        DeviceBuffer<uint16_t> dw(size_t(rows * k)), dx(size_t(m * k));
        DeviceBuffer<uint8_t> dq(size_t(rows * k));
        DeviceBuffer<float> ds(size_t(fp8_blocks(rows) * fp8_blocks(k)));
        const Fp8Matrix q = quantize(w, rows, k, dw, dq, ds);
        dx.upload(x.bits);
        std::vector<float> ref(size_t(m * n));
        std::vector<float> res0 = random_f32(rng, size_t(m * n), -1.0f, 1.0f);
        for (int64_t r = 0; r < m; ++r)
          for (int64_t j = 0; j < n; ++j) {
            double g = 0, u = 0;
            for (int64_t c = 0; c < k; ++c) {
              g += double(q.deq[size_t(j * k + c)]) * x.f[size_t(r * k + c)];
              if (out == GemvOut::kGatedAct) u += double(q.deq[size_t((n + j) * k + c)]) * x.f[size_t(r * k + c)];
            }
            double v = g;
            if (out == GemvOut::kGatedAct) v = g / (1.0 + std::exp(-g)) * u;
            if (out == GemvOut::kResidual) v = res0[size_t(r * n + j)] + g;
            ref[size_t(r * n + j)] = float(v);
          }
        GemvArgs a{};
        a.x = dx.p;
        a.w = reinterpret_cast<const uint16_t*>(dq.p);
        a.m = m;
        a.n = n;
        a.k = k;
        a.out = out;
        a.act = Act::kSilu;
        a.w_scale = ds.p;
        a.w_scale_ld = fp8_blocks(k);
        std::vector<float> got(size_t(m * n));
        if (out == GemvOut::kGatedAct) {
          DeviceBuffer<uint16_t> dy(size_t(m * n));
          a.y = dy.p;
          launch_gemv(a, nullptr);
          got = bf16_to_floats(dy.download());
        } else {
          DeviceBuffer<float> dy(size_t(m * n));
          if (out == GemvOut::kResidual) dy.upload(res0);
          a.y = dy.p;
          launch_gemv(a, nullptr);
          got = dy.download();
        }
        ASSERT_CUDA_OK(cudaDeviceSynchronize());
        const double err = max_norm_rel(got, ref);
        // f32 sums of k products (kF32, kResidual); the gated output is rounded to bf16.
        const double tol = out == GemvOut::kGatedAct ? 8e-3 : 2e-5;
        EXPECT_LE(err, tol) << "n=" << n << " k=" << k << " m=" << m << " out=" << int(out);
      }
    }
  }
}

// The block-scaled FP8 GEMM: x quantized per token and 128 columns, cuBLASLt against the
// host's float64 product of both operands decoded. Row counts past a multiple of 16 take the
// padded tail. Every weight-scale layout is tried and printed; the one the probe of enable_fp8
// picks (Gemm::fp8_weight_scale_layout) must match (every block has its own scale, so a layout
// read wrongly shows; k = 384 has a scale row of 3 blocks, where a padded leading dimension
// differs).
TEST(GpuFp8, BlockScaledGemmMatchesTheDecodedOperands) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(fresh_seed());
  DeviceBuffer<uint8_t> workspace(size_t(32) << 20);
  Gemm::set_fp8_weight_scale_layout(-1);
  {
    auto g = Gemm::create(workspace.p, workspace.n);
    ASSERT_TRUE(g.ok());
    const Status st = (*g)->enable_fp8(16, 256, 256);
    ASSERT_TRUE(st.ok()) << st.error().to_string();
  }
  const int32_t probed = Gemm::fp8_weight_scale_layout();
  std::printf("cuBLASLt reads 128x128 weight scales %s fastest, leading dimension %s\n", (probed & 1) ? "k" : "n",
              (probed & 2) ? "rounded up to 4" : "exact");
  ASSERT_TRUE(probed >= 0 && probed < 4);
  for (const auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{64, 768, 1024}, {130, 512, 2048}, {5, 384, 1024}, {48, 256, 384},
                               {512, 1024, 4096}}) {
    const Bf16Data w = blocky_bf16(rng, n, k, 0.05f, 128);
    const Bf16Data x = blocky_bf16(rng, m, k, 1.0f, 1);  // every row and group its own scale
    DeviceBuffer<uint16_t> dw(size_t(n * k)), dx(size_t(m * k));
    DeviceBuffer<uint8_t> dq(size_t(n * k)), dxq(size_t(m * k));
    DeviceBuffer<float> ds(size_t(fp8_blocks(n) * fp8_blocks(k))), dxs(size_t(m * fp8_blocks(k)));
    const Fp8Matrix q = quantize(w, n, k, dw, dq, ds);
    dx.upload(x.bits);
    // The activations as the GEMM quantizes them (row-major scales here), decoded on the host.
    launch_quantize_fp8_rows(dx.p, dxq.p, dxs.p, m, k, fp8_blocks(k), 1, nullptr);
    const std::vector<uint8_t> xc = dxq.download();
    const std::vector<float> xs = dxs.download();
    std::vector<float> ref(size_t(m * n));
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t c = 0; c < k; ++c) {
          const double xv = double(fp8_e4m3fn_to_f32(xc[size_t(r * k + c)])) * xs[size_t(r * fp8_blocks(k) + c / 128)];
          acc += double(q.deq[size_t(j * k + c)]) * xv;
        }
        ref[size_t(r * n + j)] = float(acc);
      }
    for (int32_t layout = 0; layout < 4; ++layout) {
      Gemm::set_fp8_weight_scale_layout(layout);
      auto g = Gemm::create(workspace.p, workspace.n);
      ASSERT_TRUE(g.ok());
      ASSERT_TRUE((*g)->enable_fp8(m, k, n).ok());
      const uint16_t* wkey = reinterpret_cast<const uint16_t*>(dq.p);
      ASSERT_TRUE((*g)->add_fp8(wkey, ds.p, n, k).ok());
      for (const GemmOut out : {GemmOut::kF32, GemmOut::kBF16}) {
        std::vector<float> got;
        if (out == GemmOut::kF32) {
          DeviceBuffer<float> dy(size_t(m * n));
          dy.poison();
          (*g)->run(nullptr, dx.p, wkey, dy.p, out, m, n, k);
          got = dy.download();
        } else {
          DeviceBuffer<uint16_t> dy(size_t(m * n));
          dy.poison();
          (*g)->run(nullptr, dx.p, wkey, dy.p, out, m, n, k);
          got = bf16_to_floats(dy.download());
        }
        ASSERT_CUDA_OK(cudaDeviceSynchronize());
        const double err = max_norm_rel(got, ref);
        std::printf("m=%lld n=%lld k=%lld %s, weight scale layout %d%s: max-norm rel %.3g\n", (long long)m, (long long)n,
                    (long long)k, out == GemmOut::kF32 ? "f32" : "bf16", layout, layout == probed ? " (probed)" : "", err);
        // Hopper's FP8 tensor cores keep their partial sums at less than f32's precision between
        // cuBLASLt's promotions to f32 (measured 1.3e-4 to 2.4e-4 over two runs); bf16 output rounds once more.
        const double tol = out == GemmOut::kF32 ? 5e-4 : 8e-3;
        if (layout == probed) EXPECT_LE(err, tol) << "m=" << m << " n=" << n << " k=" << k;
      }
    }
  }
  Gemm::set_fp8_weight_scale_layout(probed);
}

}  // namespace
}  // namespace strata::cuda
