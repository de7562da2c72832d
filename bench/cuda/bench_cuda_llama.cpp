// Llama-3.1-8B-shaped model on the GPU with random bf16 weights drawn on the device. Measures,
// in one run: the device copy bandwidth (cudaMemcpy device to device, bytes read + written),
// the bf16 GEMM rate (cuBLASLt, 8192^3, fp32 accumulate), decode at batch 1 after a
// 512-token prompt (tok/s and its ratio to the bandwidth ceiling = bandwidth / bytes read per
// token), and prefill of one 4096-token prompt (tok/s and the ratio of its model FLOP rate
// to the measured GEMM rate). Two breakdowns come first: the decode step's GEMMs alone at
// m = 1, and one layer's prefill attention alone.
// Then the serving shape: decode of 256 sequences at 1-2k tokens (GEMMs alone, attention alone,
// whole steps).
// Usage: bench_cuda_llama [decode_steps=128] [prefill_reps=3] [batch: the big-batch sections only |
//        deterministic: only the cost of CudaModelOptions::deterministic, see deterministic_cost |
//        decode1: batch-1 decode under the GEMV and L2 settings, with parts of the step left out,
//        the GEMVs and attention alone]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "bench_models.h"
#include "bench_timing.h"
#include "runtime/cuda/cuda_model.h"

using namespace strata;
using namespace strata::cuda;
using namespace strata::cuda::bench;

namespace {

// The decode step's GEMMs alone (m = 1, the Llama-8B weight shapes, fresh weights), back to
// back on one stream: how close cuBLASLt's GEMV path comes to the copy bandwidth, apart from
// every other kernel and the host.
void gemm_only_decode(cudaStream_t st, double bw, int64_t gemv_rows) {
  const int64_t H = 4096, I = 14336, L = 32, V = 128256, qkv = (32 + 16) * 128;
  struct Shape { int64_t n, k; };
  std::vector<Shape> shapes;
  for (int64_t l = 0; l < L; ++l) {
    shapes.push_back({qkv, H});
    shapes.push_back({H, H});
    shapes.push_back({2 * I, H});
    shapes.push_back({H, I});
  }
  shapes.push_back({V, H});
  int64_t elems = 0;
  for (const auto& s : shapes) elems += s.n * s.k;
  uint16_t *w = nullptr, *x = nullptr;
  float* y = nullptr;
  void* ws = nullptr;
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&w), size_t(elems) * 2));
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&x), size_t(2 * I) * 2));
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&y), size_t(V) * 4));
  STRATA_CUDA_CHECK(cudaMalloc(&ws, size_t(32) << 20));
  launch_fill_random_bf16(w, elems, 21, 0.02f, st);
  launch_fill_random_bf16(x, 2 * I, 22, 1.0f, st);
  auto g = Gemm::create(ws, size_t(32) << 20);
  if (!g.ok()) std::exit(1);
  (*g)->set_gemv_rows(gemv_rows);
  // The GEMV under each launch setting (programmatic dependent launch, L2 prefetch of the
  // weight rows before the wait); cuBLASLt once.
  const LaunchTuning saved = launch_tuning();
  std::vector<LaunchTuning> tunings = {saved};
  if (gemv_rows > 0) {
    tunings = {};
    for (const int32_t u : {4, 8, 16}) {
      LaunchTuning t;
      t.gemv_unroll = u;
      tunings.push_back(t);
    }
    tunings.front().pdl = false;
    tunings.push_back(tunings.front());
    tunings.back().pdl = true;
    // 16 and 8 loads without the first step's weights loaded before the wait.
    tunings.push_back(tunings[2]);
    tunings.back().gemv_preload = false;
    tunings.push_back(tunings[1]);
    tunings.back().gemv_preload = false;
  }
  for (const LaunchTuning& tune : tunings) {
    set_launch_tuning(tune);
    const std::vector<double> t = time_runs(st, 3, 10, [&] {
      int64_t off = 0;
      for (const auto& s : shapes) {
        (*g)->run(st, x, w + off, y, GemmOut::kF32, 1, s.n, s.k);
        off += s.n * s.k;
      }
    });
    const double ms = median(t);
    std::printf("decode GEMMs only, %s (m=1, %zu launches, %.3f GB), pdl %d, prefetch %d B, unroll %d, preload %d: %.3f ms "
                "-> %.1f%% of copy bandwidth\n",
                gemv_rows > 0 ? "weight-stream GEMV" : "cuBLASLt", shapes.size(), double(elems) * 2e-9, int(tune.pdl),
                int(tune.gemv_prefetch_bytes), int(tune.gemv_unroll), int(tune.gemv_preload), ms,
                100.0 * (double(elems) * 2 / (ms * 1e-3)) / bw);
  }
  set_launch_tuning(saved);
  // Under the default setting, each shape alone: 32 back-to-back launches of one layer's shape
  // (a fresh weight matrix each, as in a step), the lm_head once per run.
  if (gemv_rows > 0) {
    const char* names[5] = {"qkv", "o_proj", "gate_up", "down", "lm_head"};
    std::vector<int64_t> offs(shapes.size(), 0);  // element offset of each shape's weights
    for (size_t i = 1; i < shapes.size(); ++i) offs[i] = offs[i - 1] + shapes[i - 1].n * shapes[i - 1].k;
    for (int kind = 0; kind < 5; ++kind) {
      const size_t first = kind < 4 ? size_t(kind) : shapes.size() - 1;
      const Shape s = shapes[first];
      const int64_t reps = kind < 4 ? L : 1;
      const std::vector<double> t = time_runs(st, 2, 10, [&] {
        for (int64_t l = 0; l < reps; ++l) (*g)->run(st, x, w + offs[first + size_t(4 * l)], y, GemmOut::kF32, 1, s.n, s.k);
      });
      const double us = 1000.0 * median(t) / double(reps);
      std::printf("  GEMV m=1 %s (n %lld, k %lld, %lld blocks): %.2f us per launch -> %.1f%% of copy bandwidth\n", names[kind],
                  static_cast<long long>(s.n), static_cast<long long>(s.k), static_cast<long long>(gemv_blocks(s.n)), us,
                  100.0 * double(s.n * s.k * 2) / (us * 1e-6) / bw);
    }
    // The QKV shape with two warps per row (the fused decode's QKV GEMV).
    const Shape q = shapes[0];
    const std::vector<double> tq = time_runs(st, 2, 10, [&] {
      for (int64_t l = 0; l < L; ++l) {
        GemvArgs a{};
        a.x = x;
        a.w = w + offs[size_t(4 * l)];
        a.y = y;
        a.m = 1;
        a.n = q.n;
        a.k = q.k;
        a.in = GemvIn::kPlain;
        a.out = GemvOut::kF32;
        a.warps_per_row = 2;
        launch_gemv(a, st);
      }
    });
    const double us = 1000.0 * median(tq) / double(L);
    std::printf("  GEMV m=1 qkv, 2 warps per row (%lld blocks): %.2f us per launch -> %.1f%% of copy bandwidth\n",
                static_cast<long long>(2 * gemv_blocks(q.n)), us, 100.0 * double(q.n * q.k * 2) / (us * 1e-6) / bw);
  }
  g->reset();
  cudaFree(w);
  cudaFree(x);
  cudaFree(y);
  cudaFree(ws);
}

