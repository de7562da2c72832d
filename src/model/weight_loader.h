// WeightLoader: typed, shape-checked access to a checkpoint's tensors under a name prefix.
// Every accessor fails with an Error naming the tensor, the expected and the actual shape
// when the checkpoint disagrees with the config. Linear weights are packed for the CPU
// kernels: f32 and bf16 keep their dtype (aliasing the mapping when the layout allows),
// f16 is widened; quantized weights (model/quant.h) are dequantized to f32; vectors (norms,
// biases) are returned as f32.
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
  WeightLoader(std::shared_ptr<const SafetensorsArchive> archive, std::string prefix,
               std::shared_ptr<const QuantConfig> quant = nullptr)
      : archive_(std::move(archive)), prefix_(std::move(prefix)), quant_(std::move(quant)) {}

  // The same archive under another prefix (e.g. "" for lm_head.weight next to "model.").
  WeightLoader with_prefix(std::string prefix) const { return WeightLoader(archive_, std::move(prefix), quant_); }

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<const SafetensorsArchive>& archive() const { return archive_; }
  bool has(const std::string& name) const { return archive_->has(prefix_ + name); }

  // The tensor `prefix + name`, checked against `shape`. A quantized matrix comes back
  // dequantized to f32 (held by the archive until it goes), so a family may slice it.
  Result<const TensorInfo*> tensor(const std::string& name, const std::vector<int64_t>& shape) const;
  // A linear weight W [rows = n_out, cols = n_in]; a quantized one is dequantized to f32.
  Result<WeightMatrix> matrix(const std::string& name, int64_t rows, int64_t cols) const;
  // A 1-D tensor [n] as f32.
  Result<std::vector<float>> vector(const std::string& name, int64_t n) const;
  // Any tensor of the given shape as f32, row-major (a quantized matrix dequantized).
  Result<std::vector<float>> f32(const std::string& name, const std::vector<int64_t>& shape) const;
  // An embedding table [rows, cols], left in its checkpoint dtype (a quantized one: f32).
  Result<EmbeddingTable> embedding(const std::string& name, int64_t rows, int64_t cols) const;
  const QuantConfig* quant() const { return quant_.get(); }

 private:
  // The f32 weight of `name` when the checkpoint stores it quantized; false when it does not.
  Result<bool> dequantized(const std::string& name, int64_t rows, int64_t cols, std::vector<float>* out) const;

  std::shared_ptr<const SafetensorsArchive> archive_;
  std::string prefix_;
  std::shared_ptr<const QuantConfig> quant_;
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
