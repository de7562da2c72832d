// Full-model decode with the KV codecs in the CUDA decoder (CudaModelOptions::kv_codecs),
// Llama-3.1-8B shape with random weights: batch 64, every sequence with 8,192 cached tokens,
// one decode step (CUDA graph replay) per run. Per codec (bf16 decoder, fp8, int8, int4,
// turbo): median step time, tokens per second and its ratio to the bf16 decoder's (default
// launch settings; then the codec attention's split target and tensor-core occupancy variants,
// each printed, the best in the table), and the KV
// pool's capacity: every codec gets the same pool bytes (what the bf16 decoder needs for the
// batch), and the blocks it holds are counted as 8,192-token sequences, with the ratio to bf16.
//
// The contexts are not prefilled (64 x 8k tokens through the model would take minutes): each
// layer's K and V rows are made by encoding random bf16 rows (launch_kv_codec_write, so every
// row is a valid row of its codec) into the first 4,096 token slots of the pool and copying
// those bytes over the rest of the sequences' blocks. The step reads every cached row as a
// real context would; only the values are not a model's.
// Usage: bench_kv_codec_decode [steps=10] [batch=64] [context=8192]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kv_codec_step.h"
#include "backend/cuda/cuda_model.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_codec.h"
#include "backend/reference/kv_codec.h"
#include "bench_models.h"
#include "bench_timing.h"

using namespace strata;
using namespace strata::cuda;
using namespace strata::cuda::bench;

