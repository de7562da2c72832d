// Full-model decode with the KV codecs in the CUDA decoder, Llama-3.1-8B shape with random
// weights: batch 64, every sequence with 8,192 cached tokens, one decode step (CUDA graph
// replay) per run. Two modes per codec (fp8, int8, int4, turbo), both against the bf16 decoder:
//  - at write (--kv-quant-start 0, CudaModelOptions::kv_codecs): every row is encoded as it is
//    written. Median step time, tokens per second and its ratio to the bf16 decoder's (default
//    launch settings; then the codec attention's split target and tensor-core occupancy
//    variants, each printed, the best in the table), and the KV pool's capacity: every codec
//    gets the same pool bytes (what the bf16 decoder needs for the batch), and the blocks it
//    holds are counted as 8,192-token sequences, with the ratio to bf16.
//  - default (--kv-quant-start auto, one block: CudaModelOptions::kv_quant_start 16 with
//    kv_quant_codecs): the same pool bytes split by plan_kv_pools (max_seqs 64, the
//    bench's max_tokens) into an exact bf16 pool and a codec pool. Each sequence holds 511
//    converted blocks in the codec pool and its 512th block, where the step's token is written
//    at position 8,191, in the exact pool (the step attends 8,192 keys, one fewer than at
//    write). Median step time at the default launch settings, tokens per second, the ratio to
//    the bf16 decoder and to the same codec at write; and the capacity: 8,192-token sequences
//    the two pools hold together, each taking 512 codec blocks once converted plus one exact
//    block it writes in (the smaller of the two counts), with the ratio to bf16. Each line also
//    gives the conversion layer by layer (KvCodecStep::set_fused_convert(false), 64 launches)
//    beside the default one launch for every layer.
//
// The contexts are not prefilled (64 x 8k tokens through the model would take minutes): each
// layer's K and V rows are made by encoding random bf16 rows (launch_kv_codec_write, so every
// row is a valid row of its codec) into the first 4,096 token slots of the pool and copying
// those bytes over the rest of the sequences' blocks. In the default mode the exact pool is
// filled that way with bf16 rows, and the codec pool by converting those exact blocks
// (CudaDecoder::convert_kv_blocks, the engine's conversion path) into every codec block the
// sequences read. The step reads every cached row as a real context would; only the values
// are not a model's.
// Usage: bench_kv_codec_decode [steps=10] [batch=64] [context=8192]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_codec.h"
#include "backend/reference/kv_codec.h"
#include "bench_models.h"
#include "bench_timing.h"
#include "kv/kv_plan.h"
#include "runtime/cuda/cuda_kv_codec_step.h"
#include "runtime/cuda/cuda_model.h"

using namespace strata;
using namespace strata::cuda;
using namespace strata::cuda::bench;

namespace {

constexpr int32_t kBlock = 16;
constexpr int64_t kFillTokens = 4096;  // token slots encoded per part, then copied
constexpr int32_t kQuantStart = 16;    // what --kv-quant-start auto gives with blocks of 16

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
  const int64_t fill = std::min(kFillTokens, tokens);  // a small pool (the exact one) takes fewer
  for (int p = 0; p < 2 * l.n_layers; ++p) {
    const KvRowLayout& f = formats[size_t(p)];
    launch_fill_random_bf16(x, fill * l.n_kv_heads * l.head_dim, uint64_t(p) + 11, 2.0f, st);
    launch_kv_codec_write({x, slots, pool.part(p), f, int32_t(fill), l.n_kv_heads, p / 2}, st);
    const size_t chunk = size_t(fill) * l.n_kv_heads * size_t(f.bytes);
    for (int64_t t0 = fill; t0 < tokens; t0 += fill) {
      const size_t n = size_t(std::min(fill, tokens - t0)) * l.n_kv_heads * size_t(f.bytes);
      STRATA_CUDA_CHECK(cudaMemcpyAsync(pool.part(p) + size_t(t0) * l.n_kv_heads * f.bytes, pool.part(p), std::min(n, chunk),
                                        cudaMemcpyDeviceToDevice, st));
    }
  }
  STRATA_CUDA_CHECK(cudaStreamSynchronize(st));
  cudaFree(x);
  cudaFree(slots);
}

