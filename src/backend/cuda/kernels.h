// CUDA kernels of the decoder forward. Each takes one plain argument struct (no classes, no
// owning pointers: what a launch needs, by value) and a stream, and is checked against
// backend/reference on random data in tests/gpu.
//
// Conventions: bf16 tensors are passed as their raw bits (uint16_t); the residual stream and
// the GEMM outputs that feed normalizations are f32. Shapes are row-major, written next to
// each field.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::cuda {

enum class Act : int32_t { kSilu = 0, kGeluTanh = 1 };

// out[t, :] = table[ids[t], :] * scale. The caller guarantees 0 <= ids[t] < vocab. With
// norm_out, also the first norm's input for a norm-scaled GEMV (GemvIn::kNormScaled):
// norm_out[t] = bf16(out[t] * (norm_w or 1 + norm_w)) and ss_out[t] = sum of out[t]^2 (one part).
struct EmbedArgs {
  const uint16_t* table;  // [vocab, hidden] bf16
  const int32_t* ids;     // [n]
  float* out;             // [n, hidden]
  int32_t n;
  int32_t hidden;
  float scale;
  const float* norm_w = nullptr;  // [hidden]
  uint16_t* norm_out = nullptr;   // [n, hidden] bf16 or null
  float* ss_out = nullptr;        // [n]
  int32_t norm_one_plus_w = 0;
};
void launch_embed(const EmbedArgs& a, cudaStream_t stream);

// Residual add fused with RMSNorm. Without row_map: x[r] += branch[r] (+ branch_bias) when
// branch is given, then out[r] = x[r] / rms(x[r]) * (w or 1 + w). With row_map (branch must
// be null): out[r] = norm(x[row_map[r]]), x untouched (the final norm of the logit rows).
struct AddRmsNormArgs {
  float* x;                  // [rows_x, dim] residual stream, updated in place
  const float* branch;       // [rows, dim] or null
  const float* branch_bias;  // [dim] or null (the bias of the projection that made branch)
  const float* w;            // [dim]
  const int32_t* row_map;    // [rows] or null
  uint16_t* out;             // [rows, dim] bf16
  int32_t rows;
  int32_t dim;
  float eps;
  int32_t one_plus_w;
};
void launch_add_rms_norm(const AddRmsNormArgs& a, cudaStream_t stream);

// After the fused QKV projection, per token: bias, per-head RMSNorm of q and k (Qwen3), RoPE
// on q and k (half-split pairs (i, i + rot_dim/2) of the first rot_dim dims), q to `q_out`,
// k and v into the paged pools at slot_mapping[t] (block * block_size + position % block_size).
struct QkvPostArgs {
  const float* qkv;          // [n, (n_heads + 2 * n_kv_heads) * head_dim]: q heads, k heads, v heads
  const float* bias;         // [(n_heads + 2 * n_kv_heads) * head_dim] or null
  const float* q_norm;       // [head_dim] or null
  const float* k_norm;       // [head_dim] or null
  const int32_t* positions;  // [n]
  const float* inv_freq;     // [rot_dim / 2]
  const int64_t* slot_mapping;  // [n]; < 0: do not store this token's k/v
  uint16_t* q_out;           // [n, n_heads, head_dim] bf16
  uint16_t* k_pool;          // [n_blocks * block_size, n_kv_heads, head_dim] bf16
  uint16_t* v_pool;          // same shape
  int32_t n;
  int32_t n_heads;
  int32_t n_kv_heads;
  int32_t head_dim;          // <= 256
  int32_t rot_dim;           // even, <= head_dim; 0: no RoPE
  float attn_factor;         // multiplies cos and sin
  float norm_eps;
  int32_t norm_one_plus_w;
  // Or null: every head after the post also in f32, laid out as qkv (may be qkv itself: each
  // head is read whole before it is written back).
  float* f32_out = nullptr;  // [n, (n_heads + 2 * n_kv_heads) * head_dim]
};
void launch_qkv_post(const QkvPostArgs& a, cudaStream_t stream);

// out[t, i] = act(gate_up[t, i]) * gate_up[t, inter + i].
struct GatedActArgs {
  const uint16_t* gate_up;  // [n, 2 * inter] bf16: gate then up
  uint16_t* out;            // [n, inter] bf16
  int32_t n;
  int32_t inter;
  Act act;
};
void launch_gated_act(const GatedActArgs& a, cudaStream_t stream);

