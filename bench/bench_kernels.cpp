// CPU kernel benchmark on Qwen3-0.6B shapes. Prints each result next to the limit it chases:
//   (1) memory bandwidth: streaming read and memcpy over >= 1 GiB, all pool threads;
//   (2) decode, matmul m = 1 with bf16 weights: weight bytes streamed per second / (1);
//   (3) prefill, matmul m = 512: GFLOP/s / cblas_sgemm's on the same shape and threads;
//   (4) paged attention (16 query / 8 kv heads, head_dim 128, f32 KV): decode at 4096 tokens of
//       context as KV GB/s / (1), prefill of 512 tokens as GFLOP/s / strata's matmul rate in (3).
// Usage: bench_kernels [threads=2] [--quick]
#include <cblas.h>
#include <dlfcn.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "bench/bench_util.h"
#include "core/thread_pool.h"

namespace {

using namespace strata;
using namespace strata::bench;

std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Sum of 64-bit words [b, e) with wide loads, so one core can keep enough reads in flight
// to approach what it can pull from memory.
struct Shape {
  const char* name;
  int64_t n, k;  // W [n, k]
};

const Shape kShapes[] = {
    {"q_proj   2048x1024", 2048, 1024}, {"k/v_proj 1024x1024", 1024, 1024}, {"o_proj   1024x2048", 1024, 2048},
    {"gate/up  3072x1024", 3072, 1024}, {"down     1024x3072", 1024, 3072}, {"lm_head 151936x1024", 151936, 1024},
};

std::vector<uint16_t> random_bf16(size_t n, uint64_t seed) {
  const auto f = random_floats(n, seed);
  std::vector<uint16_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(f[i]);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0)
      quick = true;
    else
      threads = std::atoi(argv[i]);
  }
  ThreadPool pool(threads);
  std::printf("strata bench_kernels: %d threads, simd level %s, OpenBLAS core %s\n", threads, cpu::simd_level_name(),
              blas_core_name());

  // (1) Memory bandwidth.
  const size_t bw_bytes = quick ? (size_t(256) << 20) : (size_t(1) << 30);
  const Bandwidth bw = measure_bandwidth(pool, bw_bytes, quick ? 3 : 5);
  std::printf("\n(1) memory bandwidth over %zu MiB: streaming read %.1f GB/s, memcpy %.1f GB/s (read+written)\n",
              bw_bytes >> 20, bw.read_gbs, bw.copy_gbs);

  // (2) Decode: m = 1, bf16 weights. Enough copies of each matrix are cycled that the working
  // set (>= 512 MiB) cannot sit in cache, as in a real decode step over all layers.
  std::printf("\n(2) decode matmul m=1, bf16 weights (ratio = weight GB/s / streaming-read GB/s)\n");
  const size_t working_set = quick ? (size_t(128) << 20) : (size_t(512) << 20);
  for (const Shape& s : kShapes) {
    const size_t w_bytes = size_t(s.n * s.k) * 2;
    const size_t copies = std::max<size_t>(1, (working_set + w_bytes - 1) / w_bytes);
    const auto src = random_bf16(size_t(s.n * s.k), 1);
    std::vector<WeightMatrix> ws;
    for (size_t c = 0; c < copies; ++c) ws.push_back(cpu::pack_weight(DType::kBF16, src.data(), s.n, s.k));
    const auto x = random_floats(size_t(s.k), 2);
    std::vector<float> y(size_t(s.n));
    const int reps = quick ? 2 : 5;
    const double t = best_seconds(reps, [&] {
      for (const auto& w : ws) cpu::matmul(pool, x.data(), 1, w, nullptr, y.data());
    }) / double(copies);
    const double gbs = double(w_bytes) / t / 1e9;
    std::printf("  %-20s %8.1f us  %6.1f GB/s  ratio %.2f\n", s.name, t * 1e6, gbs, gbs / bw.read_gbs);
  }

  // (2b) Decode with quantized weights (dequantized in the kernel): bytes of codes, scales and
  // biases streamed per second / (1).
  std::printf("\n(2b) decode matmul m=1, quantized weights, group 64 (ratio = held bytes GB/s / streaming-read GB/s)\n");
  for (WeightQuant q : {WeightQuant::kAffine8, WeightQuant::kAffine4, WeightQuant::kFp8}) {
    const char* qname = q == WeightQuant::kAffine8 ? "int8" : q == WeightQuant::kAffine4 ? "int4" : "fp8";
    for (const Shape& s : kShapes) {
      const int32_t group = 64;
      const int64_t groups = (s.k + group - 1) / group;
      std::vector<uint8_t> codes(size_t(s.n * s.k));
      for (size_t i = 0; i < codes.size(); ++i) codes[i] = uint8_t((i * 2654435761u >> 7) % (q == WeightQuant::kAffine4 ? 16 : 120));
      auto scales = random_floats(size_t(s.n * groups), 5);
      for (auto& v : scales) v = 0.001f + 0.01f * std::fabs(v);
      const auto biases = random_floats(size_t(s.n * groups), 6);
      cpu::QuantWeightSource src;
      src.quant = q;
      src.codes = codes.data();
      src.scales = scales.data();
      src.biases = q == WeightQuant::kFp8 ? nullptr : biases.data();
      src.group = group;
      const WeightMatrix w0 = cpu::pack_quant_weight(src, s.n, s.k);
      const size_t w_bytes = size_t(cpu::weight_bytes(w0));
      const size_t copies = std::max<size_t>(1, (working_set + w_bytes - 1) / w_bytes);
      std::vector<WeightMatrix> ws{w0};
      for (size_t c = 1; c < copies; ++c) ws.push_back(cpu::pack_quant_weight(src, s.n, s.k));
      const auto x = random_floats(size_t(s.k), 2);
      std::vector<float> y(size_t(s.n));
      const double t = best_seconds(quick ? 2 : 5, [&] {
        for (const auto& w : ws) cpu::matmul(pool, x.data(), 1, w, nullptr, y.data());
      }) / double(copies);
      const double gbs = double(w_bytes) / t / 1e9;
      std::printf("  %-5s %-20s %8.1f us  %6.1f GB/s  ratio %.2f\n", qname, s.name, t * 1e6, gbs, gbs / bw.read_gbs);
    }
  }

  // (3) Prefill: m = 512 against OpenBLAS sgemm (f32 weights) on the same threads.
  std::printf("\n(3) prefill matmul m=512 (ratio = strata GFLOP/s / cblas_sgemm GFLOP/s, both %d threads)\n", threads);
  blas_set_threads(threads);
  const int64_t m = 512;
  const auto x = random_floats(size_t(m * 3072), 3);
  double best_matmul_gflops = 0.0;
  for (const Shape& s : kShapes) {
    if (s.n > 8192 && quick) continue;
    const double flops = 2.0 * double(m) * double(s.n) * double(s.k);
    const auto wf = random_floats(size_t(s.n * s.k), 4);
    const auto wb = random_bf16(size_t(s.n * s.k), 4);
    const WeightMatrix pf = cpu::pack_weight(DType::kF32, wf.data(), s.n, s.k);
    const WeightMatrix pb = cpu::pack_weight(DType::kBF16, wb.data(), s.n, s.k);
    std::vector<float> y(size_t(m * s.n));
    const int reps = s.n > 8192 ? 2 : (quick ? 3 : 6);
    const double t_f32 = best_seconds(reps, [&] { cpu::matmul(pool, x.data(), m, pf, nullptr, y.data()); });
    const double t_bf16 = best_seconds(reps, [&] { cpu::matmul(pool, x.data(), m, pb, nullptr, y.data()); });
    const double t_blas = best_seconds(reps, [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(s.n), int(s.k), 1.0f, x.data(), int(s.k),
                  wf.data(), int(s.k), 0.0f, y.data(), int(s.n));
    });
    const double g_blas = flops / t_blas / 1e9;
    best_matmul_gflops = std::max(best_matmul_gflops, flops / t_f32 / 1e9);
    std::printf("  %-20s sgemm %6.1f GFLOP/s | strata f32 %6.1f (ratio %.2f) | strata bf16 %6.1f (ratio %.2f)\n", s.name,
                g_blas, flops / t_f32 / 1e9, t_blas / t_f32, flops / t_bf16 / 1e9, t_blas / t_bf16);
  }

  // (4) Attention.
  std::printf("\n(4) paged attention, 16/8 heads, head_dim 128, block 16, f32 KV\n");
  {
    const int32_t n_heads = 16, n_kv = 8, hd = 128, bs = 16, ctx = 4096;
    const int32_t n_blocks = ctx / bs;
    const auto k_pool = random_floats(size_t(n_blocks) * bs * n_kv * hd, 5);
    const auto v_pool = random_floats(size_t(n_blocks) * bs * n_kv * hd, 6);
    std::vector<int32_t> table(static_cast<size_t>(n_blocks));
    for (int32_t i = 0; i < n_blocks; ++i) table[size_t(i)] = (i * 7919) % n_blocks;  // scattered blocks
    const auto q = random_floats(size_t(512) * n_heads * hd, 7);
    std::vector<float> out(size_t(512) * n_heads * hd);
    cpu::PagedAttentionArgs a{};
    a.q = q.data();
    a.out = out.data();
    a.k_pool = k_pool.data();
    a.v_pool = v_pool.data();
    a.block_table = table.data();
    a.block_size = bs;
    a.n_heads = n_heads;
    a.n_kv_heads = n_kv;
    a.head_dim = hd;
    a.head_dim_v = hd;
    a.scale = 0.088f;
    a.n_q = 1;
    a.pos0 = ctx - 1;
    const double t_dec = best_seconds(quick ? 3 : 10, [&] { cpu::paged_attention(pool, a); });
    const double kv_bytes = 2.0 * double(ctx) * n_kv * hd * sizeof(float);
    std::printf("  decode, context %d: %8.1f us  KV %6.1f GB/s  ratio %.2f (to streaming read)\n", ctx, t_dec * 1e6,
                kv_bytes / t_dec / 1e9, kv_bytes / t_dec / 1e9 / bw.read_gbs);
    a.n_q = 512;
    a.pos0 = 0;
    const double t_pre = best_seconds(quick ? 2 : 4, [&] { cpu::paged_attention(pool, a); });
    const double flops = 4.0 * n_heads * hd * (512.0 * 513.0 / 2.0);
    std::printf("  prefill, 512 tokens:  %8.1f ms  %6.1f GFLOP/s  ratio %.2f (to strata's best f32 matmul rate)\n",
                t_pre * 1e3, flops / t_pre / 1e9, flops / t_pre / 1e9 / best_matmul_gflops);
  }
  return 0;
}
