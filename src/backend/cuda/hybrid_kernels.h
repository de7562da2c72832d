// Kernels the gated-DeltaNet hybrids (qwen3_next, qwen3_5_text, qwen3_5_moe_text; cuda_hybrid.cpp)
// add to the decoder around the delta rule of delta_rule.h: zeroing the state slots of sequences
// that start, the l2 norm of the q/k heads, the decay and write-strength gates, the gated
// RMSNorm of the DeltaNet output, the sigmoid output gate of the full-attention layers and the
// shared expert's gated add. Same conventions as kernels.h; the arithmetic is that of
// backend/cpu/delta_net.h and model/qwen3_next.cpp (checked through the reference goldens in
// tests/gpu/gpu_hybrid_test.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::cuda {

// For every sequence s with reset[s] != 0, zeroes its slot in every listed pool: pool p holds
// floats[p] floats per slot, slot k at pools[p] + k * floats[p].
struct StateResetArgs {
  float* const* pools;    // [n_pools] device array of device pointers
  const int64_t* floats;  // [n_pools] device
  const int32_t* slot;    // [n_seqs] device
  const int32_t* reset;   // [n_seqs] device: 1 = zero this sequence's slot
  int32_t n_pools;
  int32_t n_seqs;
};
void launch_state_reset(const StateResetArgs& a, cudaStream_t stream);

// x <- x / sqrt(sum(x^2) + eps) per head vector of dim floats, heads at [0, n_heads * dim) of
// each row (the q and k heads of the conv output), in place.
struct L2NormHeadsArgs {
  float* x;            // [n, row_stride]
  int32_t n;
  int32_t row_stride;
  int32_t n_heads;
  int32_t dim;         // <= 1024
  float eps;
};
void launch_l2_norm_heads(const L2NormHeadsArgs& a, cudaStream_t stream);

// g[t, h] = -exp(a_log[h]) * softplus(a[t, h] + dt_bias[h]) (softplus(x) = x past 20);
// beta[t, h] = sigmoid(b[t, h]).
struct DeltaGatesArgs {
  const float* a;        // [n, ab_stride] at column 0 (in_proj's a rows)
  const float* b;        // [n, ab_stride] at column 0 (in_proj's b rows)
  int32_t ab_stride;
  const float* a_log;    // [n_heads]
  const float* dt_bias;  // [n_heads]
  float* g;              // [n, n_heads]
  float* beta;           // [n, n_heads]
  int32_t n;
  int32_t n_heads;
};
void launch_delta_gates(const DeltaGatesArgs& a, cudaStream_t stream);

// out[t, h, :] = bf16(x[t, h, :] / rms(x[t, h, :]) * w * silu(z[t, h, :])) (plain w); with
// out_lo, also out_lo = bf16(value - out) (the part the rounding lost: split weights,
// weight_split.h).
struct GatedRmsNormArgs {
  const float* x;   // [n, n_heads, dim]
  const float* z;   // [n, z_stride], heads at [0, n_heads * dim)
  int32_t z_stride;
  const float* w;   // [dim]
  uint16_t* out;    // [n, n_heads, dim] bf16
  int32_t n;
  int32_t n_heads;
  int32_t dim;      // <= 1024
  float eps;
  uint16_t* out_lo = nullptr;  // [n, n_heads, dim] bf16 or null
};
void launch_gated_rms_norm(const GatedRmsNormArgs& a, cudaStream_t stream);

// x[i] = bf16(x[i] * sigmoid(gate[i])) for i < n (the gated attention's output gate); with lo,
// also lo[i] = bf16(value - x[i]).
void launch_sigmoid_gate(uint16_t* x, const float* gate, int64_t n, uint16_t* lo, cudaStream_t stream);

// Per row t: branch[t] += sigmoid(h[t] . gate_w) * shared[t] (the shared expert added to the
// routed experts' sum, scaled by its gate).
struct SharedExpertAddArgs {
  float* branch;         // [n, hidden]
  const float* shared;   // [n, hidden]
  const uint16_t* h;     // [n, hidden] bf16 (the FFN input)
  const float* gate_w;   // [hidden] shared_expert_gate
  int32_t n;
  int32_t hidden;
  const uint16_t* h_lo = nullptr;  // [n, hidden] bf16 or null: h's rounding residual, added to h
};
void launch_shared_expert_add(const SharedExpertAddArgs& a, cudaStream_t stream);

// hi[t, i] = bf16(act(gate_up[t, i]) * gate_up[t, inter + i]) from f32 gate/up rows (the routed
// experts' first grouped GEMM with f32 output), and lo[t, i] = bf16(value - hi[t, i]) when lo is
// given: the experts' activation with its rounding residual (split weights).
struct GatedActSplitArgs {
  const float* gate_up;  // [n, 2 inter] f32: gate then up
  uint16_t* hi;          // [n, inter] bf16
  uint16_t* lo;          // [n, inter] bf16 or null
  int32_t n;
  int32_t inter;
  int32_t act;           // Act (kernels.h)
};
void launch_gated_act_split(const GatedActSplitArgs& a, cudaStream_t stream);

}  // namespace strata::cuda
