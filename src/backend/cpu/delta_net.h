// Gated DeltaNet kernels (Qwen3-Next / Qwen3.5 linear-attention layers).
//
// Per value head h the layer keeps a state S [d_k, d_v]. For each token, with q and k
// l2-normalized and q scaled by `scale`:
//   S <- exp(g) * S;   u = beta * (v - S^T k);   S <- S + k u^T;   o = S^T q
// Query/key head h / (n_v_heads / n_k_heads) serves value head h (grouped value heads).
// The recurrent form runs this token by token; the chunked form computes the same thing
// for blocks of tokens with matrix products and one state update per block.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace strata::cpu {

// x <- x / sqrt(sum(x^2) + eps) for each head vector (eps inside the root, as in FLA).
void l2_norm_heads(ThreadPool& pool, float* x /*[n_tokens, token_stride], heads at [0, n_heads * dim)*/,
                   int64_t n_tokens, int64_t n_heads, int64_t dim, int64_t token_stride, float eps);

// g = -exp(a_log) * softplus(a + dt_bias) (log decay per token and head, <= 0), beta = sigmoid(b).
void delta_net_gates(const float* a /*[n_tokens, ab_stride]*/, const float* b /*[n_tokens, ab_stride]*/,
                     int64_t ab_stride, const float* a_log /*[n_heads]*/, const float* dt_bias /*[n_heads]*/,
                     float* g /*[n_tokens, n_heads]*/, float* beta /*[n_tokens, n_heads]*/, int64_t n_tokens,
                     int64_t n_heads);

struct GatedDeltaRuleArgs {
  const float* q;      // [n_tokens, n_k_heads, d_k] at q + t * qkv_stride, l2-normalized, unscaled
  const float* k;      // [n_tokens, n_k_heads, d_k] at k + t * qkv_stride, l2-normalized
  const float* v;      // [n_tokens, n_v_heads, d_v] at v + t * qkv_stride
  int64_t qkv_stride;  // floats between consecutive tokens of q, k and v
  const float* g;      // [n_tokens, n_v_heads] log decay
  const float* beta;   // [n_tokens, n_v_heads]
  float* state;        // [n_v_heads, d_k, d_v] carried state, updated in place
  float* out;          // [n_tokens, n_v_heads, d_v]
  int32_t n_tokens;
  int32_t n_k_heads;   // divides n_v_heads
  int32_t n_v_heads;
  int32_t d_k;
  int32_t d_v;
  int32_t pos0;        // position of the first token; chunk boundaries sit at multiples of the chunk size
  float scale;         // multiplies q (1 / sqrt(d_k))
};

// Token by token (the decode form); threads over value heads.
void gated_delta_rule_recurrent(ThreadPool& pool, const GatedDeltaRuleArgs& a);
// The delta rule's block: the chunked form groups absolute positions [64 k, 64 k + 64).
constexpr int32_t kDeltaChunk = 64;
// Blocks of `chunk` positions (aligned to absolute positions) as matrix products, the
// within-block recurrence solved by a triangular inverse (the WY / UT-transform form of the
// prefill); threads over value heads. Equal to the recurrent form up to f32 rounding.
void gated_delta_rule_chunked(ThreadPool& pool, const GatedDeltaRuleArgs& a, int32_t chunk = kDeltaChunk);
// A piece that starts at its block's beginning and covers at least this many of its rows takes
// the chunked form in gated_delta_rule.
constexpr int32_t kChunkedMinTokens = 16;
// The layer's entry point. The form is chosen per absolute block of kDeltaChunk positions, from
// which rows of that block the call covers and nothing else: rows from the block's start on,
// kChunkedMinTokens or more of them, run chunked (prefill); a piece that starts mid-block or
// covers fewer rows runs recurrent (decode, verify spans). So a block covered from its start to
// the same end gets the same bits whatever the call's span, and the recurrent pieces, token by
// token, do not depend on how they are split.
void gated_delta_rule(ThreadPool& pool, const GatedDeltaRuleArgs& a);

// y = rms_norm(x) * w * silu(z), per head vector of `dim` (the DeltaNet output norm; plain w).
void gated_rms_norm(ThreadPool& pool, const float* x /*[n_tokens, n_heads, dim]*/,
                    const float* z /*[n_tokens, z_stride], heads at [0, n_heads * dim)*/, int64_t z_stride,
                    const float* w /*[dim]*/, float* y /*[n_tokens, n_heads, dim], may alias x*/, int64_t n_tokens,
                    int64_t n_heads, int64_t dim, float eps);

}  // namespace strata::cpu