// One layer's paged attention for a fresh 4096-token prompt (32/8 heads, head_dim 128).
void prefill_attention_only(cudaStream_t st) {
  const int32_t n = 4096, nh = 32, nkv = 8, hd = 128, bs = 16, group = nh / nkv;
  const int32_t tpt = attention_tokens_per_tile(nh, nkv, hd, 1);
  (void)group;
  uint16_t *q = nullptr, *o = nullptr, *k = nullptr, *v = nullptr;
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&q), size_t(n) * nh * hd * 2));
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&o), size_t(n) * nh * hd * 2));
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&k), size_t(n) * nkv * hd * 2));
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&v), size_t(n) * nkv * hd * 2));
  launch_fill_random_bf16(q, int64_t(n) * nh * hd, 31, 1.0f, st);
  launch_fill_random_bf16(k, int64_t(n) * nkv * hd, 32, 1.0f, st);
  launch_fill_random_bf16(v, int64_t(n) * nkv * hd, 33, 1.0f, st);
  std::vector<int32_t> table(n / bs), q_start = {0, n}, pos0 = {0}, tile_seq, tile_q0;
  for (int32_t i = 0; i < n / bs; ++i) table[size_t(i)] = i;
  for (int32_t q0 = 0; q0 < n; q0 += tpt) {
    tile_seq.push_back(0);
    tile_q0.push_back(q0);
  }
  int32_t *dt = nullptr, *dqs = nullptr, *dp = nullptr, *dts = nullptr, *dtq = nullptr;
  auto up = [&](int32_t** d, const std::vector<int32_t>& h) {
    STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(d), h.size() * 4));
    STRATA_CUDA_CHECK(cudaMemcpy(*d, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  };
  up(&dt, table);
  up(&dqs, q_start);
  up(&dp, pos0);
  up(&dts, tile_seq);
  up(&dtq, tile_q0);
  PagedAttentionArgs a{};
  a.q = q;
  a.out = o;
  a.k_pool = k;
  a.v_pool = v;
  a.block_tables = dt;
  a.seq_q_start = dqs;
  a.seq_pos0 = dp;
  a.tile_seq = dts;
  a.tile_q0 = dtq;
  a.n_tokens = n;
  a.n_tiles = int32_t(tile_seq.size());
  a.tokens_per_tile = tpt;
  a.n_splits = 1;
  a.max_blocks_per_seq = n / bs;
  a.block_size = bs;
  a.n_heads = nh;
  a.n_kv_heads = nkv;
  a.head_dim = hd;
  a.scale = 0.0883883f;
  for (const int min_blocks : {2, 3}) {
    set_flash_attention_min_blocks(min_blocks);
    const std::vector<double> t = time_runs(st, 2, 6, [&] { launch_paged_attention(a, st); });
    const double ms = median(t);
    const double flops = 4.0 * nh * hd * (double(n) * (n + 1) / 2.0);
    std::printf("prefill attention alone (tensor cores, %d blocks/SM variant), one layer of 4096 tokens: %.2f ms "
                "(x32 layers = %.0f ms) -> %.1f TFLOP/s\n",
                min_blocks, ms, 32 * ms, flops / ms * 1e-9);
  }
  for (void* p : {static_cast<void*>(q), static_cast<void*>(o), static_cast<void*>(k), static_cast<void*>(v),
                  static_cast<void*>(dt), static_cast<void*>(dqs), static_cast<void*>(dp), static_cast<void*>(dts),
                  static_cast<void*>(dtq)})
    cudaFree(p);
}

