// KV codecs on the GPU: writing a step's new K/V rows into paged codec blocks, and decode
// attention that reads the codec rows directly. The rows are byte for byte the formats of
// backend/reference/kv_codec.h (one row per token and KV head, pools laid out [n_blocks *
// block_size, n_kv_heads] rows as the CPU's cpu::kv_write_rows writes them), so a block can
// move between the CPU and the GPU (tiers, checkpoints) without conversion.
//
// This header stays C++17 (nvcc compiles the .cu as C++17): a row format travels as
// KvRowLayout, made from a KvRowFormat by kv_row_layout() in the C++20 code that has one.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::cuda {

// Row kinds: the numeric values of strata::KvRowKind. kF32 rows (f32 checkpoints) are written
// from f32 staging and read by an f32 kernel of their own (f32 q, scores, softmax and sums).
enum class KvRowKindGpu : int32_t { kF32 = 0, kBf16 = 1, kFp8 = 2, kAffine8 = 3, kAffine4 = 4, kTurbo3 = 5 };

struct KvRowLayout {
  KvRowKindGpu kind = KvRowKindGpu::kBf16;
  int32_t dim = 0;    // head dim
  int32_t group = 0;  // affine group size (affine kinds only)
  int32_t bytes = 0;  // bytes of one row (KvRowFormat::bytes())
};

// From a strata::KvRowFormat (or anything with kind, dim, group and bytes()).
template <class Format>
KvRowLayout kv_row_layout(const Format& f) {
  return KvRowLayout{KvRowKindGpu(int32_t(f.kind)), f.dim, f.group, int32_t(f.bytes())};
}

// Empty when the GPU kernels handle this key/value layout pair, else why not. Supported pairs:
// f32/f32, bf16/bf16, fp8/fp8, affine8/affine8, affine4/affine4 and affine8/turbo3 (the turbo codec);
// head dims 16, 32, 64, 128 or 256 (keys and values alike); affine groups a multiple of 16 that
// divides the head dim; rows of at most 1,024 bytes.
const char* kv_codec_gpu_problem(const KvRowLayout& k, const KvRowLayout& v);
// Empty when launch_kv_codec_write can encode rows of this layout (the same head dims and
// groups as above, any kind).
const char* kv_codec_write_problem(const KvRowLayout& f);

// Encodes x into pool rows: token t's head h goes to row slot_mapping[t] * n_kv_heads + h of
// the pool (slot = block * block_size + position % block_size); slot < 0 skips the token.
// The bytes equal reference::kv_encode_row of the same values (turbo3 rows use the rotation
// seed kv_rotation_seed(seed_layer, h)). With x_f32 the rows are encoded from it instead of x
// (f32 rows need it; the CPU codecs encode from f32 too).
struct KvCodecWriteArgs {
  const uint16_t* x;             // [n_tokens, n_kv_heads, fmt.dim] bf16
  const int64_t* slot_mapping;   // [n_tokens]
  uint8_t* pool;                 // [n_blocks * block_size, n_kv_heads] rows of fmt.bytes
  KvRowLayout fmt;
  int32_t n_tokens;
  int32_t n_kv_heads;
  int32_t seed_layer;            // turbo3 only
  const float* x_f32 = nullptr;  // f32 rows: token t's head h at x_f32[t * x_stride + h * fmt.dim]
  int64_t x_stride = 0;          // floats between tokens of x_f32
  // Block conversion (re-encoding whole blocks of another pool): with src_blocks, token t is
  // position j = t % block_size of block i = t / block_size; it reads source row
  // src_blocks[i] * block_size + j of x (or x_f32: that row times x_stride) and goes to slot
  // dst_blocks[i] * block_size + j. slot_mapping is not read; n_tokens = blocks * block_size.
  const int32_t* src_blocks = nullptr;  // [n_tokens / block_size] device
  const int32_t* dst_blocks = nullptr;  // [n_tokens / block_size] device
  int32_t block_size = 0;
};
void launch_kv_codec_write(const KvCodecWriteArgs& a, cudaStream_t stream);