// out[r] = argmax over logits[r, :] (lowest index wins ties; NaN never wins).
struct ArgmaxArgs {
  const float* logits;  // [rows, vocab]
  int32_t* out;         // [rows]
  int32_t rows;
  int32_t vocab;
};
void launch_argmax(const ArgmaxArgs& a, cudaStream_t stream);

// Paged attention over a packed batch of sequences (ragged: each has its own query count and
// cached prefix). Query token t of sequence s sits at position pos0[s] + t and sees the keys
// at positions p <= its own and, with a window, pos - p < window. Work is cut into query
// tiles (tile_seq / tile_q0, built on the host) x KV heads x KV splits; with n_splits > 1 each
// split writes partial results that launch_attention_combine merges (decode: split-KV).
struct PagedAttentionArgs {
  const uint16_t* q;            // [n_tokens, n_heads, head_dim] bf16
  uint16_t* out;                // [n_tokens, n_heads, head_dim] bf16 (n_splits == 1)
  const uint16_t* k_pool;       // [n_blocks * block_size, n_kv_heads, head_dim] bf16
  const uint16_t* v_pool;       // same shape
  const int32_t* block_tables;  // [n_seqs, max_blocks_per_seq]
  const int32_t* seq_q_start;   // [n_seqs + 1] first token of each sequence in the packed batch
  const int32_t* seq_pos0;      // [n_seqs] cached tokens before this step
  const int32_t* tile_seq;      // [n_tiles]
  const int32_t* tile_q0;       // [n_tiles] first query (within its sequence) of the tile
  float* partial_out;           // [n_splits, n_tokens, n_heads, head_dim] (n_splits > 1)
  float* partial_ml;            // [n_splits, n_tokens, n_heads, 2]: running max, sum (n_splits > 1)
  int32_t n_tokens;
  int32_t n_tiles;
  int32_t tokens_per_tile;      // tokens_per_tile * (n_heads / n_kv_heads) <= attention_max_rows()
  int32_t n_splits;
  int32_t max_blocks_per_seq;
  int32_t block_size;
  int32_t n_heads;
  int32_t n_kv_heads;
  int32_t head_dim;             // <= 256, multiple of 8
  int32_t window;               // 0: full causal
  float scale;                  // multiplies q.k
  float softcap;                // 0: none
  // Decode fusion (every sequence exactly one query token; CUDA-core kernel). With post.qkv
  // set, each block makes its q rows from the QKV projection itself (bias, q norm, RoPE: the
  // arithmetic of launch_qkv_post, q kept in f32) instead of reading q, and the block whose
  // split holds the token's own position writes the token's k and v into the pools first, so
  // no launch_qkv_post runs (post.n/n_heads/... must match the fields above).
  QkvPostArgs post{};
  // [n_tokens * n_kv_heads] zeros, or null. With n_splits > 1, the last split block of each
  // (token, KV head) to finish merges the partial results and resets its counter to 0:
  // launch_attention_combine then does nothing.
  int32_t* split_counters = nullptr;
  // Batch-invariant steps (CudaModelOptions::deterministic): n_splits must be 1 and the decode
  // tensor-core kernel is skipped, so a decode token takes the kernel a prefill tile takes
  // whatever else shares the step.
  int32_t batch_invariant = 0;
};
int32_t attention_max_rows();  // query rows (token x head of one KV group) one CUDA-core tile holds
// Tokens per query tile that launch_paged_attention wants for these shapes: 64 rows for the
// tensor-core kernel (head_dim 16/32/64/128, one split), else attention_max_rows() rows.
int32_t attention_tokens_per_tile(int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, int32_t n_splits);
// Picks the tensor-core decode kernel when every tile is one token (n_tiles == n_tokens), not
// batch_invariant, no post, group <= 16 and head_dim 64 or 128 (any n_splits); else the tensor-core flash kernel
// when flash_attention_supports(head_dim), n_splits == 1 and the tile fits its rows; else the
// CUDA-core kernel (which needs tokens_per_tile * group <=
// attention_max_rows()).
void launch_paged_attention(const PagedAttentionArgs& a, cudaStream_t stream);
void launch_attention_combine(const PagedAttentionArgs& a, cudaStream_t stream);