namespace {

constexpr int32_t kBlock = 16;
constexpr int64_t kFillTokens = 4096;  // token slots encoded per part, then copied

// Every part of the pool's first `blocks` blocks holds valid rows of its format.
void fill_pool(const KvBlockPool& pool, const std::vector<KvRowLayout>& formats, int64_t blocks, cudaStream_t st) {
  const KvPoolLayout& l = pool.layout();
  uint16_t* x = nullptr;
  int64_t* slots = nullptr;
  STRATA_CUDA_CHECK(cudaMalloc(&x, size_t(kFillTokens) * l.n_kv_heads * l.head_dim * 2));
  STRATA_CUDA_CHECK(cudaMalloc(&slots, size_t(kFillTokens) * 8));
  std::vector<int64_t> ids(static_cast<size_t>(kFillTokens));
  for (int64_t t = 0; t < kFillTokens; ++t) ids[size_t(t)] = t;
  STRATA_CUDA_CHECK(cudaMemcpy(slots, ids.data(), ids.size() * 8, cudaMemcpyHostToDevice));
  const int64_t tokens = blocks * kBlock;
  for (int p = 0; p < 2 * l.n_layers; ++p) {
    const KvRowLayout& f = formats[size_t(p)];
    launch_fill_random_bf16(x, kFillTokens * l.n_kv_heads * l.head_dim, uint64_t(p) + 11, 2.0f, st);
    launch_kv_codec_write({x, slots, pool.part(p), f, int32_t(kFillTokens), l.n_kv_heads, p / 2}, st);
    const size_t chunk = size_t(kFillTokens) * l.n_kv_heads * size_t(f.bytes);
    for (int64_t t0 = kFillTokens; t0 < tokens; t0 += kFillTokens) {
      const size_t n = size_t(std::min(kFillTokens, tokens - t0)) * l.n_kv_heads * size_t(f.bytes);
      STRATA_CUDA_CHECK(cudaMemcpyAsync(pool.part(p) + size_t(t0) * l.n_kv_heads * f.bytes, pool.part(p), std::min(n, chunk),
                                        cudaMemcpyDeviceToDevice, st));
    }
  }
  STRATA_CUDA_CHECK(cudaStreamSynchronize(st));
  cudaFree(x);
  cudaFree(slots);
}

struct Row {
  std::string name;
  double ms = 0;  // default launch settings
  double best_ms = 0;
  int64_t best_target = 0;
  int32_t best_mma = 0;
  int64_t blocks = 0;
  int64_t block_bytes = 0;
};

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 10;
  const int32_t batch = argc > 2 ? std::atoi(argv[2]) : 64;
  const int32_t ctx = argc > 3 ? std::atoi(argv[3]) : 8192;
  const ModelConfig cfg = llama8b();
  const int64_t L = cfg.n_layers, nkv = cfg.n_kv_heads, hd = cfg.head_dim;
  CudaModelOptions opt;
  opt.block_size = kBlock;
  opt.max_tokens = std::max<int32_t>(batch, 256);
  opt.max_seqs = batch;
  opt.max_logit_rows = batch;
  opt.max_blocks_per_seq = ctx / kBlock + 2;
  const int64_t used_blocks = int64_t(batch) * opt.max_blocks_per_seq;
  // The bf16 decoder's pool for the batch; every codec gets the same bytes.
  const int64_t bf16_block = L * 2 * kBlock * nkv * hd * 2;
  opt.kv_cache_bytes = used_blocks * bf16_block;
  std::printf("Llama-3.1-8B shape, random weights; decode at batch %d with %d cached tokens per sequence, CUDA graph, "
              "median of %d steps; KV pool %.2f GiB for every codec. Contexts filled by encoding random K/V rows straight "
              "into the blocks (no prefill).\n",
              batch, ctx, steps, double(opt.kv_cache_bytes) / double(int64_t(1) << 30));
  std::vector<Row> rows;
  const KvCodec codecs[] = {KvCodec::kBf16, KvCodec::kFp8, KvCodec::kInt8, KvCodec::kInt4, KvCodec::kTurbo};
  for (int pass = 0; pass < 6; ++pass) {
    // Pass 0: the bf16 decoder (no codec, its own kernels); then each codec's rows.
    const bool plain = pass == 0;
    const KvCodec codec = plain ? KvCodec::kBf16 : codecs[pass - 1];
    CudaModelOptions o = opt;
    std::vector<KvRowLayout> formats;
    const KvCodecSpec spec{codec, 0};
    const KvRowLayout kf = kv_row_layout(kv_key_format(spec, int32_t(hd))), vf = kv_row_layout(kv_value_format(spec, int32_t(hd)));
    for (int64_t l = 0; l < L; ++l) {
      formats.push_back(kf);
      formats.push_back(vf);
    }
    if (!plain) o.kv_codecs.assign(size_t(L), spec);
    auto mr = CudaDecoder::random(cfg, o, 4321, 0.02f);
    if (!mr.ok()) {
      std::fprintf(stderr, "%s\n", mr.error().to_string().c_str());
      return 1;
    }
    CudaDecoder& m = **mr;
    fill_pool(m.kv_pool(), formats, used_blocks, m.stream());
    StepBatch b;
    for (int32_t s = 0; s < batch; ++s) {
      SeqSpan sp;
      for (int64_t i = 0; i < opt.max_blocks_per_seq; ++i) sp.block_table.push_back(int32_t(s * opt.max_blocks_per_seq + i));
      sp.pos0 = ctx;
      sp.n_tokens = 1;
      sp.logits_last = true;
      b.seqs.push_back(sp);
      b.tokens.push_back((s * 7919 + 13) % cfg.vocab_size);
    }
    std::vector<int32_t> am(static_cast<size_t>(batch), 0);
    Row r;
    r.name = plain ? std::string("bf16 decoder") : std::string(kv_codec_name(codec));
    r.blocks = m.n_kv_blocks();
    r.block_bytes = m.kv_block_bytes();
    // Codecs: the default launch settings first (the table's row), then the split target and
    // the tensor-core kernel's occupancy variants, each printed.
    const int64_t default_target = KvCodecStep::target_blocks();
    const int32_t default_mma = kv_codec_mma_blocks();
    struct Setting {
      int64_t target;
      int32_t mma_blocks;
    };
    std::vector<Setting> settings = {{default_target, default_mma}};
    if (!plain) {
      for (int64_t target : {512, 1024, 2048, 4096}) {
        for (int32_t mb : {3, 4}) {
          if (target != default_target || mb != default_mma) settings.push_back({target, mb});
        }
      }
    }
    r.best_ms = 1e30;
    for (size_t i = 0; i < settings.size(); ++i) {
      KvCodecStep::set_target_blocks(settings[i].target);
      set_kv_codec_mma_blocks(settings[i].mma_blocks);
      m.clear_cuda_graphs();
      const double ms = median(time_runs(m.stream(), 3, steps, [&] { check_ok(m.forward(b, am.data())); }));
      if (i == 0) r.ms = ms;
      if (ms < r.best_ms) r.best_ms = ms, r.best_target = settings[i].target, r.best_mma = settings[i].mma_blocks;
      std::printf("  %-12s%s split target %lld blocks, tensor-core blocks/SM %d: median step %.3f ms -> %.0f tok/s\n",
                  r.name.c_str(), i == 0 ? " (default)" : "", static_cast<long long>(settings[i].target), settings[i].mma_blocks,
                  ms, 1000.0 * batch / ms);
      std::fflush(stdout);
    }
    KvCodecStep::set_target_blocks(default_target);
    set_kv_codec_mma_blocks(default_mma);
    rows.push_back(r);
    std::printf("  %-12s %lld blocks of %lld bytes\n", r.name.c_str(), static_cast<long long>(r.blocks),
                static_cast<long long>(r.block_bytes));
  }
  const Row& base = rows[0];
  std::printf("\n| KV | step ms | tok/s | vs bf16 decoder | best of the settings: ms (split target, blocks/SM) | "
              "bytes/token (32 layers) | %d-token sequences in the pool | vs bf16 |\n", ctx);
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    const double seqs = double(r.blocks) * kBlock / double(ctx);
    const double base_seqs = double(base.blocks) * kBlock / double(ctx);
    std::printf("| %s | %.3f | %.0f | %.3f | %.3f (%lld, %d) | %lld | %.1f | %.3f |\n", r.name.c_str(), r.ms, 1000.0 * batch / r.ms,
                base.ms / r.ms, r.best_ms, static_cast<long long>(r.best_target), r.best_mma,
                static_cast<long long>(r.block_bytes / kBlock), seqs, seqs / base_seqs);
  }
  return 0;
}