// Block conversion of every layer in one launch (delayed quantization, every layer the same
// codec and geometry): part p (layer p / 2's K for even p, V for odd) re-encodes the exact rows
// of blocks src_blocks[i] (bf16, or f32 with src_f32) of src_parts[p] into blocks dst_blocks[i]
// of dst_parts[p], every position and KV head: the bytes launch_kv_codec_write gives with the
// same src/dst blocks, one layer at a time (turbo3 rows: layer l's rotation, sign words
// turbo_signs[l * 256, (l + 1) * 256) as kv_turbo_sign_words(l, ...) makes them).
struct KvCodecConvertArgs {
  const uint8_t* const* src_parts;  // [2 * n_layers] device: the exact pool's parts
  uint8_t* const* dst_parts;        // [2 * n_layers] device: the codec pool's parts
  KvRowLayout k_fmt, v_fmt;         // the codec's rows (every layer)
  bool src_f32;                     // exact rows f32 (else bf16), fmt.dim values each
  int32_t n_layers;
  int32_t n_kv_heads;
  int32_t block_size;
  int32_t n_blocks;
  const int32_t* src_blocks;        // [n_blocks] device
  const int32_t* dst_blocks;        // [n_blocks] device
  const uint32_t* turbo_signs = nullptr;  // [n_layers, 256] device; turbo3 formats only
};
void launch_kv_codec_convert(const KvCodecConvertArgs& a, cudaStream_t stream);
// The rotation sign words turbo3 rows of seed_layer use (bit h * dim + d of words[256]: set for
// -1), for KvCodecConvertArgs::turbo_signs. n_kv_heads * dim <= 8,192.
void kv_turbo_sign_words(int32_t seed_layer, int32_t n_kv_heads, int32_t dim, uint32_t* words);

// Attention over codec pools, one query token per row: row s (its heads q[s]) sees the keys at
// positions [0, context_lens[s]) of its block table (its own key included: write it first), or
// [key_begin[s], context_lens[s]) with key_begin (an empty range leaves an empty partial).
// The table is row s's own (decode: one token per sequence) or, with query_seq, row
// query_seq[s] of block_tables: several query rows of one sequence (a prefill chunk), each
// with its own causal limit (position + 1; launch_kv_codec_query_rows makes both arrays); with
// a window, only the last `window` of those keys (positions >= context_lens[s] - window). GQA:
// query head h reads KV head h / (n_heads / n_kv_heads). The keys of a row are cut into
// n_splits chunks; each (KV head, split, sequence) block stages the
// encoded rows in shared memory and dequantizes them in registers (no dequantized copy of the
// cache), with f32 sums, and writes partial (out, max, sum);
// launch_kv_codec_attention then merges the splits (turbo3 values: in the rotated domain, then
// rotated back once per output vector) into out, and out_lo = bf16(o - out) when given (the
// attention output's lo part for split-input GEMMs).
// Two sources (delayed quantization: a row's first keys in codec rows, the rest in exact rows):
// a first call over the codec pool with merge = false writes partial splits [0, n1); a second
// over the exact pool with split_base = n1 writes [n1, n1 + n2) and merges all of them, the
// first rotated_splits (turbo3 values) rotated back before they join the rest. f32 rows (both kinds kF32) read q from
// q_f32 and run an f32 kernel of their own (one query head per block, 32 keys per warp pass).
struct KvCodecAttentionArgs {
  const uint16_t* q;            // [n_seqs, n_heads, k_fmt.dim] bf16
  uint16_t* out;                // [n_seqs, n_heads, v_fmt.dim] bf16
  const uint8_t* k_pool;        // [n_blocks * block_size, n_kv_heads] rows of k_fmt.bytes
  const uint8_t* v_pool;        // [n_blocks * block_size, n_kv_heads] rows of v_fmt.bytes
  KvRowLayout k_fmt;
  KvRowLayout v_fmt;
  int32_t seed_layer;           // turbo3 values: KV head h uses kv_rotation_seed(seed_layer, h)
  const int32_t* block_tables;  // [n_seqs, max_blocks_per_seq]
  const int32_t* context_lens;  // [n_seqs] keys each query sees, >= 1
  const int32_t* query_seq = nullptr;  // [n_seqs] block-table row of each query row, or null: row s
  float* partial_out;           // [n_splits, n_seqs, n_heads, v_fmt.dim] scratch
  float* partial_ml;            // [n_splits, n_seqs, n_heads, 2] scratch: max, sum of exp
  int32_t n_seqs;
  int32_t n_splits;             // 1..64
  int32_t max_blocks_per_seq;
  int32_t block_size;
  int32_t n_heads;
  int32_t n_kv_heads;           // n_heads / n_kv_heads in {1, 2, 4, 8}
  float scale;                  // multiplies q.k
  float softcap;                // 0: none; else logits = softcap * tanh(logits / softcap)
  int32_t window = 0;           // 0: every key up to the row's limit; else the last `window` keys
  uint16_t* out_lo = nullptr;   // [n_seqs, n_heads, v_fmt.dim] bf16 or null
  const float* q_f32 = nullptr; // f32 rows: row s's head h at q_f32[s * q_stride + h * k_fmt.dim]
  int64_t q_stride = 0;         // floats between rows of q_f32
  const int32_t* key_begin = nullptr;  // [n_seqs] first key of each row, or null: 0
  int32_t split_base = 0;       // this call's splits are partial splits [split_base, split_base + n_splits)
  bool merge = true;            // false: the split kernel only (its partials wait for a later merge)
  int32_t rotated_splits = 0;   // the merge: splits [0, rotated_splits) hold turbo3-rotated values
};
// Both kernels (the split blocks, then the merge of splits [0, split_base + n_splits), at most
// 64). Layouts must pass kv_codec_gpu_problem.
void launch_kv_codec_attention(const KvCodecAttentionArgs& a, cudaStream_t stream);

