// ModelRunner: packs a StepPlan into one StepBatch (prefill chunks and decodes together, no
// padding), runs Model::forward once and hands back the logits. It owns the KV storage the
// block ids index and the recurrent-state slots; it knows nothing of requests, sampling or the
// prefix cache (the engine moves state snapshots in and out through save_state/load_state).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/step_plan.h"
#include "model/kv_storage.h"
#include "model/model.h"
#include "model/step_batch.h"

namespace strata {

class ModelRunner {
 public:
  // n_window_blocks > 0: the sliding-window layers page in a pool of that many blocks and every
  // span carries its sequence's window_blocks. n_state_slots: recurrent-state slots (0: none).
  // `layout`: the model's kv_layout() with each layer's codec set (the storage's row formats).
  ModelRunner(Model& model, const std::vector<KvLayerSpec>& layout, int32_t n_blocks, int32_t block_size, int32_t n_window_blocks = 0,
              int32_t n_state_slots = 0);

  // Logits of the step, [rows, vocab()] f32, rows in plan order: per span every position
  // (logits_all), else its last one (sample), else none. Valid until the next run().
  const float* run(const StepPlan& plan);
  int32_t vocab() const { return vocab_; }
  const StepBatch& last_batch() const { return batch_; }

  // Floats of one slot's recurrent state over every layer (conv then recurrent, layer order).
  int64_t state_floats() const { return state_floats_; }
  void save_state(int32_t slot, float* dst /*[state_floats()]*/);
  void load_state(int32_t slot, const float* src /*[state_floats()]*/);
  // The KV pools the block ids index (the engine copies blocks to and from the lower KV tiers).
  KvStorage& kv_storage() { return kv_; }

 private:
  Model& model_;
  KvStorage kv_;
  bool window_paged_;
  std::vector<StateLayerSpec> state_layout_;
  StateStorage state_;
  int64_t state_floats_ = 0;
  int32_t vocab_;
  StepBatch batch_;
  std::vector<float> logits_;  // [rows, vocab]
};

}  // namespace strata