// Decode attention alone: 32 back-to-back launches (one per layer) of the split-KV kernel for
// one sequence at `ctx` cached tokens (32/8 heads, head_dim 128, 32 splits), unfused (QKV
// post, attention, combine: 3 launches) and fused (1 launch): the attention share of a step.
void decode_attention_only(cudaStream_t st, int32_t ctx) {
  const int32_t nh = 32, nkv = 8, hd = 128, bs = 16, splits = 32, layers = 32;
  const int32_t rows = (nh + 2 * nkv) * hd, n_blocks = ctx / bs + 2;
  uint16_t *q = nullptr, *o = nullptr, *k = nullptr, *v = nullptr;
  float *qkv = nullptr, *po = nullptr, *pml = nullptr, *freq = nullptr;
  int32_t* meta = nullptr;
  int64_t* slot = nullptr;
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&q), size_t(nh) * hd * 2));
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&o), size_t(nh) * hd * 2));
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&k), size_t(n_blocks) * bs * nkv * hd * 2));
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&v), size_t(n_blocks) * bs * nkv * hd * 2));
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&qkv), size_t(rows) * 4));
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&po), size_t(splits) * nh * hd * 4));
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&pml), size_t(splits) * nh * 2 * 4));
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&freq), size_t(hd / 2) * 4));
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&slot), 8));
  launch_fill_random_bf16(k, int64_t(n_blocks) * bs * nkv * hd, 41, 1.0f, st);
  launch_fill_random_bf16(v, int64_t(n_blocks) * bs * nkv * hd, 42, 1.0f, st);
  launch_fill_f32(qkv, rows, 0.5f, st);
  launch_fill_f32(freq, hd / 2, 0.01f, st);
  // meta: table [n_blocks], q_start {0, 1}, pos0 {ctx}, tile_seq {0}, tile_q0 {0}, counters [nkv]
  std::vector<int32_t> h(size_t(n_blocks) + 6 + nkv, 0);
  for (int32_t i = 0; i < n_blocks; ++i) h[size_t(i)] = i;
  h[size_t(n_blocks) + 1] = 1;
  h[size_t(n_blocks) + 2] = ctx;
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&meta), h.size() * 4));
  STRATA_CUDA_CHECK(cudaMemcpy(meta, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  const int64_t slot_h = ctx;
  STRATA_CUDA_CHECK(cudaMemcpy(slot, &slot_h, 8, cudaMemcpyHostToDevice));
  QkvPostArgs post{};
  post.qkv = qkv;
  post.positions = meta + n_blocks + 2;
  post.inv_freq = freq;
  post.slot_mapping = slot;
  post.q_out = q;
  post.k_pool = k;
  post.v_pool = v;
  post.n = 1;
  post.n_heads = nh;
  post.n_kv_heads = nkv;
  post.head_dim = hd;
  post.rot_dim = hd;
  post.attn_factor = 1.0f;
  post.norm_eps = 1e-5f;
  PagedAttentionArgs a{};
  a.q = q;
  a.out = o;
  a.k_pool = k;
  a.v_pool = v;
  a.block_tables = meta;
  a.seq_q_start = meta + n_blocks;
  a.seq_pos0 = meta + n_blocks + 2;
  a.tile_seq = meta + n_blocks + 3;
  a.tile_q0 = meta + n_blocks + 4;
  a.partial_out = po;
  a.partial_ml = pml;
  a.n_tokens = 1;
  a.n_tiles = 1;
  a.tokens_per_tile = 1;
  a.n_splits = splits;
  a.max_blocks_per_seq = n_blocks;
  a.block_size = bs;
  a.n_heads = nh;
  a.n_kv_heads = nkv;
  a.head_dim = hd;
  a.scale = 0.0883883f;
  for (const int32_t variant : {0, 1, 2, 3}) {  // unfused 32 splits; fused 32, 16, 8 splits
    const bool fused = variant > 0;
    PagedAttentionArgs f = a;
    f.n_splits = variant < 2 ? 32 : (variant == 2 ? 16 : 8);
    if (fused) {
      f.post = post;
      f.split_counters = meta + n_blocks + 6;
    }
    const std::vector<double> t = time_runs(st, 3, 10, [&] {
      for (int l = 0; l < layers; ++l) {
        if (!fused) launch_qkv_post(post, st);
        launch_paged_attention(f, st);
        launch_attention_combine(f, st);
      }
    });
    std::printf("decode attention alone, %s, ctx %d, %d splits, x32 layers: %.3f ms (%.2f us per layer)\n",
                fused ? "fused (1 launch)" : "unfused (qkv post + attention + combine)", ctx, int(f.n_splits), median(t),
                1000.0 * median(t) / layers);
  }
  for (void* p : {static_cast<void*>(q), static_cast<void*>(o), static_cast<void*>(k), static_cast<void*>(v),
                  static_cast<void*>(qkv), static_cast<void*>(po), static_cast<void*>(pml), static_cast<void*>(freq),
                  static_cast<void*>(meta), static_cast<void*>(slot)})
    cudaFree(p);
}

// Decode attention alone at a big batch: `batch` sequences of `ctx` cached tokens each (one
// layer's pools, contiguous blocks per sequence, 32/8 heads, head_dim 128), one query token
// each, 32 back-to-back launches (one per layer, same pools: 1-2 GB, far past L2). Reports the
// KV bytes read per second against the copy bandwidth, for the tensor-core decode kernel (1 and
// 2 splits) and the 64-row flash tile it replaces.
void batch_decode_attention_only(cudaStream_t st, double bw, int32_t batch, int32_t ctx) {
  const int32_t nh = 32, nkv = 8, hd = 128, bs = 16, layers = 32, max_splits = 4;
  const int32_t per_seq = ctx / bs + 1;
  const int64_t pool = int64_t(batch) * per_seq * bs * nkv * hd;
  uint16_t *q = nullptr, *o = nullptr, *k = nullptr, *v = nullptr;
  float *po = nullptr, *pml = nullptr;
  int32_t* meta = nullptr;
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&q), size_t(batch) * nh * hd * 2));
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&o), size_t(batch) * nh * hd * 2));
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&k), size_t(pool) * 2));
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&v), size_t(pool) * 2));
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&po), size_t(max_splits) * batch * nh * hd * 4));
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&pml), size_t(max_splits) * batch * nh * 2 * 4));
  launch_fill_random_bf16(q, int64_t(batch) * nh * hd, 51, 1.0f, st);
  launch_fill_random_bf16(k, pool, 52, 1.0f, st);
  launch_fill_random_bf16(v, pool, 53, 1.0f, st);
  // meta: tables [batch, per_seq], q_start [batch + 1], pos0 [batch], tile_seq [batch], tile_q0 [batch]
  std::vector<int32_t> h;
  for (int32_t s = 0; s < batch; ++s)
    for (int32_t b = 0; b < per_seq; ++b) h.push_back(s * per_seq + b);
  for (int32_t s = 0; s <= batch; ++s) h.push_back(s);
  for (int32_t s = 0; s < batch; ++s) h.push_back(ctx);
  for (int32_t s = 0; s < batch; ++s) h.push_back(s);
  for (int32_t s = 0; s < batch; ++s) h.push_back(0);
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&meta), h.size() * 4));
  STRATA_CUDA_CHECK(cudaMemcpy(meta, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  const int64_t nt = int64_t(batch) * per_seq;
  PagedAttentionArgs a{};
  a.q = q;
  a.out = o;
  a.k_pool = k;
  a.v_pool = v;
  a.block_tables = meta;
  a.seq_q_start = meta + nt;
  a.seq_pos0 = meta + nt + batch + 1;
  a.tile_seq = meta + nt + 2 * batch + 1;
  a.tile_q0 = meta + nt + 3 * batch + 1;
  a.partial_out = po;
  a.partial_ml = pml;
  a.n_tokens = batch;
  a.n_tiles = batch;
  a.tokens_per_tile = 1;
  a.max_blocks_per_seq = per_seq;
  a.block_size = bs;
  a.n_heads = nh;
  a.n_kv_heads = nkv;
  a.head_dim = hd;
  a.scale = 0.0883883f;
  const LaunchTuning saved = launch_tuning();
  const double kv_bytes = double(batch) * (ctx + 1) * nkv * hd * 2 * 2;
  struct Variant { bool mma; int32_t splits; };
  for (const Variant var : {Variant{false, 1}, Variant{true, 1}, Variant{true, 2}, Variant{true, 4}}) {
    LaunchTuning tune = saved;
    tune.decode_mma_attention = var.mma;
    set_launch_tuning(tune);
    PagedAttentionArgs f = a;
    f.n_splits = var.splits;
    const std::vector<double> t = time_runs(st, 1, 5, [&] {
      for (int l = 0; l < layers; ++l) {
        launch_paged_attention(f, st);
        launch_attention_combine(f, st);
      }
    });
    const double us = 1000.0 * median(t) / layers;
    std::printf("batch decode attention alone, %s, batch %d, ctx %d, %d splits: %.1f us per layer (x32 = %.2f ms), KV %.1f MB "
                "-> %.1f GB/s = %.1f%% of copy bandwidth\n",
                var.mma ? "tensor-core decode kernel" : "64-row flash tile", batch, ctx, int(var.splits), us, 32 * us * 1e-3,
                kv_bytes * 1e-6, kv_bytes / us * 1e-3, 100.0 * kv_bytes / (us * 1e-6) / bw);
  }
  set_launch_tuning(saved);
  for (void* p : {static_cast<void*>(q), static_cast<void*>(o), static_cast<void*>(k), static_cast<void*>(v),
                  static_cast<void*>(po), static_cast<void*>(pml), static_cast<void*>(meta)})
    cudaFree(p);
}

// The decode step's GEMMs alone at m rows (cuBLASLt, the Llama-8B shapes and output types of
// the unfused step, fresh weights): time, weight bytes per second against the copy bandwidth,
// FLOP rate against the measured GEMM rate.
void batch_gemms_only(cudaStream_t st, double bw, double gemm_peak, int64_t m) {
  const int64_t H = 4096, I = 14336, L = 32, V = 128256, qkv = (32 + 16) * 128;
  struct Shape { int64_t n, k; GemmOut out; };
  std::vector<Shape> shapes;
  for (int64_t l = 0; l < L; ++l) {
    shapes.push_back({qkv, H, GemmOut::kF32});
    shapes.push_back({H, H, GemmOut::kF32});
    shapes.push_back({2 * I, H, GemmOut::kBF16});
    shapes.push_back({H, I, GemmOut::kF32});
  }
  shapes.push_back({V, H, GemmOut::kF32});
  int64_t elems = 0;
  for (const auto& s : shapes) elems += s.n * s.k;
  uint16_t *w = nullptr, *x = nullptr;
  float* y = nullptr;
  void* ws = nullptr;
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&w), size_t(elems) * 2));
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&x), size_t(m) * I * 2));
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&y), size_t(m) * V * 4));
  STRATA_CUDA_CHECK(cudaMalloc(&ws, size_t(32) << 20));
  launch_fill_random_bf16(w, elems, 61, 0.02f, st);
  launch_fill_random_bf16(x, m * I, 62, 1.0f, st);
  auto g = Gemm::create(ws, size_t(32) << 20);
  if (!g.ok()) std::exit(1);
  std::vector<double> per_kind(4, 0.0);
  const std::vector<double> t = time_runs(st, 1, 5, [&] {
    int64_t off = 0;
    for (const auto& s : shapes) {
      (*g)->run(st, x, w + off, y, s.out, m, s.n, s.k);
      off += s.n * s.k;
    }
  });
  // One layer's four GEMMs timed apart (32 repeats of one shape each).
  const char* names[4] = {"qkv", "o_proj", "gate_up", "down"};
  for (int kind = 0; kind < 4; ++kind) {
    const Shape s = shapes[size_t(kind)];
    const std::vector<double> tk = time_runs(st, 1, 3, [&] {
      int64_t off = 0;
      for (int64_t l = 0; l < L; ++l) {
        (*g)->run(st, x, w + off, y, s.out, m, s.n, s.k);
        off += s.n * s.k;  // a fresh weight matrix each time (not from L2)
      }
    });
    const double us = 1000.0 * median(tk) / double(L);
    std::printf("  GEMM m=%lld %s (n %lld, k %lld): %.1f us -> %.1f%% of copy bandwidth, %.1f TFLOP/s\n", static_cast<long long>(m),
                names[kind], static_cast<long long>(s.n), static_cast<long long>(s.k), us,
                100.0 * double(s.n * s.k * 2) / (us * 1e-6) / bw, 2.0 * double(m * s.n * s.k) / us * 1e-6);
  }
  const double ms = median(t);
  const double flops = 2.0 * double(m) * double(elems);
  std::printf("batch decode GEMMs alone (cuBLASLt, m=%lld, %zu launches, %.3f GB of weights): %.3f ms -> %.1f%% of copy bandwidth, "
              "%.1f TFLOP/s = %.1f%% of the GEMM rate\n",
              static_cast<long long>(m), shapes.size(), double(elems) * 2e-9, ms, 100.0 * double(elems) * 2 / (ms * 1e-3) / bw,
              flops / ms * 1e-9, 100.0 * flops / (ms * 1e-3) / gemm_peak);
  g->reset();
  cudaFree(w);
  cudaFree(x);
  cudaFree(y);
  cudaFree(ws);
}

