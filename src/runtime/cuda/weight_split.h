// WeightSplit: checkpoints stored wider than bf16 (f32, f16) on the bf16 GPU forward without
// losing the matrices' precision. Each matrix goes up as hi = bf16(w) (what the kernels read
// everywhere) plus lo = bf16(w - hi), which together carry 16 significant bits; every linear
// layer then sums x . hi^T + x . lo^T in f32 (Gemm::add_residual: two bf16 tensor-core GEMMs
// into one output), and the embedding rows add their lo part. The activations that are norm
// outputs (and the gated MLP activation) get the same treatment: their lo part is recomputed
// in f32 right after the kernel that wrote the bf16 hi (launch_norm_residual,
// launch_act_residual) and the GEMM adds x_lo . hi^T (Gemm::add_input_residual); the grouped
// MoE GEMM reads hi + lo of both. The error left is the KV cache's and the attention's bf16.
// Internal to backend/cuda (the loaders and steps of cuda_model.cpp and cuda_gemma4.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cuda/device_memory.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/weight_split_kernels.h"
#include "core/status.h"
#include "model/safetensors.h"
#include "runtime/cuda/cuda_model.h"

namespace strata::cuda {

class WeightSplit {
 public:
  ~WeightSplit();
  WeightSplit(const WeightSplit&) = delete;
  WeightSplit& operator=(const WeightSplit&) = delete;

  // Whether `archive` has a matrix (rank >= 2) stored as f32 or f16.
  static bool wider_than_bf16(const SafetensorsArchive& archive);
  // Whether for_checkpoint would split this checkpoint (kAuto: when wider_than_bf16); not logged.
  static bool splits(const SafetensorsArchive& archive, const CudaModelOptions& options);
  // Device bytes a split of this checkpoint takes beyond the bf16 weights (the matrices' lo
  // parts, the activation lo buffers and the f32 scratch), and the f32 KV rows' codec scratch
  // when no codecs are asked for; 0 when it would not split. For sizing the KV pool.
  static int64_t extra_bytes(const SafetensorsArchive& archive, const ModelConfig& cfg, const CudaModelOptions& options);
  // The split the options ask for on this checkpoint (kAuto: on when wider_than_bf16), logged.
  static std::unique_ptr<WeightSplit> for_checkpoint(const SafetensorsArchive& archive, const CudaModelOptions& options,
                                                     const std::string& model_type);
  bool on() const { return on_; }

  // Uploads bf16(v) into the arena and returns it; when on, also lo = bf16(v - bf16(v)) into
  // memory of its own, found again by lo_of.
  Result<uint16_t*> upload(DeviceArena& arena, const std::vector<float>& v, const std::string& what);
  const uint16_t* lo_of(const uint16_t* hi) const;
  // The lo buffer of an activation registered by attach (null when none).
  uint16_t* input_lo(const uint16_t* hi) const;

  // Once the weights are up: registers every (hi, lo) pair with the GEMM, gives it an f32
  // scratch for bf16 outputs ([max_tokens, bf16_out_width]), and takes an lo buffer [rows,
  // width] for each activation in `inputs` (hi pointer, rows, width), registered too.
  struct Input {
    const uint16_t* hi;
    int64_t rows, width;
  };
  Status attach(Gemm& gemm, int64_t max_tokens, int64_t bf16_out_width, const std::vector<Input>& inputs);
  // The f32 values of the last bf16-output GEMM (the gated MLP's gate/up rows).
  const float* scratch() const { return scratch_; }
  // Device bytes the lo parts, activation buffers and scratch take.
  int64_t bytes() const { return bytes_; }

  // After a kernel wrote `hi` (bf16 of x's norm, or of x itself when w is null): its lo part.
  void norm_lo(const float* x, const float* w, const int32_t* row_map, const uint16_t* hi, int64_t rows, int64_t dim,
               float eps, bool one_plus_w, cudaStream_t stream) const;
  // After launch_gated_act wrote `hi` [n, inter] from the gate/up GEMM's output: its lo part.
  void act_lo(const uint16_t* hi, int64_t n, int64_t inter, int32_t act, cudaStream_t stream) const;
  // After launch_embed wrote out[t] = hi_table[ids[t]] * scale: adds the table's lo rows.
  void embed_lo(const uint16_t* hi_table, const int32_t* ids, float* out, int64_t n, int64_t hidden, float scale,
                cudaStream_t stream) const;
  // `a` with the lo parts of its weights and input filled in.
  GroupedGemmArgs with_residuals(GroupedGemmArgs a) const;

 private:
  explicit WeightSplit(bool on) : on_(on) {}
  Result<void*> alloc(size_t bytes);

  bool on_ = false;
  bool split_inputs_ = true;  // CudaModelOptions::split_inputs
  std::vector<void*> allocations_;
  std::unordered_map<const uint16_t*, const uint16_t*> weights_;  // hi -> lo
  std::unordered_map<const uint16_t*, uint16_t*> inputs_;         // activation hi -> lo
  float* scratch_ = nullptr;
  int64_t bytes_ = 0;
};

// The hooks the steps call, doing nothing when `s` is null or off.
inline void split_norm_lo(const WeightSplit* s, const float* x, const float* w, const int32_t* row_map, const uint16_t* hi,
                          int64_t rows, int64_t dim, float eps, bool one_plus_w, cudaStream_t stream) {
  if (s != nullptr && s->on()) s->norm_lo(x, w, row_map, hi, rows, dim, eps, one_plus_w, stream);
}
inline void split_act_lo(const WeightSplit* s, const uint16_t* hi, int64_t n, int64_t inter, int32_t act, cudaStream_t stream) {
  if (s != nullptr && s->on()) s->act_lo(hi, n, inter, act, stream);
}
inline void split_embed_lo(const WeightSplit* s, const uint16_t* hi_table, const int32_t* ids, float* out, int64_t n,
                           int64_t hidden, float scale, cudaStream_t stream) {
  if (s != nullptr && s->on()) s->embed_lo(hi_table, ids, out, n, hidden, scale, stream);
}
inline GroupedGemmArgs split_grouped(const WeightSplit* s, const GroupedGemmArgs& a) {
  return s != nullptr && s->on() ? s->with_residuals(a) : a;
}

}  // namespace strata::cuda
