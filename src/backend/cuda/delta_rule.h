// CUDA kernels of the gated-DeltaNet token mixer (Qwen3-Next / Qwen3.5 linear-attention layers),
// with the meaning of backend/cpu/conv1d.h and backend/cpu/delta_net.h, for a packed batch of
// sequences: sequence s owns rows [seq_start[s], seq_start[s + 1]) of the batch and state slot
// seq_slot[s] of the per-sequence state pools. A decode step is a batch of one-row sequences.
// Checked against the CPU reference in tests/gpu/gpu_delta_rule_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::cuda {

// Causal depthwise conv1d carrying the last kernel - 1 inputs of each sequence in its slot, so
// a prompt split into any calls, then one token per decode step, gives the outputs of one call.
// y[t, c] = act(bias[c] + sum_j weight[c, j] * in[t - (kernel - 1) + j, c]) with the inputs
// before the sequence's first row taken from its slot (oldest first); act is SiLU or identity.
struct DeltaConvArgs {
  const void* x;             // [n_rows, x_stride] f32, or bf16 bits when x_bf16; channels at [0, channels)
  int64_t x_stride;          // elements between rows of x (>= channels)
  float* y;                  // [n_rows, channels]; must not alias x
  float* state;              // [n_slots, kernel - 1, channels] carried inputs, updated in place
  const float* weight;       // [channels, kernel]; tap kernel - 1 multiplies the current row
  const float* bias;         // [channels] or null
  const int32_t* seq_start;  // [n_seqs + 1] device: first row of each sequence, then the row count
  const int32_t* seq_slot;   // [n_seqs] device: state slot of each sequence
  int32_t n_seqs;
  int32_t max_seq_rows;      // >= the longest sequence's row count (sizes the grid)
  int32_t channels;
  int32_t kernel;            // 1..8
  int32_t x_bf16 = 0;
  int32_t silu = 1;
};
void launch_delta_conv1d(const DeltaConvArgs& a, cudaStream_t stream);

// Gated delta rule. Per sequence and value head h the slot holds S [d_k, d_v] (f32); per row,
// with q and k l2-normalized (the caller's job) and q scaled by `scale`:
//   S <- exp(g) S;   u = beta (v - S^T k);   S <- S + k u^T;   o = S^T q
// Query/key head h / (n_v_heads / n_k_heads) serves value head h.
struct DeltaRuleArgs {
  const void* q;             // [n_rows, n_k_heads, d_k] at q + row * qkv_stride; f32, or bf16 bits when in_bf16
  const void* k;             // [n_rows, n_k_heads, d_k] at k + row * qkv_stride
  const void* v;             // [n_rows, n_v_heads, d_v] at v + row * qkv_stride
  int64_t qkv_stride;        // elements between rows of q, k and v
  const float* g;            // [n_rows, n_v_heads] log decay (<= 0)
  const float* beta;         // [n_rows, n_v_heads]
  float* state;              // [n_slots, n_v_heads, d_k, d_v] updated in place
  float* out;                // [n_rows, n_v_heads, d_v]
  const int32_t* seq_start;  // [n_seqs + 1] device
  const int32_t* seq_slot;   // [n_seqs] device
  const int32_t* seq_pos0;   // [n_seqs] device: absolute position of each sequence's first row (chunk
                             // boundaries sit at multiples of the chunk size); read by the chunked form
  int32_t n_seqs;
  int32_t n_k_heads;         // divides n_v_heads
  int32_t n_v_heads;
  int32_t d_k;               // <= 256
  int32_t d_v;
  float scale;
  int32_t in_bf16 = 0;
  // [n_seqs] device, or null: one past the last row of each sequence (null: seq_start[s + 1]).
  // With it the sequences need not tile the rows: a decoder runs the pieces of its spans that
  // take one form in one launch and leaves the others out. A sequence with no rows is skipped
  // (its slot untouched), so a list padded with empty entries keeps its launch shape.
  const int32_t* seq_end = nullptr;
};

// Row by row (decode; also any span). One block per (sequence, value head, 32 columns of d_v):
// the block keeps its state columns in registers across the sequence's rows.
void launch_gated_delta_rule_recurrent(const DeltaRuleArgs& a, cudaStream_t stream);

// Prefill: blocks of kDeltaChunk positions aligned to absolute positions, as in
// backend/cpu/delta_net_body.inc (R = V - diag(e^G) K S0, U = (I + A)^-1 diag(beta) R,
// O = diag(e^G) Q S0 + (D o Q K^T) U, S = e^{G_L} S0 + (diag(e^{G_L - G}) K)^T U), the state
// carried across blocks. One block per (sequence, value head, 32 columns of d_v). Returns
// cudaErrorInvalidValue (launching nothing) when d_k is out of range.
constexpr int32_t kDeltaChunk = 64;
cudaError_t launch_gated_delta_rule_chunked(const DeltaRuleArgs& a, cudaStream_t stream);

}  // namespace strata::cuda