// Whole decode steps at a big batch (the serving shape: `batch` sequences, one token each, after
// `ctx` cached tokens; the KV contents are whatever the pool holds, which does not change the
// work), graph replay, with the tensor-core decode attention and with the flash tile it
// replaces: median step and its ratio to the bandwidth ceiling (weights + every sequence's KV
// per step).
int batch_decode_steps(const ModelConfig& cfg, double bw, int32_t batch, const std::vector<int32_t>& ctxs, int steps) {
  const int32_t max_ctx = *std::max_element(ctxs.begin(), ctxs.end());
  const int64_t L = cfg.n_layers, nkv = cfg.n_kv_heads, hd = cfg.head_dim, H = cfg.hidden, V = cfg.vocab_size;
  CudaModelOptions opt;
  opt.block_size = 16;
  opt.max_tokens = std::max<int64_t>(batch, 256);
  opt.max_seqs = batch;
  opt.max_logit_rows = batch;
  opt.max_blocks_per_seq = max_ctx / 16 + 2;
  opt.kv_cache_bytes = (int64_t(batch) * opt.max_blocks_per_seq + 256) * 16 * L * 2 * nkv * hd * 2;
  auto mr = CudaDecoder::random(cfg, opt, 4321, 0.02f);
  if (!mr.ok()) {
    std::fprintf(stderr, "%s\n", mr.error().to_string().c_str());
    return 1;
  }
  CudaDecoder& m = **mr;
  std::vector<int32_t> am(static_cast<size_t>(batch), 0);
  const LaunchTuning saved = launch_tuning();
  for (const int32_t ctx : ctxs) {
    for (const bool mma : {false, true}) {
      LaunchTuning tune = saved;
      tune.decode_mma_attention = mma;
      set_launch_tuning(tune);
      m.clear_cuda_graphs();
      m.set_cuda_graphs(true);
      StepBatch b;
      for (int32_t s = 0; s < batch; ++s) {
        SeqSpan sp;
        for (int64_t i = 0; i < opt.max_blocks_per_seq; ++i) sp.block_table.push_back(int32_t(s * opt.max_blocks_per_seq + i));
        sp.pos0 = ctx;
        sp.n_tokens = 1;
        sp.logits_last = true;
        b.seqs.push_back(sp);
        b.tokens.push_back((s * 7919 + 13) % int32_t(V));
      }
      const std::vector<double> t = time_runs(m.stream(), 3, steps, [&] { check_ok(m.forward(b, am.data())); });
      const double ms = median(t);
      const double kv = double(L) * 2 * nkv * hd * 2 * double(ctx + 1) * batch;
      const double bytes = double(m.weight_bytes()) + double(H) * 2 * batch + kv;
      std::printf("decode b=%d after %d, CUDA graph, %s attention: median step %.3f ms (%zu steps) -> %.0f tok/s; "
                  "bytes %.2f GB (KV %.2f GB) -> ceiling %.3f ms, ratio %.3f\n",
                  batch, ctx, mma ? "tensor-core decode" : "64-row flash", ms, t.size(), 1000.0 * batch / ms, bytes * 1e-9,
                  kv * 1e-9, bytes / bw * 1e3, (bytes / bw * 1e3) / ms);
    }
  }
  set_launch_tuning(saved);
  return 0;
}

