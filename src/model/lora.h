// LoRA adapters (PEFT layout: adapter_config.json + adapter_model.safetensors) attached at a
// family's linear roles through its weight manifest, and the per-token delta they add to a
// linear layer's output: y += scale * (x A^T) B^T for the rows of the sequences that use the
// adapter. Several adapters serve one batch: each span names its adapter's slot.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/weight.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "model/model_config.h"
#include "model/step_batch.h"
#include "model/weight_manifest.h"

namespace strata {

struct LoraLinear {
  WeightMatrix a;      // [r, n_in] f32
  WeightMatrix b;      // [n_out, r] f32
  float scale = 0.0f;  // lora_alpha / r (rsLoRA: / sqrt(r))
  bool empty() const { return a.empty(); }
};

// The linear roles an adapter may target, in a fixed order.
inline constexpr std::array<WeightRole, 7> kLoraRoles = {WeightRole::kQ,    WeightRole::kK,  WeightRole::kV,   WeightRole::kO,
                                                         WeightRole::kGate, WeightRole::kUp, WeightRole::kDown};
int lora_role_index(WeightRole role);  // index in kLoraRoles, -1 when the role takes no adapter

struct LoraAdapter {
  std::string dir;
  int32_t max_rank = 0;
  uint64_t content_hash = 0;  // of the config and the tensors: what the prefix cache is salted with
  std::vector<std::array<LoraLinear, kLoraRoles.size()>> layers;  // [n_layers]
  const LoraLinear* find(int32_t layer, WeightRole role) const;
};

// Loads the PEFT adapter in `dir` for a model of `cfg` whose manifest is `manifest` (weight
// names resolved). Every adapter tensor must land on a manifest linear of the right shape;
// what strata does not apply (DoRA, modules_to_save, bias, fan_in_fan_out, layer subsets,
// non-LoRA PEFT types, targets outside attention and dense MLP projections) is kUnsupported
// naming the field; ranks above max_rank (0: any) are refused naming the module.
Result<std::shared_ptr<const LoraAdapter>> load_lora_adapter(const std::string& dir, const ModelConfig& cfg,
                                                             const WeightManifest& manifest, int32_t max_rank = 0);

// The adapters a model serves, by slot (SeqSpan::adapter indexes it).
using LoraSlots = std::vector<std::shared_ptr<const LoraAdapter>>;

// Adds the adapters' deltas of (layer, role) to y [batch.n_tokens(), n_out] for x
// [batch.n_tokens(), n_in], span by span (spans without an adapter, or whose adapter skips
// this linear, are left alone). scratch: reused buffers.
void lora_apply(ThreadPool& pool, const StepBatch& batch, const LoraSlots& slots, int32_t layer, WeightRole role,
                const float* x, int64_t n_in, float* y, int64_t n_out, std::vector<float>& scratch);

// The adapters of one layer's linears in one step, handed to the layer functions (null: none).
struct LinearLora {
  ThreadPool* pool = nullptr;
  const StepBatch* batch = nullptr;
  const LoraSlots* slots = nullptr;
  int32_t layer = 0;
  std::vector<float>* scratch = nullptr;
  void apply(WeightRole role, const float* x, int64_t n_in, float* y, int64_t n_out) const {
    lora_apply(*pool, *batch, *slots, layer, role, x, n_in, y, n_out, *scratch);
  }
};

}  // namespace strata
