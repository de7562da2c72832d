// Kernels some decoder families add to the plain layer (kernels.h): Gemma 2/3's sandwich norm on
// a branch output before the residual add, the final logit soft-cap, and Gemma 4's value norm,
// per-layer inputs, scaled residual and two-branch FFN sum. Same conventions as kernels.h;
// checked against plain host loops in tests/gpu/gpu_moe_test.cpp. The Gemma 4 norms are plain
// (x / rms(x) * w, or no weight where w is null).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::cuda {

// Per row r: b = branch[r] (+ branch_bias); x[r] += rms_norm(b) * branch_w (the branch's own
// output norm: Gemma's post_attention / post_feedforward layernorm); then
// out[r] = bf16(rms_norm(x[r]) * w). Norm weights are (1 + w) when one_plus_w.
struct SandwichAddNormArgs {
  float* x;                  // [rows, dim] residual stream, updated in place
  const float* branch;       // [rows, dim]
  const float* branch_bias;  // [dim] or null
  const float* branch_w;     // [dim]
  const float* w;            // [dim]
  uint16_t* out;             // [rows, dim] bf16
  int32_t rows;
  int32_t dim;
  float eps;
  int32_t one_plus_w;
};
void launch_sandwich_add_norm(const SandwichAddNormArgs& a, cudaStream_t stream);

// v[i] = cap * tanh(v[i] / cap) for i < n (cap > 0).
void launch_softcap(float* v, int64_t n, float cap, cudaStream_t stream);

// Per token t and head h, in place: x[t * row_stride + col0 + h * head_dim + i] is RMSNormed
// over the head (times w[i] when w is given): Gemma 4's value norm inside the QKV output.
struct HeadRmsNormArgs {
  float* x;            // [n, row_stride]
  const float* w;      // [head_dim] or null
  int32_t n;
  int32_t row_stride;  // floats per token
  int32_t col0;        // first float of head 0 in a row
  int32_t n_heads;
  int32_t head_dim;
  float eps;
};
void launch_head_rms_norm(const HeadRmsNormArgs& a, cudaStream_t stream);

// Gemma 4 per-layer inputs, per row r of dim floats (r over tokens x layers):
// ctx[r] = (rms_norm(ctx[r] * scale) * w + tok[r]) * 2^-0.5, in place.
struct PleCombineArgs {
  float* ctx;        // [rows, dim] per_layer_model_projection(x), becomes the per-layer inputs
  const float* tok;  // [rows, dim] embed_tokens_per_layer rows (already scaled)
  const float* w;    // [dim] per_layer_projection_norm
  int32_t rows;
  int32_t dim;
  float scale;       // hidden^-0.5
  float eps;
};
void launch_ple_combine(const PleCombineArgs& a, cudaStream_t stream);

// out[t, i] = bf16(act(gate[t, i]) * ple[t * ple_stride + i]) for i < dim (ple points at the
// layer's slice of the per-layer inputs).
struct PleGateArgs {
  const float* gate;   // [n, dim]
  const float* ple;    // [n, ple_stride]
  uint16_t* out;       // [n, dim] bf16
  int32_t n;
  int32_t dim;
  int32_t ple_stride;
  int32_t act;         // Act (kernels.h)
};
void launch_ple_gate(const PleGateArgs& a, cudaStream_t stream);

// Per row r: x[r] = (x[r] + rms_norm(branch[r]) * branch_w) * scale; then, when out is given,
// out[r] = bf16(rms_norm(x[r]) * w), or bf16(x[r]) itself when w is null.
struct ScaledResidualArgs {
  float* x;              // [rows, dim] residual stream
  const float* branch;   // [rows, dim]
  const float* branch_w; // [dim]
  float scale;
  const float* w;        // [dim] or null
  uint16_t* out;         // [rows, dim] bf16 or null
  int32_t rows;
  int32_t dim;
  float eps;
};
void launch_scaled_residual(const ScaledResidualArgs& a, cudaStream_t stream);

// Per row r: out[r] = rms_norm(a[r]) * wa + rms_norm(b[r]) * wb (out may be a): Gemma 4's dense
// MLP output beside the experts' output.
struct NormSumArgs {
  const float* a;   // [rows, dim]
  const float* wa;  // [dim]
  const float* b;   // [rows, dim]
  const float* wb;  // [dim]
  float* out;       // [rows, dim]
  int32_t rows;
  int32_t dim;
  float eps;
};
void launch_norm_sum(const NormSumArgs& a, cudaStream_t stream);

// out[i] = bf16(x[i]) for i < n.
void launch_to_bf16(const float* x, uint16_t* out, int64_t n, cudaStream_t stream);

}  // namespace strata::cuda