// One mode's times for the deterministic comparison.
struct ModeTimes {
  double decode1_ms = 0, decode256_ms = 0, prefill_ms = 0;  // median step times
};

// Median device time of `steps` forward() calls of b after `warm` unmeasured ones; decode
// steps advance every sequence by one position and feed back its greedy token.
double time_steps(CudaDecoder& m, StepBatch& b, int warm, int steps, bool advance, std::vector<int32_t>& am, int* rc) {
  cudaEvent_t e0, e1;
  STRATA_CUDA_CHECK(cudaEventCreate(&e0));
  STRATA_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<double> t;
  for (int i = 0; i < warm + steps; ++i) {
    STRATA_CUDA_CHECK(cudaEventRecord(e0, m.stream()));
    if (auto st = m.forward(b, am.data()); !st.ok()) {
      std::fprintf(stderr, "%s\n", st.error().to_string().c_str());
      *rc = 1;
      break;
    }
    STRATA_CUDA_CHECK(cudaEventRecord(e1, m.stream()));
    STRATA_CUDA_CHECK(cudaEventSynchronize(e1));
    if (i >= warm) t.push_back(elapsed_ms(e0, e1));
    if (advance) {
      for (size_t s = 0; s < b.seqs.size(); ++s) {
        b.seqs[s].pos0 += 1;
        b.tokens[s] = am[s];
      }
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return t.empty() ? 0.0 : median(t);
}

// Two settings of the same decoder shape (CUDA graphs on in both), timing decode at batch 1
// after a 512-token prompt, decode at batch 256 after 1024 tokens each and one 4096-token
// prefill: the default against CudaModelOptions::deterministic (fp8 false), or bf16 weights
// against FP8 ones (CudaModelOptions::random_fp8; fp8 true, with each batch-1 step's ratio to
// its bandwidth limit, weight bytes + KV read over the measured copy bandwidth bw).
int mode_cost(const ModelConfig& cfg, int decode_steps, int prefill_reps, bool fp8, double bw) {
  const int32_t big = 256, ctx_big = 1024, ctx_one = 512, prefill = 4096;
  const int64_t L = cfg.n_layers, nkv = cfg.n_kv_heads, hd = cfg.head_dim, V = cfg.vocab_size;
  const int32_t blocks_per_seq = std::max(prefill, ctx_big + decode_steps + 16) / 16 + 2;
  ModeTimes times[2];
  double limit1_ms[2] = {0, 0};
  for (const bool det : {false, true}) {
    CudaModelOptions opt;
    opt.deterministic = det && !fp8;
    opt.random_fp8 = det && fp8;
    opt.block_size = 16;
    opt.max_tokens = prefill;
    opt.max_seqs = big;
    opt.max_logit_rows = big;
    opt.max_blocks_per_seq = blocks_per_seq;
    // The 256 decode sequences' blocks; the batch-1 and prefill sequences reuse the first ones.
    opt.kv_cache_bytes = (int64_t(big) * ((ctx_big + decode_steps + 16) / 16 + 2) + blocks_per_seq) * 16 * L * 2 * nkv * hd * 2;
    auto mr = CudaDecoder::random(cfg, opt, 1234, 0.02f);
    if (!mr.ok()) {
      std::fprintf(stderr, "%s\n", mr.error().to_string().c_str());
      return 1;
    }
    CudaDecoder& m = **mr;
    ModeTimes& mt = times[det ? 1 : 0];
    // Batch 1 reads every weight once and ~ctx_one positions of KV a step.
    const double kv1 = double(ctx_one) * double(L) * 2 * double(nkv) * double(hd) * 2;
    limit1_ms[det ? 1 : 0] = (double(m.weight_bytes()) + kv1) / bw * 1e3;
    std::printf("%s: weights %.2f GB, batch-1 limit %.3f ms\n", fp8 ? (det ? "fp8" : "bf16") : (det ? "deterministic" : "default"),
                double(m.weight_bytes()) * 1e-9, limit1_ms[det ? 1 : 0]);
    std::vector<int32_t> am(big, 0);
    int rc = 0;
    // Decode batch 1: the prompt, then timed greedy steps.
    {
      StepBatch b;
      SeqSpan sp;
      for (int32_t i = 0; i < blocks_per_seq; ++i) sp.block_table.push_back(i);
      sp.n_tokens = ctx_one;
      for (int32_t i = 0; i < ctx_one; ++i) b.tokens.push_back((i * 7919) % int32_t(V));
      b.seqs = {sp};
      time_steps(m, b, 0, 1, false, am, &rc);
      b.seqs[0].pos0 = ctx_one;
      b.seqs[0].n_tokens = 1;
      b.tokens = {am[0]};
      mt.decode1_ms = time_steps(m, b, 5, decode_steps, true, am, &rc);
      // FP8: the GEMV's loads in flight (LaunchTuning::gemv_fp8_unroll), the default last.
      if (fp8 && det) {
        const LaunchTuning saved = launch_tuning();
        for (const int32_t u : {4, 16, saved.gemv_fp8_unroll}) {
          LaunchTuning t = saved;
          t.gemv_fp8_unroll = u;
          set_launch_tuning(t);
          m.clear_cuda_graphs();
          std::printf("fp8: decode b=1 with gemv_fp8_unroll %d: %.3f ms/token\n", u, time_steps(m, b, 5, decode_steps, true, am, &rc));
        }
        set_launch_tuning(saved);
        m.clear_cuda_graphs();
      }
    }
    // Decode batch 256 after ctx_big cached positions each (the pool's contents: the work does
    // not depend on them).
    {
      StepBatch b;
      const int32_t per = (ctx_big + decode_steps + 16) / 16 + 2;
      for (int32_t s = 0; s < big; ++s) {
        SeqSpan sp;
        for (int32_t i = 0; i < per; ++i) sp.block_table.push_back(blocks_per_seq + s * per + i);
        sp.pos0 = ctx_big;
        sp.n_tokens = 1;
        b.seqs.push_back(sp);
        b.tokens.push_back((s * 7919 + 13) % int32_t(V));
      }
      mt.decode256_ms = time_steps(m, b, 3, std::max(8, decode_steps / 8), true, am, &rc);
    }
    // Prefill of one fresh 4096-token prompt.
    {
      StepBatch b;
      SeqSpan sp;
      for (int32_t i = 0; i < prefill / 16; ++i) sp.block_table.push_back(i);
      sp.n_tokens = prefill;
      for (int32_t i = 0; i < prefill; ++i) b.tokens.push_back((i * 104729) % int32_t(V));
      b.seqs = {sp};
      mt.prefill_ms = time_steps(m, b, 1, prefill_reps, false, am, &rc);
    }
    if (rc != 0) return rc;
    std::printf("%s: decode b=1 after %d: %.3f ms/token (%.3f of its limit); decode b=%d after %d: %.3f ms/step = %.4f ms/token; "
                "prefill %d: %.1f ms\n",
                fp8 ? (det ? "fp8" : "bf16") : (det ? "deterministic" : "default"), ctx_one, mt.decode1_ms,
                limit1_ms[det ? 1 : 0] / mt.decode1_ms, big, ctx_big, mt.decode256_ms, mt.decode256_ms / big, prefill,
                mt.prefill_ms);
  }
  if (fp8) {
    std::printf("fp8 speedup (time ratio bf16 / fp8): decode b=1 %.3f, decode b=%d %.3f, prefill %d %.3f\n",
                times[0].decode1_ms / times[1].decode1_ms, big, times[0].decode256_ms / times[1].decode256_ms, prefill,
                times[0].prefill_ms / times[1].prefill_ms);
    return 0;
  }
  std::printf("deterministic cost (time ratio deterministic / default): decode b=1 %.3f, decode b=%d %.3f, prefill %d %.3f\n",
              times[1].decode1_ms / times[0].decode1_ms, big, times[1].decode256_ms / times[0].decode256_ms, prefill,
              times[1].prefill_ms / times[0].prefill_ms);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int decode_steps = argc > 1 ? std::atoi(argv[1]) : 128;
  const int prefill_reps = argc > 2 ? std::atoi(argv[2]) : 3;
  // "batch": only the copy bandwidth, the GEMM rate and the big-batch decode sections.
  const bool batch_only = argc > 3 && std::string(argv[3]) == "batch";
  // "decode1": only the copy bandwidth, the GEMVs and the attention alone, and batch-1 decode.
  const bool decode1_only = argc > 3 && std::string(argv[3]) == "decode1";
  cudaDeviceProp prop{};
  STRATA_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, %.1f GiB\n", prop.name, prop.multiProcessorCount, double(prop.totalGlobalMem) / (1 << 30));
  cudaStream_t st;
  STRATA_CUDA_CHECK(cudaStreamCreate(&st));
  if (argc > 3 && std::string(argv[3]) == "deterministic") return mode_cost(llama8b(), decode_steps, prefill_reps, false, 1.0);
  const double bw = copy_bandwidth(st);
  // "fp8": bf16 against FP8 weights (decode batch 1 and 256, prefill 4096).
  if (argc > 3 && std::string(argv[3]) == "fp8") {
    std::printf("copy bandwidth %.1f GB/s\n", bw * 1e-9);
    return mode_cost(llama8b(), decode_steps, prefill_reps, true, bw);
  }
  const double gemm = gemm_rate(st);
  const ModelConfig cfg = llama8b();
  // The serving shape: 256 sequences decoding together at 1-2k tokens (how a step splits
  // between the GEMMs and the attention, then whole steps).
  if (!decode1_only) {
    batch_gemms_only(st, bw, gemm, 256);
    for (const int32_t ctx : {1024, 1536, 2048}) batch_decode_attention_only(st, bw, 256, ctx);
    if (int rc = batch_decode_steps(cfg, bw, 256, {1024, 2048}, 12); rc != 0) return rc;
  }
  if (batch_only) {
    std::printf("SUMMARY bw_GBps=%.1f gemm_TFLOPs=%.1f\n", bw * 1e-9, gemm * 1e-12);
    return 0;
  }
  if (!decode1_only) gemm_only_decode(st, bw, 0);
  gemm_only_decode(st, bw, 1);
  if (!decode1_only) prefill_attention_only(st);
  decode_attention_only(st, 512);
  decode_attention_only(st, 2048);

  CudaModelOptions opt;
  opt.kv_cache_bytes = int64_t(4) << 30;
  opt.block_size = 16;
  opt.max_tokens = 4096;
  opt.max_seqs = 8;
  opt.max_blocks_per_seq = 4096 / 16 + 64;
  opt.max_logit_rows = 8;
  auto mr = CudaDecoder::random(cfg, opt, 1234, 0.02f);
  if (!mr.ok()) {
    std::fprintf(stderr, "%s\n", mr.error().to_string().c_str());
    return 1;
  }
  CudaDecoder& m = **mr;
  std::printf("model: Llama-3.1-8B shape, %.2f GB of bf16 weights (+ scratch), KV blocks %d\n", double(m.weight_bytes()) * 1e-9,
              m.n_kv_blocks());

  const int64_t H = cfg.hidden, V = cfg.vocab_size, L = cfg.n_layers, I = cfg.intermediate;
  const int64_t nh = cfg.n_heads, nkv = cfg.n_kv_heads, hd = cfg.head_dim;
  const int64_t layer_params = (nh + 2 * nkv) * hd * H + H * nh * hd + 3 * I * H;
  const int64_t matmul_params = L * layer_params + V * H;  // + lm_head

  cudaEvent_t e0, e1;
  STRATA_CUDA_CHECK(cudaEventCreate(&e0));
  STRATA_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<int32_t> am(8);

  // Decode: fresh prompts (512 tokens, or 2048 to show the cost of a longer context), then
  // greedy steps of `batch` sequences together, each step synchronizing on its tokens:
  // launched kernel by kernel or replayed from the step's CUDA graph, with the unfused layer
  // (fuse 0: separate norm, QKV post, combine and activation kernels) or the fused one. Every
  // phase starts from its own prompts, so settings are compared at the same context; some
  // repeat earlier phases to show the spread.
  {
    struct Phase {
      bool graphs;
      int32_t fuse_rows;
      int32_t prompt;
      int32_t batch;
      int32_t unroll;
      bool preload = true;
      // Weights pulled into L2 under the attention (LaunchTuning::attn_overlap_prefetch and
      // attn_overlap_next_rows): -1 the defaults, 0 none (the setting before), r > 0 o_proj's
      // rows and r gate/up rows.
      int32_t overlap = -1;
      int32_t skip = 0;  // LaunchTuning::decode_profile_skip: parts left out, to time the rest
      int32_t norm_block = -1;    // LaunchTuning::gemv_norm_block (-1: the default)
      int32_t gated_unroll = -1;  // LaunchTuning::gemv_gated_unroll (-1: the default)
      int32_t qkv_warps = -1;     // LaunchTuning::decode_qkv_warps_per_row (-1: the default)
    };
    const LaunchTuning saved = launch_tuning();
    // Unfused with 4 loads in flight is the step before the fused layer; fused with 16 loads and
    // no preload the default before the GEMV's preload; fused with 8 loads and the preload, the
    // norm summed per warp and 8 loads per gated row the default before the per-block norm; the
    // default now (last).
    const std::vector<Phase> all_phases = {
        {true, 0, 512, 1, 4},         {true, 2, 512, 1, 16},  {true, 2, 512, 1, 16, false}, {false, 2, 512, 1, 8},
        {true, 0, 2048, 1, 4},        {true, 2, 2048, 1, 16}, {true, 2, 2048, 1, 16, false}, {true, 2, 2048, 1, 8},
        {true, 0, 512, 2, 4},         {true, 2, 512, 2, 8},   {true, 0, 512, 4, 8},          {true, 2, 512, 1, 8, false},
        {true, 2, 512, 1, 8, true, 0, 0, 0, 8, 1}, {true, 2, 512, 1, 8}};
    // decode1: the fused step at batch 1: the settings before (nothing pulled into L2 under the
    // attention, every warp summing the norm's parts after its dot, 8 loads per gated row, one
    // warp per QKV row) against each change and the defaults; the step with parts left out
    // (where the time goes); 2048 tokens and batch 2, before and now; before and now three
    // times more, alternating (steps drift by ~0.02 ms over a run).
    const Phase before{true, 2, 512, 1, 8, true, 0, 0, 0, 8, 1};
    auto with = [](Phase p, int32_t prompt, int32_t batch, int32_t skip) {
      p.prompt = prompt;
      p.batch = batch;
      p.skip = skip;
      return p;
    };
    const Phase now{true, 2, 512, 1, 8};
    const std::vector<Phase> decode1_phases = {
        before,
        now,
        {true, 2, 512, 1, 8, true, -1, 0, -1, -1, 2},  // now with two warps per QKV row
        {true, 2, 512, 1, 8, true, 512},                // now with the L2 prefetch under the attention
        with(before, 512, 1, 1),
        with(now, 512, 1, 1),
        with(now, 512, 1, 3),
        with(before, 512, 1, 3),
        with(before, 2048, 1, 0),
        with(now, 2048, 1, 0),
        with(before, 512, 2, 0),
        with(now, 512, 2, 0),
        before,
        now,
        before,
        now,
        before,
        now};
    const std::vector<Phase>& phases = decode1_only ? decode1_phases : all_phases;
    const int32_t blocks_per_seq = (2048 + decode_steps + 5 + 16) / 16 + 1;
    for (const Phase& phase : phases) {
      StepBatch b;
      for (int32_t s = 0; s < phase.batch; ++s) {
        SeqSpan sp;
        for (int32_t i = 0; i < blocks_per_seq; ++i) sp.block_table.push_back(s * blocks_per_seq + i);
        sp.n_tokens = phase.prompt;
        for (int32_t i = 0; i < phase.prompt; ++i) b.tokens.push_back((i * 7919 + s * 31) % int32_t(V));
        b.seqs.push_back(sp);
      }
      LaunchTuning tune = saved;
      tune.fuse_decode_rows = phase.fuse_rows;
      tune.gemv_unroll = phase.unroll;
      tune.gemv_preload = phase.preload;
      if (phase.overlap >= 0) {
        // 1 << 30: o_proj's own rows only.
        tune.attn_overlap_prefetch = phase.overlap > 0;
        tune.attn_overlap_next_rows = phase.overlap > 0 && phase.overlap < (1 << 30) ? phase.overlap : 0;
      }
      tune.decode_profile_skip = phase.skip;
      if (phase.norm_block >= 0) tune.gemv_norm_block = phase.norm_block != 0;
      if (phase.gated_unroll >= 0) tune.gemv_gated_unroll = phase.gated_unroll;
      if (phase.qkv_warps >= 0) tune.decode_qkv_warps_per_row = phase.qkv_warps;
      set_launch_tuning(tune);
      m.clear_cuda_graphs();
      m.set_cuda_graphs(phase.graphs);
      if (auto st = m.forward(b, am.data()); !st.ok()) {
        std::fprintf(stderr, "%s\n", st.error().to_string().c_str());
        return 1;
      }
      b.tokens.clear();
      for (int32_t s = 0; s < phase.batch; ++s) {
        b.seqs[size_t(s)].pos0 = phase.prompt;
        b.seqs[size_t(s)].n_tokens = 1;
        b.tokens.push_back(am[size_t(s)]);
      }
      const int64_t ctx0 = phase.prompt;
      std::vector<double> step_ms;
      for (int i = 0; i < decode_steps + 5; ++i) {
        STRATA_CUDA_CHECK(cudaEventRecord(e0, m.stream()));
        if (auto st = m.forward(b, am.data()); !st.ok()) {
          std::fprintf(stderr, "%s\n", st.error().to_string().c_str());
          return 1;
        }
        STRATA_CUDA_CHECK(cudaEventRecord(e1, m.stream()));
        STRATA_CUDA_CHECK(cudaEventSynchronize(e1));
        if (i >= 5) step_ms.push_back(elapsed_ms(e0, e1));  // device time of the step, launch gaps included
        for (int32_t s = 0; s < phase.batch; ++s) {
          b.seqs[size_t(s)].pos0 += 1;
          b.tokens[size_t(s)] = am[size_t(s)];
        }
      }
      const int64_t ctx = ctx0 + 5 + decode_steps / 2;
      const double kv_bytes = double(L) * 2 * nkv * hd * 2 * double(ctx) * phase.batch;
      const double bytes_per_step = double(matmul_params) * 2 + double(H) * 2 * phase.batch + kv_bytes;
      const double ms = median(step_ms);
      double mean = 0;
      for (double x : step_ms) mean += x;
      mean /= double(step_ms.size());
      const double ceiling = bw / bytes_per_step;  // steps per second
      std::printf("decode b=%d after %lld, %s, pdl %d, fuse rows %d, GEMV unroll %d, preload %d, L2 under attention: o_proj %d "
                  "+ gate/up rows %d, norm per block %d, gated unroll %d, QKV warps per row %d, left out %d: median step %.3f ms, mean %.3f ms (%zu steps) -> %.1f tok/s (median)\n",
                  phase.batch, static_cast<long long>(ctx0), phase.graphs ? "CUDA graph" : "no graph", int(tune.pdl),
                  int(phase.fuse_rows), int(phase.unroll), int(phase.preload), int(tune.attn_overlap_prefetch),
                  int(tune.attn_overlap_next_rows), int(tune.gemv_norm_block), int(tune.gemv_gated_unroll), int(tune.decode_qkv_warps_per_row), int(phase.skip), ms, mean, step_ms.size(), 1000.0 * phase.batch / ms);
      std::printf("  bytes read per step %.3f GB -> bandwidth ceiling %.1f steps/s; ratio %.3f\n", bytes_per_step * 1e-9,
                  ceiling, (1000.0 / ms) / ceiling);
    }
    set_launch_tuning(saved);
  }

  // Prefill: one fresh 4096-token prompt (logits of the last token only).
  if (!decode1_only) {
    const int32_t n = 4096;
    StepBatch b;
    SeqSpan sp;
    for (int32_t i = 0; i < n / 16; ++i) sp.block_table.push_back(i);
    sp.n_tokens = n;
    for (int32_t i = 0; i < n; ++i) b.tokens.push_back((i * 104729) % int32_t(V));
    b.seqs = {sp};
    for (const int min_blocks : {3, 2}) {
      set_flash_attention_min_blocks(min_blocks);
      const std::vector<double> t = time_runs(m.stream(), 1, prefill_reps, [&] { check_ok(m.forward(b, am.data())); });
      const double ms = median(t);
      const double linear_flops = 2.0 * double(L * layer_params) * n + 2.0 * double(V * H);
      const double attn_flops = double(L) * 4.0 * double(nh) * double(hd) * (double(n) * (n + 1) / 2.0);
      const double flops = linear_flops + attn_flops;
      std::printf("prefill 4096 (attention variant %d blocks/SM): %.1f ms (median of %zu) -> %.0f tok/s; model FLOPs "
                  "%.2f T (attention %.2f T) -> %.1f TFLOP/s\n",
                  min_blocks, ms, t.size(), n / (ms * 1e-3), flops * 1e-12, attn_flops * 1e-12, flops / ms * 1e-9);
      std::printf("  ratio to measured GEMM rate %.3f\n", (flops / (ms * 1e-3)) / gemm);
    }
  }
  std::printf("SUMMARY bw_GBps=%.1f gemm_TFLOPs=%.1f\n", bw * 1e-9, gemm * 1e-12);
  return 0;
}