// Each layer's K then V row format of `spec`.
std::vector<KvRowLayout> layer_formats(const KvCodecSpec& spec, int64_t n_layers, int64_t head_dim) {
  const KvRowLayout kf = kv_row_layout(kv_key_format(spec, int32_t(head_dim)));
  const KvRowLayout vf = kv_row_layout(kv_value_format(spec, int32_t(head_dim)));
  std::vector<KvRowLayout> formats;
  for (int64_t l = 0; l < n_layers; ++l) {
    formats.push_back(kf);
    formats.push_back(vf);
  }
  return formats;
}

// The default mode's row: the step and the two pools plan_kv_pools gave the decoder.
struct QuantRow {
  std::string name;
  double ms = 0;  // default launch settings
  int64_t exact_blocks = 0, quant_blocks = 0;
  int64_t quant_token_bytes = 0;  // one token's codec rows over every layer
  double convert_ms = 0;          // converting batch / 16 blocks (a decode step's share)
  double convert_ms_layers = 0;   // the conversion layer by layer (64 launches) instead of one launch
  int64_t capacity = 0;           // sequences of ctx tokens with max_num_seqs sized to them
};

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
    const KvCodecSpec spec{codec, 0};
    const std::vector<KvRowLayout> formats = layer_formats(spec, L, hd);
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
  // Default mode (--kv-quant-start auto: one block). Each sequence's token goes to the last slot
  // of its tail block (exact pool); the blocks before it are codec-pool blocks.
  const int32_t quant_pos = ctx - 1;
  const int32_t n_quant = quant_pos / kBlock;                  // 511 converted blocks per sequence
  const int64_t seq_quant_blocks = (int64_t(ctx) + kBlock - 1) / kBlock;  // an 8k sequence once converted
  std::vector<QuantRow> qrows;
  for (int i = 1; i < 5; ++i) {
    const KvCodec codec = codecs[i];
    const KvCodecSpec spec{codec, 0};
    CudaModelOptions o = opt;
    o.auto_kv_f32 = false;  // bf16 exact rows
    o.kv_quant_start = kQuantStart;
    o.kv_quant_codecs.assign(size_t(L), spec);
    auto mr = CudaDecoder::random(cfg, o, 4321, 0.02f);
    if (!mr.ok()) {
      std::fprintf(stderr, "%s (default mode)\n", mr.error().to_string().c_str());
      return 1;
    }
    CudaDecoder& m = **mr;
    if (m.n_kv_blocks() < batch || int64_t(m.n_kv_quant_blocks()) < int64_t(batch) * n_quant) {
      std::fprintf(stderr, "%s default mode: pools of %d exact and %d codec blocks cannot hold %d sequences of %d codec blocks and one exact\n",
                   kv_codec_name(codec), m.n_kv_blocks(), m.n_kv_quant_blocks(), batch, n_quant);
      return 1;
    }
    fill_pool(m.kv_pool(), layer_formats(KvCodecSpec{KvCodec::kBf16, 0}, L, hd), m.n_kv_blocks(), m.stream());
    std::vector<int32_t> src, dst;
    for (int32_t q = 0; q < batch * n_quant; ++q) {
      src.push_back(q % m.n_kv_blocks());
      dst.push_back(q);
    }
    check_ok(m.convert_kv_blocks(src, dst));
    StepBatch b;
    for (int32_t s = 0; s < batch; ++s) {
      SeqSpan sp;
      for (int32_t j = 0; j < n_quant; ++j) sp.block_table.push_back(s * n_quant + j);
      sp.block_table.push_back(s);  // the tail, in the exact pool
      sp.n_quant_blocks = n_quant;
      sp.pos0 = quant_pos;
      sp.n_tokens = 1;
      sp.logits_last = true;
      b.seqs.push_back(sp);
      b.tokens.push_back((s * 7919 + 13) % cfg.vocab_size);
    }
    std::vector<int32_t> am(static_cast<size_t>(batch), 0);
    QuantRow r;
    r.name = kv_codec_name(codec);
    r.ms = median(time_runs(m.stream(), 3, steps, [&] { check_ok(m.forward(b, am.data())); }));
    r.exact_blocks = m.n_kv_blocks();
    r.quant_blocks = m.n_kv_quant_blocks();
    for (const KvRowLayout& f : layer_formats(spec, L, hd)) r.quant_token_bytes += int64_t(f.bytes) * nkv;
    // Capacity with max_num_seqs sized to it: the largest N whose pools hold N sequences.
    const int64_t exact_token_bytes = m.kv_block_bytes() / kBlock;
    for (int64_t n_seqs = 1;; ++n_seqs) {
      KvPoolShape shape;
      shape.full_bytes_per_token = exact_token_bytes;
      shape.quant_bytes_per_token = r.quant_token_bytes;
      KvLimits limits;
      limits.kv_cache_bytes = opt.kv_cache_bytes;
      limits.block_size = kBlock;
      limits.max_num_seqs = int32_t(n_seqs);
      limits.max_batch_tokens = opt.max_tokens;
      auto pools = plan_kv_pools(shape, limits, opt.max_blocks_per_seq * kBlock, kQuantStart);
      if (!pools.ok() || int64_t(pools->n_quant_blocks) < n_seqs * seq_quant_blocks || pools->n_blocks < n_seqs) break;
      r.capacity = n_seqs;
    }
    // The conversion a decode step pays on average: every sequence fills a block every 16 steps,
    // so batch / 16 blocks per step (timed as the engine queues them: one convert_kv_blocks).
    const int32_t per_step = std::max(batch / kBlock, 1);
    std::vector<int32_t> csrc(src.begin(), src.begin() + per_step), cdst(dst.begin(), dst.begin() + per_step);
    r.convert_ms = median(time_runs(m.stream(), 2, steps, [&] { check_ok(m.convert_kv_blocks(csrc, cdst)); }));
    KvCodecStep::set_fused_convert(false);
    r.convert_ms_layers = median(time_runs(m.stream(), 2, steps, [&] { check_ok(m.convert_kv_blocks(csrc, cdst)); }));
    KvCodecStep::set_fused_convert(true);
    std::printf("  %-12s default (--kv-quant-start auto): %d codec blocks + 1 exact per sequence, median step %.3f ms -> %.0f tok/s; "
                "converting %d blocks (a step's share) %.3f ms in one launch "
                "(layer by layer: %.3f ms); pools %lld exact + %lld codec blocks\n",
                r.name.c_str(), n_quant, r.ms, 1000.0 * batch / r.ms, per_step, r.convert_ms, r.convert_ms_layers,
                static_cast<long long>(r.exact_blocks), static_cast<long long>(r.quant_blocks));
    std::fflush(stdout);
    qrows.push_back(r);
  }
  const Row& base = rows[0];
  std::printf("\nat write (--kv-quant-start 0): every row encoded as it is written, %d cached tokens per sequence\n", ctx);
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
  const double base_seqs = double(base.blocks) * kBlock / double(ctx);
  std::printf("\ndefault (--kv-quant-start auto = %d tokens): %d converted blocks per sequence in the codec pool, the tail block "
              "(the step's token at position %d) in the exact bf16 pool; pools split by plan_kv_pools (max_seqs %d, "
              "max_tokens %d) from the same %.2f GiB; a %d-token sequence takes %lld codec blocks + 1 exact block\n",
              kQuantStart, n_quant, quant_pos, opt.max_seqs, opt.max_tokens, double(opt.kv_cache_bytes) / double(int64_t(1) << 30), ctx,
              static_cast<long long>(seq_quant_blocks));
  std::printf("capacity: the most %d-token sequences N the same bytes hold when the engine runs max_num_seqs N (the exact "
              "pool then keeps 2 blocks per sequence and one step's tokens, plan_kv_pools)\n", ctx);
  std::printf("\n| KV | step ms | conversion ms per step | tok/s with conversion | vs bf16 decoder | vs at write | codec bytes/token "
              "(32 layers) | exact blocks | codec blocks | %d-token sequences | vs bf16 |\n", ctx);
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::printf("| bf16 decoder (auto: no conversion) | %.3f | 0 | %.0f | 1.000 | 1.000 | %lld | %lld | 0 | %.1f | 1.000 |\n", base.ms,
              1000.0 * batch / base.ms, static_cast<long long>(base.block_bytes / kBlock), static_cast<long long>(base.blocks), base_seqs);
  for (const QuantRow& q : qrows) {
    double at_write = 0;
    for (const Row& r : rows) {
      if (r.name == q.name) at_write = r.ms;
    }
    const double total = q.ms + q.convert_ms;
    std::printf("| %s | %.3f | %.3f | %.0f | %.3f | %.3f | %lld | %lld | %lld | %lld | %.3f |\n", q.name.c_str(), q.ms, q.convert_ms,
                1000.0 * batch / total, base.ms / total, at_write / total, static_cast<long long>(q.quant_token_bytes),
                static_cast<long long>(q.exact_blocks), static_cast<long long>(q.quant_blocks), static_cast<long long>(q.capacity),
                double(q.capacity) / base_seqs);
  }
  return 0;
}
