// Kernels of WeightSplit (weight_split.h): the lo parts of split embeddings and activations.
// Plain launches (no programmatic dependent launch); each is one pass over its rows.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::cuda {

// out[t, :] += lo[ids[t], :] * scale: the embedding rows' lo part on top of what launch_embed
// wrote from the hi table.
struct EmbedResidualArgs {
  const uint16_t* lo;   // [vocab, hidden] bf16
  const int32_t* ids;   // [n]
  float* out;           // [n, hidden]
  int32_t n;
  int32_t hidden;
  float scale;
};
void launch_embed_residual(const EmbedResidualArgs& a, cudaStream_t stream);

// Per row r, v = the f32 value whose bf16 rounding `hi` holds, recomputed from the residual
// stream: v = x[src] / rms(x[src]) * (w or 1 + w) (src = row_map ? row_map[r] : r), or v =
// x[src] when w is null; then lo[r] = bf16(v - hi[r]).
struct NormResidualArgs {
  const float* x;          // [rows_x, dim]
  const float* w;          // [dim] or null
  const int32_t* row_map;  // [rows] or null
  const uint16_t* hi;      // [rows, dim] bf16
  uint16_t* lo;            // [rows, dim] bf16
  int32_t rows;
  int32_t dim;
  float eps;
  int32_t one_plus_w;
};
void launch_norm_residual(const NormResidualArgs& a, cudaStream_t stream);

// lo[t, i] = bf16(act(gate[t, i]) * up[t, i] - hi[t, i]) from the f32 gate/up rows (gate then
// up, [n, 2 inter]); act 0: SiLU, 1: GELU-tanh (Act).
struct ActResidualArgs {
  const float* gate_up;  // [n, 2 inter] f32
  const uint16_t* hi;    // [n, inter] bf16
  uint16_t* lo;          // [n, inter] bf16
  int32_t n;
  int32_t inter;
  int32_t act;
};
void launch_act_residual(const ActResidualArgs& a, cudaStream_t stream);

}  // namespace strata::cuda
