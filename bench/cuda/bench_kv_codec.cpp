// KV codec capacity and decode attention on the GPU, Llama-3.1-8B shape (32 layers, 32 query
// heads, 8 KV heads, head dim 128, blocks of 16 tokens). Per codec (bf16, fp8, int8, int4,
// turbo):
//  - bytes per token per layer (K and V rows of all KV heads) and per token over 32 layers;
//  - how many concurrent 8,192-token sequences a device KV pool of a fixed size holds, and
//    int4's ratio to bf16;
//  - the ATTENTION PART of one decode step at batch 64 with 8,192-token contexts: 32 launches
//    of launch_kv_codec_attention (split kernel + merge; the tensor-core split kernel, and the
//    CUDA-core one for comparison) over one layer's pools (64 x 8,192
//    tokens, shuffled block tables; the pools are far larger than L2, so each launch reads its
//    rows from memory as distinct layers would), the KV bytes it reads per step, and that
//    rate as a ratio to the measured device copy bandwidth (cudaMemcpy device to device, bytes
//    read + written). The weight GEMVs of the step are not here (bench_cuda_llama measures
//    them); codecs are not wired into the CUDA decoder.
//  - bf16 also through the decoder's own split-KV attention (launch_paged_attention +
//    launch_attention_combine) on the same pools, for comparison;
//  - writing one step's new K/V rows (64 tokens x 32 layers) with launch_kv_codec_write.
// Usage: bench_kv_codec [pool_gib=64] [reps=10]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_codec.h"
#include "backend/reference/kv_codec.h"
#include "bench_timing.h"

using namespace strata;
using namespace strata::cuda;
using namespace strata::cuda::bench;

namespace {

constexpr int32_t kLayers = 32, kHeads = 32, kKvHeads = 8, kHeadDim = 128, kBlock = 16;
constexpr int32_t kBatch = 64, kContext = 8192;

// Median ms of `reps` runs of fn (one decode step each) after one warm-up run.
template <class Fn>
double time_step(cudaStream_t st, int reps, Fn fn) {
  return median(time_runs(st, 1, reps, fn));
}

struct CodecRow {
  const char* name;
  int64_t bytes_per_token_layer;
  int64_t seqs;
  double best_ms;  // tensor-core split kernel, best of splits x occupancy variants
  int32_t best_splits;
  int32_t best_blocks;
  double gbps;
  double core_ms;  // CUDA-core split kernel, best of splits x occupancy caps
  int32_t core_splits;
  int32_t core_min_blocks;
  double write_ms;
};

}  // namespace