// The tensor-core (mma.sync bf16) flash-attention kernel itself, splits included:
// tokens_per_tile * group <= flash_attention_rows().
bool flash_attention_supports(int32_t head_dim);
int32_t flash_attention_rows();
void launch_flash_attention(const PagedAttentionArgs& a, cudaStream_t stream);
// Occupancy variant of the head_dim-128 kernel, process-wide: registers cut for 3 blocks per
// multiprocessor (default) or 2 (no spills). For benchmarks.
void set_flash_attention_min_blocks(int32_t blocks);

// y[m, n] = x[m, k] . w[n, k]^T for a few rows m <= kGemvMaxRows (decode): a weight stream, fp32
// sums, y in f32 or bf16. Needs k % 8 == 0 and 16-byte aligned x and w (gemv_supports).
constexpr int64_t kGemvMaxRows = 4;
bool gemv_supports(const void* x, const void* w, int64_t m, int64_t k);
void launch_gemv_bf16(const uint16_t* x, const uint16_t* w, void* y, bool f32_out, int64_t m, int64_t n, int64_t k,
                      cudaStream_t stream);

// The GEMV with the small kernels of a decode layer folded in.
// Input: kPlain: x as is. kNormScaled: x[r] holds bf16(u[r] * norm weight) of an unnormalized
//   row u[r] whose sum of squares is the sum of in_ss[r * in_ss_parts + j], j < in_ss_parts;
//   each dot is scaled by rsqrt(ss / k + in_eps): the RMSNorm of u[r] without its own launch.
// Output: kF32 / kBF16: y[m, n]. kResidual: y is the f32 residual stream [m, n], y += x.w^T
//   (+ bias); with norm_out, norm_out[r] = bf16(y[r] * norm weight) and ss_out[r *
//   gemv_blocks(n) + b] = block b's sum of y[r]^2 (the next GEMV's kNormScaled input).
//   kGatedAct: w is [2n, k] (gate rows, then up rows); y[m, n] bf16 = act(gate) * up.
enum class GemvIn : int32_t { kPlain = 0, kNormScaled = 1 };
enum class GemvOut : int32_t { kF32 = 0, kBF16 = 1, kResidual = 2, kGatedAct = 3 };
constexpr int64_t kGemvRowsPerBlock = 8;  // output rows per block: ss_out holds one part per block
struct GemvArgs {
  const uint16_t* x;        // [m, k] bf16
  const uint16_t* w;        // [n, k] bf16 ([2n, k] for kGatedAct)
  void* y;                  // see GemvOut
  int64_t m, n, k;
  GemvIn in;
  GemvOut out;
  const float* in_ss;       // [m, in_ss_parts] (kNormScaled)
  int32_t in_ss_parts;
  float in_eps;
  const float* bias;        // [n] or null (kResidual)
  const float* norm_w;      // [n] (kResidual with norm_out)
  int32_t norm_one_plus_w;
  uint16_t* norm_out;       // [m, n] bf16 or null (kResidual)
  float* ss_out;            // [m, gemv_blocks(n)] or null (kResidual)
  Act act;                  // kGatedAct
  // Bytes at the start of each weight row pulled into L2 before the wait for the previous
  // kernel (0: LaunchTuning::gemv_prefetch_bytes); with prefetch_spread the low half of the
  // grid also pulls the high half's rows. For a GEMV behind a kernel that reads little memory
  // (decode attention), so its weights stream while that kernel runs.
  int64_t prefetch_bytes = 0;
  bool prefetch_spread = false;
  // Two byte ranges of ahead_bytes each (a later kernel's weights, 16-byte aligned; null:
  // none) pulled into L2 before the wait, each block a slice: the gate/up rows that the GEMV
  // after this one reads first, for a GEMV behind the decode attention.
  const void* ahead[2] = {nullptr, nullptr};
  int64_t ahead_bytes = 0;
  // 2: two warps per weight row, each half of k (kF32 output with k % 16 == 0; else 1): twice
  // the blocks, each half as long, for grids of a wave and a half (the decode QKV projection).
  int32_t warps_per_row = 1;
  // FP8 weights (w_scale non-null): w holds float8_e4m3fn codes, one byte each ([n, k], [2n, k]
  // for kGatedAct), dequantized in the kernel as code * w_scale[(row / 128) * w_scale_ld +
  // col / 128] (the 128x128 blocks of fine-grained FP8, fp8.h). Needs k % 16 == 0; one warp
  // per row.
  const float* w_scale = nullptr;
  int64_t w_scale_ld = 0;
};
int64_t gemv_blocks(int64_t n);
void launch_gemv(const GemvArgs& a, cudaStream_t stream);

