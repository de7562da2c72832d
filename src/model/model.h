// Model: one architecture family's forward pass over a packed StepBatch.
// A model owns its weights and nothing of the request, the scheduler or the KV block pool.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/kv_storage.h"
#include "model/lora.h"
#include "model/model_config.h"
#include "model/step_batch.h"

namespace strata {

class Model {
 public:
  virtual ~Model() = default;

  const ModelConfig& config() const { return config_; }
  // Per-layer KV needs and per-layer recurrent state needs.
  virtual std::vector<KvLayerSpec> kv_layout() const = 0;
  virtual std::vector<StateLayerSpec> state_layout() const { return std::vector<StateLayerSpec>(config_.n_layers); }

  // Runs the batch: appends each span's K/V at positions [pos0, pos0 + n_tokens) through its
  // block table, advances recurrent state, and writes logits [batch.n_logit_rows(), vocab]
  // (f32, final soft-cap applied) in the order StepBatch::n_logit_rows() defines.
  virtual void forward(const StepBatch& batch, KvStorage& kv, StateStorage* state, float* logits) = 0;

  // LoRA: reads the PEFT adapter in `dir` for this model (kUnsupported for families that take
  // none yet), and serves it from a slot spans name (SeqSpan::adapter). Slots are added before
  // the model runs steps and never removed.
  virtual Result<std::shared_ptr<const LoraAdapter>> load_lora(const std::string& dir, int32_t max_rank) const {
    (void)dir;
    (void)max_rank;
    return make_error(ErrorCode::kUnsupported, "LoRA adapters are not supported for " + config_.model_type + " models yet");
  }
  int32_t add_lora(std::shared_ptr<const LoraAdapter> a) {
    lora_.push_back(std::move(a));
    return int32_t(lora_.size()) - 1;
  }
  // Installs (or with null clears) slot `slot`, growing the slots as needed.
  void set_lora(int32_t slot, std::shared_ptr<const LoraAdapter> a) {
    if (size_t(slot) >= lora_.size()) lora_.resize(size_t(slot) + 1);
    lora_[size_t(slot)] = std::move(a);
  }
  const LoraSlots& lora_slots() const { return lora_; }

 protected:
  explicit Model(ModelConfig config, ThreadPool& pool) : config_(std::move(config)), pool_(pool) {}
  ModelConfig config_;
  ThreadPool& pool_;
  LoraSlots lora_;
};

}  // namespace strata