int main(int argc, char** argv) {
  const double pool_gib = argc > 1 ? std::atof(argv[1]) : 64.0;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 10;
  if (pool_gib <= 0.0 || reps <= 0) {
    std::fprintf(stderr, "usage: bench_kv_codec [pool_gib=64 (> 0)] [reps=10 (> 0)]\n");
    return 2;
  }
  cudaDeviceProp prop{};
  STRATA_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  cudaStream_t st;
  STRATA_CUDA_CHECK(cudaStreamCreate(&st));
  const double copy_bw = copy_bandwidth(st);
  std::printf("shape: Llama-3.1-8B KV (%d layers, %d heads, %d KV heads, head dim %d, blocks of %d)\n", kLayers,
              kHeads, kKvHeads, kHeadDim, kBlock);
  std::printf("decode: batch %d, context %d tokens each; ATTENTION ONLY (no weight GEMVs: see bench_cuda_llama)\n",
              kBatch, kContext);

  // Shared step inputs: shuffled block tables, q, the tokens' context lengths.
  const int32_t blocks_per_seq = kContext / kBlock, n_blocks = kBatch * blocks_per_seq;
  std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(1234);
  std::shuffle(perm.begin(), perm.end(), rng);
  int32_t *d_tables = nullptr, *d_lens = nullptr;
  uint16_t *d_q = nullptr, *d_out = nullptr, *d_x = nullptr;
  int64_t* d_slots = nullptr;
  float *d_part = nullptr, *d_ml = nullptr;
  constexpr int32_t kMaxSplits = 32;
  const int64_t n_tok = int64_t(kBatch) * kContext;
  const int64_t chunk_tokens = 65536;  // tokens encoded per fill launch
  STRATA_CUDA_CHECK(cudaMalloc(&d_tables, perm.size() * sizeof(int32_t)));
  STRATA_CUDA_CHECK(cudaMalloc(&d_lens, kBatch * sizeof(int32_t)));
  STRATA_CUDA_CHECK(cudaMalloc(&d_q, size_t(kBatch) * kHeads * kHeadDim * 2));
  STRATA_CUDA_CHECK(cudaMalloc(&d_out, size_t(kBatch) * kHeads * kHeadDim * 2));
  STRATA_CUDA_CHECK(cudaMalloc(&d_part, size_t(kMaxSplits) * kBatch * kHeads * kHeadDim * 4));
  STRATA_CUDA_CHECK(cudaMalloc(&d_ml, size_t(kMaxSplits) * kBatch * kHeads * 2 * 4));
  STRATA_CUDA_CHECK(cudaMalloc(&d_x, size_t(chunk_tokens) * kKvHeads * kHeadDim * 2));
  STRATA_CUDA_CHECK(cudaMalloc(&d_slots, size_t(n_tok) * sizeof(int64_t)));
  STRATA_CUDA_CHECK(cudaMemcpy(d_tables, perm.data(), perm.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  const std::vector<int32_t> lens(kBatch, kContext);
  STRATA_CUDA_CHECK(cudaMemcpy(d_lens, lens.data(), lens.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  std::vector<int64_t> slots(static_cast<size_t>(n_tok));
  for (int64_t t = 0; t < n_tok; ++t) {
    const int64_t s = t / kContext, p = t % kContext;
    slots[size_t(t)] = int64_t(perm[size_t(s * blocks_per_seq + p / kBlock)]) * kBlock + p % kBlock;
  }
  STRATA_CUDA_CHECK(cudaMemcpy(d_slots, slots.data(), slots.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
  launch_fill_random_bf16(d_q, int64_t(kBatch) * kHeads * kHeadDim, 99, 1.0f, st);

  const KvCodec codecs[] = {KvCodec::kBf16, KvCodec::kFp8, KvCodec::kInt8, KvCodec::kInt4, KvCodec::kTurbo};
  const int32_t split_choices[] = {2, 4, 8, 16, 32};
  std::vector<CodecRow> rows;
  double decoder_ms = 1e30;  // the decoder's bf16 attention (launch_paged_attention), best split count
  const double pool_bytes = pool_gib * double(int64_t(1) << 30);
  for (KvCodec codec : codecs) {
    const KvCodecSpec spec{codec, 0};
    const KvRowLayout kl = kv_row_layout(kv_key_format(spec, kHeadDim));
    const KvRowLayout vl = kv_row_layout(kv_value_format(spec, kHeadDim));
    CodecRow row{};
    row.name = kv_codec_name(codec);
    row.bytes_per_token_layer = int64_t(kKvHeads) * (kl.bytes + vl.bytes);
    const double per_seq = double(row.bytes_per_token_layer) * kLayers * kContext;
    row.seqs = int64_t(pool_bytes / per_seq);

    uint8_t *k_pool = nullptr, *v_pool = nullptr;
    STRATA_CUDA_CHECK(cudaMalloc(&k_pool, size_t(n_tok) * kKvHeads * size_t(kl.bytes)));
    STRATA_CUDA_CHECK(cudaMalloc(&v_pool, size_t(n_tok) * kKvHeads * size_t(vl.bytes)));
    for (int64_t t0 = 0; t0 < n_tok; t0 += chunk_tokens) {
      const int32_t n = int32_t(std::min(chunk_tokens, n_tok - t0));
      launch_fill_random_bf16(d_x, int64_t(n) * kKvHeads * kHeadDim, uint64_t(t0) * 2 + 1, 2.0f, st);
      launch_kv_codec_write({d_x, d_slots + t0, k_pool, kl, n, kKvHeads, 0}, st);
      launch_fill_random_bf16(d_x, int64_t(n) * kKvHeads * kHeadDim, uint64_t(t0) * 2 + 2, 2.0f, st);
      launch_kv_codec_write({d_x, d_slots + t0, v_pool, vl, n, kKvHeads, 0}, st);
    }
    STRATA_CUDA_CHECK(cudaStreamSynchronize(st));

    KvCodecAttentionArgs a{};
    a.q = d_q;
    a.out = d_out;
    a.k_pool = k_pool;
    a.v_pool = v_pool;
    a.k_fmt = kl;
    a.v_fmt = vl;
    a.seed_layer = 0;
    a.block_tables = d_tables;
    a.context_lens = d_lens;
    a.partial_out = d_part;
    a.partial_ml = d_ml;
    a.n_seqs = kBatch;
    a.max_blocks_per_seq = blocks_per_seq;
    a.block_size = kBlock;
    a.n_heads = kHeads;
    a.n_kv_heads = kKvHeads;
    a.scale = 0.08838834764f;  // 1 / sqrt(128)
    a.softcap = 0.0f;
    const double step_bytes = double(row.bytes_per_token_layer) * kLayers * double(n_tok);
    row.best_ms = row.core_ms = 1e30;
    // The tensor-core split kernel (the default), then the CUDA-core one at both occupancy caps.
    const struct {
      bool mma;
      int32_t min_blocks;
    } variants[] = {{true, 3}, {true, 4}, {false, 3}, {false, 2}};
    for (const auto& var : variants) {
      set_kv_codec_attention_mma(var.mma);
      if (var.mma) {
        set_kv_codec_mma_blocks(var.min_blocks);
      } else {
        set_kv_codec_attention_min_blocks(var.min_blocks);
      }
      for (int32_t splits : split_choices) {
        a.n_splits = splits;
        const double ms = time_step(st, reps, [&] {
          for (int l = 0; l < kLayers; ++l) launch_kv_codec_attention(a, st);
        });
        if (var.mma) {
          std::printf("  %-5s tensor-core, blocks/SM %d, splits %2d: %.3f ms per step (32 layers), %.1f GB/s KV read\n",
                      row.name, var.min_blocks, splits, ms, step_bytes / (ms * 1e-3) * 1e-9);
          if (ms < row.best_ms) row.best_ms = ms, row.best_splits = splits, row.best_blocks = var.min_blocks;
        } else {
          std::printf("  %-5s CUDA-core, min blocks/SM %d, splits %2d: %.3f ms per step (32 layers), %.1f GB/s KV read\n",
                      row.name, var.min_blocks, splits, ms, step_bytes / (ms * 1e-3) * 1e-9);
          if (ms < row.core_ms) row.core_ms = ms, row.core_splits = splits, row.core_min_blocks = var.min_blocks;
        }
      }
    }
    set_kv_codec_attention_mma(true);
    set_kv_codec_mma_blocks(3);
    set_kv_codec_attention_min_blocks(3);
    row.gbps = step_bytes / (row.best_ms * 1e-3) * 1e-9;
    row.write_ms = time_step(st, reps, [&] {
      for (int l = 0; l < kLayers; ++l) {
        launch_kv_codec_write({d_x, d_slots, k_pool, kl, kBatch, kKvHeads, l}, st);
        launch_kv_codec_write({d_x, d_slots, v_pool, vl, kBatch, kKvHeads, l}, st);
      }
    });

    if (codec == KvCodec::kBf16) {
      // The decoder's own bf16 split-KV attention (CUDA-core kernel + combine) on the same pool.
      std::vector<int32_t> tile_seq(kBatch), tile_q0(kBatch, 0), q_start(kBatch + 1), pos0(kBatch, kContext - 1);
      std::iota(tile_seq.begin(), tile_seq.end(), 0);
      std::iota(q_start.begin(), q_start.end(), 0);
      int32_t* d_meta = nullptr;
      STRATA_CUDA_CHECK(cudaMalloc(&d_meta, size_t(4 * kBatch + 1) * sizeof(int32_t)));
      STRATA_CUDA_CHECK(cudaMemcpy(d_meta, tile_seq.data(), kBatch * 4, cudaMemcpyHostToDevice));
      STRATA_CUDA_CHECK(cudaMemcpy(d_meta + kBatch, tile_q0.data(), kBatch * 4, cudaMemcpyHostToDevice));
      STRATA_CUDA_CHECK(cudaMemcpy(d_meta + 2 * kBatch, pos0.data(), kBatch * 4, cudaMemcpyHostToDevice));
      STRATA_CUDA_CHECK(cudaMemcpy(d_meta + 3 * kBatch, q_start.data(), (kBatch + 1) * 4, cudaMemcpyHostToDevice));
      PagedAttentionArgs p{};
      p.q = d_q;
      p.out = d_out;
      p.k_pool = reinterpret_cast<const uint16_t*>(k_pool);
      p.v_pool = reinterpret_cast<const uint16_t*>(v_pool);
      p.block_tables = d_tables;
      p.seq_q_start = d_meta + 3 * kBatch;
      p.seq_pos0 = d_meta + 2 * kBatch;
      p.tile_seq = d_meta;
      p.tile_q0 = d_meta + kBatch;
      p.partial_out = d_part;
      p.partial_ml = d_ml;
      p.n_tokens = kBatch;
      p.n_tiles = kBatch;
      p.tokens_per_tile = 1;
      p.max_blocks_per_seq = blocks_per_seq;
      p.block_size = kBlock;
      p.n_heads = kHeads;
      p.n_kv_heads = kKvHeads;
      p.head_dim = kHeadDim;
      p.scale = a.scale;
      for (int32_t splits : split_choices) {
        p.n_splits = splits;
        const double ms = time_step(st, reps, [&] {
          for (int l = 0; l < kLayers; ++l) {
            launch_paged_attention(p, st);
            launch_attention_combine(p, st);
          }
        });
        std::printf("  bf16 via launch_paged_attention, splits %2d: %.3f ms per step, %.1f GB/s KV read\n", splits,
                    ms, step_bytes / (ms * 1e-3) * 1e-9);
        decoder_ms = std::min(decoder_ms, ms);
      }
      cudaFree(d_meta);
    }
    cudaFree(k_pool);
    cudaFree(v_pool);
    rows.push_back(row);
  }

  std::printf("\npool %.0f GiB, %d-token sequences, batch %d decode, attention only over %d layers\n", pool_gib,
              kContext, kBatch, kLayers);
  std::printf("decoder bf16 attention (launch_paged_attention + combine, best split): %.3f ms per step\n", decoder_ms);
  std::printf("| codec | bytes/token/layer | bytes/token (32 layers) | 8k seqs in pool | vs bf16 | attn ms/step | "
              "splits, blocks/SM | KV GB/s | of copy BW | ms vs decoder bf16 | CUDA-core ms (splits, blocks/SM) | write ms/step |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  const CodecRow& bf = rows.front();
  for (const CodecRow& r : rows) {
    std::printf("| %s | %lld | %lld | %lld | %.3f | %.3f | %d, %d | %.1f | %.3f | %.3f | %.3f (%d, %d) | %.3f |\n", r.name,
                static_cast<long long>(r.bytes_per_token_layer), static_cast<long long>(r.bytes_per_token_layer * kLayers),
                static_cast<long long>(r.seqs), double(r.seqs) / double(bf.seqs), r.best_ms, r.best_splits, r.best_blocks,
                r.gbps,
                r.gbps * 1e9 / copy_bw, r.best_ms / decoder_ms, r.core_ms, r.core_splits, r.core_min_blocks,
                r.write_ms);
  }
  const CodecRow& i4 = rows[3];
  std::printf("int4/bf16 concurrent 8k sequences: %lld / %lld = %.3f (bytes ratio %.3f; target >= 3.4)\n",
              static_cast<long long>(i4.seqs), static_cast<long long>(bf.seqs), double(i4.seqs) / double(bf.seqs),
              double(bf.bytes_per_token_layer) / double(i4.bytes_per_token_layer));
  cudaFree(d_tables);
  cudaFree(d_lens);
  cudaFree(d_q);
  cudaFree(d_out);
  cudaFree(d_part);
  cudaFree(d_ml);
  cudaFree(d_x);
  cudaFree(d_slots);
  return 0;
}
