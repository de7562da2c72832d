// CPU kernels. Every function here has a plain scalar twin with the same meaning in
// backend/reference/reference_ops.h and a parity test in tests/kernel.
//
// Determinism contract: the value of an output row never depends on how many rows share the
// call, on the thread count, or on the row's place in the batch: each output element is
// reduced in one fixed order. Batching and chunked prefill therefore cannot change a token.
//
// Activations are f32. Shapes are row-major and written next to each argument.
#pragma once

#include <cstdint>

#include "backend/weight.h"
#include "core/thread_pool.h"

namespace strata::cpu {

// Which SIMD level the dispatcher picked ("avx512bf16", "avx512", "avx2", "scalar").
const char* simd_level_name();

// Repack a checkpoint matrix W [rows, cols] (row-major, dtype f32/bf16/f16) for matmul.
// The returned matrix owns its memory (or, for a layout equal to the source, may alias
// `src` when `alias_ok`: the caller guarantees `src` outlives it, e.g. an mmap).
WeightMatrix pack_weight(DType src_dtype, const void* src, int64_t rows, int64_t cols, bool alias_ok = false);

// A quantized matrix W [rows, cols] for pack_quant_weight: row-major codes, one per byte
// (kAffine4: 0..15), and per-(row, group) scales and biases [rows, ceil(cols / group)] f32.
// W[r, c] = fma(codes[r, c], scales[r, g], biases[r, g]) (affine), e4m3fn(codes[r, c]) *
// scales[r, g] (kFp8, biases null), g = c / group.
struct QuantWeightSource {
  WeightQuant quant = WeightQuant::kNone;
  const uint8_t* codes = nullptr;  // [rows, cols]
  const float* scales = nullptr;   // [rows, n_groups]
  const float* biases = nullptr;   // [rows, n_groups] or null (kFp8)
  int32_t group = 0;               // inputs per group (even for kAffine4)
};
// Packs it for matmul, which then dequantizes inside the kernels (the matrix owns its memory).
WeightMatrix pack_quant_weight(const QuantWeightSource& src, int64_t rows, int64_t cols);
// Bytes a packed matrix holds (codes, scales and biases; panel padding included).
int64_t weight_bytes(const WeightMatrix& w);
// Bytes pack_quant_weight makes for a matrix [rows, cols] of kind `quant` and group size `group`.
int64_t quant_weight_bytes(WeightQuant quant, int64_t rows, int64_t cols, int64_t group);

// Row `row` of a matrix made by pack_weight (or a plain row-major one, layout 0), widened to
// f32: out[w.cols]. Lets an embedding table tied to the lm head be looked up from the packed copy.
// A quantized matrix's row is dequantized as matmul reads it.
void weight_row(const WeightMatrix& w, int64_t row, float* out);

// y[m, n] = x[m, k] · W[n, k]^T (+ bias[n] when bias != nullptr). k == w.cols, n == w.rows.
// A quantized W is dequantized in the kernel, each element as reference::quant_matmul does.
void matmul(ThreadPool& pool, const float* x, int64_t m, const WeightMatrix& w, const float* bias, float* y);

// y[r, :] = x[r, :] / rms(x[r, :]) * (w or 1 + w), per row; y may alias x.
void rms_norm(ThreadPool& pool, const float* x /*[rows, dim]*/, const float* w /*[dim] or null*/,
              float* y /*[rows, dim]*/, int64_t rows, int64_t dim, float eps, bool one_plus_w);

// out[i] = silu(gate[i]) * up[i]  or  gelu_tanh(gate[i]) * up[i].
enum class Activation { kSilu, kGeluTanh };
void gated_act(ThreadPool& pool, const float* gate, const float* up, float* out, int64_t n, Activation act);

// Element-wise helpers. out may alias an input.
void add(ThreadPool& pool, const float* a, const float* b, float* out, int64_t n);  // out = a + b
void mul(ThreadPool& pool, const float* a, const float* b, float* out, int64_t n);  // out = a * b
// out[i] = silu(x[i]) or gelu_tanh(x[i]) (un-gated MLPs).
void activation(ThreadPool& pool, const float* x, float* out, int64_t n, Activation act);
// Row-wise softmax: y[r, :] = exp(x[r, :] - max) / sum; y may alias x.
void softmax(ThreadPool& pool, const float* x /*[rows, dim]*/, float* y /*[rows, dim]*/, int64_t rows, int64_t dim);

// Rotary embedding in place on x [n_tokens, n_heads, head_dim], rotating the first
// `rot_dim` dims of each head (rot_dim <= head_dim, even) in the half-split (NeoX / HF) layout:
// pairs (i, i + rot_dim/2). inv_freq [rot_dim/2]: per-pair frequency (scaling already applied);
// positions [n_tokens]; attn_factor multiplies cos and sin (yarn's mscale).
void rope(ThreadPool& pool, float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t rot_dim,
          const int32_t* positions, const float* inv_freq, float attn_factor);

// Paged attention for one sequence. Keys/values of positions [0, pos0 + n_q) are already in
// the pool; query token t sits at position pos0 + t and sees keys at positions p with
// p <= pos0 + t and (window == 0 || pos0 + t - p < window).
struct PagedAttentionArgs {
  const float* q;              // [n_q, n_heads, head_dim]
  float* out;                  // [n_q, n_heads, head_dim_v]
  const float* k_pool;         // [n_blocks_pool, block_size, n_kv_heads, head_dim]
  const float* v_pool;         // [n_blocks_pool, block_size, n_kv_heads, head_dim_v]
  const int32_t* block_table;  // [ceil((pos0 + n_q) / block_size)] block ids into the pools
  int32_t block_size;          // tokens per block
  int32_t n_q;                 // query tokens
  int32_t pos0;                // position of the first query token
  int32_t n_heads;
  int32_t n_kv_heads;          // n_heads % n_kv_heads == 0 (GQA)
  int32_t head_dim;
  int32_t head_dim_v;
  float scale;                 // multiplies q·k
  float softcap;               // 0: none; else logits = softcap * tanh(logits / softcap)
  int32_t window;              // 0: full causal
};
void paged_attention(ThreadPool& pool, const PagedAttentionArgs& a);

}  // namespace strata::cpu