// How the decode kernels launch, process-wide (benchmarks compare the settings): with pdl,
// each kernel may start while the previous one drains (programmatic dependent launch, see
// pdl.cuh); the GEMV then pulls the first gemv_prefetch_bytes of each weight row into L2 before
// it waits for its input.
// fuse_decode_rows: decode steps of at most this many sequences (<= kGemvMaxRows; 0: none)
// run the fused layer (norms, residual adds and the gated activation inside the GEMVs, QKV
// post and the split combine inside the attention kernel: 5 launches per layer).
struct LaunchTuning {
  bool pdl = true;
  int32_t gemv_prefetch_bytes = 0;  // multiple of 128, <= 4096
  int32_t fuse_decode_rows = 2;
  // Fused decode: while the attention runs (it reads little memory), the o_proj GEMV's blocks
  // pull the rest of its weight rows (past the preloaded step) into L2, and the first
  // attn_overlap_next_rows gate rows and as many up rows of the gate/up GEMV after it
  // (GemvArgs::ahead), one bulk prefetch per row or slice. Measured at batch 1 after 512: within
  // the spread of the step (4.151-4.169 ms against 4.151-4.167 without; later 4.127-4.147
  // against 4.129-4.174), 2048 rows 4.218, and 0.09 ms slower with the attention left out; off.
  bool attn_overlap_prefetch = false;
  int32_t attn_overlap_next_rows = 0;
  // The norm-scaled GEMV sums the partial sums of squares once per block, loaded before its dot
  // (off: every warp reads all of them after its dot). With gemv_gated_unroll 4 the batch-1 step
  // after 512 ran 0.02-0.04 ms faster than both off / 8 in each of three calls.
  bool gemv_norm_block = true;
  // Loads in flight per lane and weight row of the gated-activation GEMV (two rows per warp);
  // 0: gemv_unroll.
  int32_t gemv_gated_unroll = 4;
  // GemvArgs::warps_per_row of the fused decode's QKV GEMV. 2 streams the QKV shape alone
  // faster (13.30 against 13.98 us per launch) but made the batch-1 step slower in the same
  // call (4.141-4.155 ms against 4.098-4.100 with 1): 1.
  int32_t decode_qkv_warps_per_row = 1;
  // Benchmarks only, outputs wrong: 1 leaves out the fused decode's attention, 2 its lm_head
  // and argmax, 3 both (what the rest of the step costs in place).
  int32_t decode_profile_skip = 0;
  // 16-byte weight loads in flight per lane and weight row: 4, 8 or 16 (16 at one activation
  // row only). 8: with gemv_preload the fused batch-1 step was fastest at 8 (4.18 ms against
  // 4.32 at 16 after 512 tokens), though 16 streams the GEMVs alone faster (bench_cuda_llama).
  int32_t gemv_unroll = 8;
  // The GEMV loads its first step of weights (U 16-byte loads per lane and row) into registers
  // before waiting for the previous kernel, so the weight stream overlaps that kernel's tail.
  bool gemv_preload = true;
  // Steps whose tiles are all one query token (decode, not fused) run the tensor-core decode
  // kernel (warps share each key tile) instead of the 64-row flash tile; off: the old choice.
  bool decode_mma_attention = true;
  // 16-byte weight loads in flight per lane and row of the FP8 GEMV (GemvArgs::w_scale): 4, 8
  // or 16 (16 at one activation row only; two-row gated GEMVs take half).
  int32_t gemv_fp8_unroll = 8;
};
void set_launch_tuning(const LaunchTuning& t);
LaunchTuning launch_tuning();

// Fills n bf16 values uniformly in [-scale, scale] from a counter hash of (seed, index):
// weights for benchmarks, made on the device.
void launch_fill_random_bf16(uint16_t* out, int64_t n, uint64_t seed, float scale, cudaStream_t stream);
void launch_fill_f32(float* out, int64_t n, float value, cudaStream_t stream);

}  // namespace strata::cuda
