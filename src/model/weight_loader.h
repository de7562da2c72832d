// WeightLoader: typed, shape-checked access to a checkpoint's tensors under a name prefix.
// Every accessor fails with an Error naming the tensor, the expected and the actual shape
// when the checkpoint disagrees with the config. Linear weights are packed for the CPU
// kernels: f32 and bf16 keep their dtype (aliasing the mapping when the layout allows),
// f16 is widened; quantized weights (model/quant.h) are dequantized to f32, or, for a loader
// made with `quantized_in_memory` (the CPU model's), kept quantized where the format maps onto
// the CPU's quantized matrices; vectors (norms, biases) are returned as f32.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/weight.h"
#include "core/status.h"
#include "model/layers/embedding.h"
#include "model/layers/mlp.h"
#include "model/quant_config.h"
#include "model/safetensors.h"

namespace strata {

class WeightLoader {
 public:
  // `quant`: the checkpoint's quantized-weight format (model_config.h), null or kNone for none.
  // `quantized_in_memory`: matrix() and embedding() return a quantized weight as the CPU's
  // quantized WeightMatrix (model/quant.h quantized_weight) instead of its f32 dequantization.
  WeightLoader(std::shared_ptr<const SafetensorsArchive> archive, std::string prefix,
               std::shared_ptr<const QuantConfig> quant = nullptr, bool quantized_in_memory = false)
      : archive_(std::move(archive)), prefix_(std::move(prefix)), quant_(std::move(quant)),
        quantized_in_memory_(quantized_in_memory) {}

  // The same archive under another prefix (e.g. "" for lm_head.weight next to "model.").
  WeightLoader with_prefix(std::string prefix) const {
    return WeightLoader(archive_, std::move(prefix), quant_, quantized_in_memory_);
  }

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<const SafetensorsArchive>& archive() const { return archive_; }
  bool has(const std::string& name) const { return archive_->has(prefix_ + name); }

  // The tensor `prefix + name`, checked against `shape`. A quantized matrix comes back
  // dequantized to f32 (held by the archive until it goes), so a family may slice it.
  Result<const TensorInfo*> tensor(const std::string& name, const std::vector<int64_t>& shape) const;
  // A linear weight W [rows = n_out, cols = n_in]; a quantized one is dequantized to f32 (or
  // kept quantized, see the constructor).
  Result<WeightMatrix> matrix(const std::string& name, int64_t rows, int64_t cols) const;
  // A 1-D tensor [n] as f32.
  Result<std::vector<float>> vector(const std::string& name, int64_t n) const;
  // Any tensor of the given shape as f32, row-major (a quantized matrix dequantized).
  Result<std::vector<float>> f32(const std::string& name, const std::vector<int64_t>& shape) const;
  // An embedding table [rows, cols], left in its checkpoint dtype (a quantized one: f32, or kept
  // quantized and dequantized per looked-up row).
  Result<EmbeddingTable> embedding(const std::string& name, int64_t rows, int64_t cols) const;
  const QuantConfig* quant() const { return quant_.get(); }
  bool quantized_in_memory() const { return quantized_in_memory_; }

 private:
  // The quantized CPU matrix of `name`; empty when it stays a float matrix.
  Result<WeightMatrix> kept_quantized(const std::string& name, int64_t rows, int64_t cols) const;
  // The f32 weight of `name` when the checkpoint stores it quantized; false when it does not.
  Result<bool> dequantized(const std::string& name, int64_t rows, int64_t cols, std::vector<float>* out) const;

  std::shared_ptr<const SafetensorsArchive> archive_;
  std::string prefix_;
  std::shared_ptr<const QuantConfig> quant_;
  bool quantized_in_memory_ = false;
};

// Packs a row-major matrix of the checkpoint (f32, bf16 or f16) for matmul; `src` must stay
// mapped while the result lives (the model keeps its archive).
Result<WeightMatrix> pack_checkpoint_matrix(const TensorInfo& t, const void* src, int64_t rows, int64_t cols);
// Converts n elements of a checkpoint dtype to f32.
Status convert_to_f32(const TensorInfo& t, const void* src, int64_t n, float* out);

// Moves a loaded value into *out, or returns the load's error.
template <class T>
Status take(Result<T> r, T* out) {
  if (!r.ok()) return r.error();
  *out = std::move(*r);
  return Status();
}

// {gate,up,down}_proj.weight (and .bias when `bias`) under prefix `p` of a gated MLP with
// hidden size `hidden` and intermediate size `inter` (> 0).
Status load_gated_mlp(const WeightLoader& w, const std::string& p, int64_t hidden, int64_t inter, bool bias,
                      GatedMlpWeights* m);

}  // namespace strata
