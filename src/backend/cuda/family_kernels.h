// Kernels some decoder families add to the plain layer (kernels.h): Gemma 2/3's sandwich norm on
// a branch output before the residual add, and the final logit soft-cap. Same conventions as
// kernels.h; checked against plain host loops in tests/gpu/gpu_moe_test.cpp.
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

}  // namespace strata::cuda