// The per-query-row arrays of a packed step (tokens of sequence s at [seq_q_start[s],
// seq_q_start[s + 1])): context_lens[t] = positions[t] + 1, query_seq[t] = s, and with
// quant_lens the row's keys in codec blocks: min(n_quant_blocks[s] * block_size, positions[t] + 1)
// (0 without n_quant_blocks).
struct KvCodecQueryRowsArgs {
  const int32_t* positions;    // [n_tokens]
  const int32_t* seq_q_start;  // [n_seqs + 1]
  int32_t* context_lens;       // [n_tokens]
  int32_t* query_seq;          // [n_tokens]
  int32_t n_tokens;
  int32_t n_seqs;
  const int32_t* n_quant_blocks = nullptr;  // [n_seqs] or null
  int32_t block_size = 0;
  int32_t* quant_lens = nullptr;            // [n_tokens] or null
};
void launch_kv_codec_query_rows(const KvCodecQueryRowsArgs& a, cudaStream_t stream);
// Occupancy of the split kernel, process-wide: registers capped for 3 blocks (12 warps) per
// multiprocessor (default; group 4 spills a little) or 2 (no spills at group <= 4). For benchmarks.
void set_kv_codec_attention_min_blocks(int32_t blocks);
int32_t kv_codec_attention_min_blocks();
// Which split kernel runs, process-wide (for tests and benchmarks): on (default), the
// tensor-core kernel for head dims 64 and 128, GQA groups up to 8 and affine value groups a
// multiple of 32 (int8) or 64 (int4), the CUDA-core kernel for the rest; off, the CUDA-core
// kernel for everything.
void set_kv_codec_attention_mma(bool on);
bool kv_codec_attention_mma();
// Occupancy of the tensor-core kernel, process-wide: registers capped for 3 blocks per
// multiprocessor with 3 key tiles per warp in flight (default) or 4 blocks with 2. For benchmarks.
void set_kv_codec_mma_blocks(int32_t blocks);
int32_t kv_codec_mma_blocks();

}  // namespace strata::cuda
