// ModelRunner: packs a StepPlan into one StepBatch (prefill chunks and decodes together, no
// padding), runs Model::forward once and hands back the logits. It owns the KV storage the
// block ids index and the recurrent-state slots; it knows nothing of requests, sampling or the
// prefix cache (the engine moves state snapshots in and out through save_state/load_state).
// It is the host StepExecutor: every logit row comes back as host logits.
#pragma once

#include <cstdint>
#include <vector>

#include "model/kv_storage.h"
#include "model/model.h"
#include "model/step_batch.h"
#include "runtime/step_executor.h"
#include "runtime/step_plan.h"

namespace strata {

class ModelRunner final : public StepExecutor {
 public:
  // n_window_blocks > 0: the sliding-window layers page in a pool of that many blocks and every
  // span carries its sequence's window_blocks. n_state_slots: recurrent-state slots (0: none).
  // `layout`: the model's kv_layout() with each layer's codec set (the storage's row formats).
  ModelRunner(Model& model, const std::vector<KvLayerSpec>& layout, int32_t n_blocks, int32_t block_size, int32_t n_window_blocks = 0,
              int32_t n_state_slots = 0);

  // Logits of the step, [rows, vocab()] f32, rows in plan order: per span every position
  // (logits_all), else its last one (sample), else none. Valid until the next run().
  const float* run(const StepPlan& plan);
  int32_t vocab() const override { return vocab_; }
  const StepBatch& last_batch() const { return batch_; }

  // Floats of one slot's recurrent state over every layer (conv then recurrent, layer order).
  int64_t state_floats() const override { return state_floats_; }
  void save_state(int32_t slot, float* dst /*[state_floats()]*/) override;
  void load_state(int32_t slot, const float* src /*[state_floats()]*/) override;
  // The KV pools the block ids index.
  KvStorage& kv_storage() { return kv_; }

  // StepExecutor: run(plan) above with every row as logits (want_logits is not needed).
  const StepRows& run(const StepPlan& plan, const std::vector<uint8_t>& want_logits,
                      std::span<const RowSample> samples) override;
  bool device_argmax() const override { return false; }
  bool verifies_drafts() const override { return true; }
  int32_t n_kv_blocks() const override { return kv_.n_blocks(); }
  // Blocks through kv_tier_io's layout (full-attention layers in their codecs).
  std::vector<int64_t> block_tensor_bytes() const override;
  void read_block(int32_t block, uint8_t* out) override;
  void write_block(int32_t block, const uint8_t* in) override;
  std::vector<int64_t> window_block_tensor_bytes() const override;
  void read_window_blocks(std::span<const int32_t> blocks, uint8_t* out) override;
  void write_window_blocks(std::span<const int32_t> blocks, const uint8_t* in) override;

 private:
  Model& model_;
  KvStorage kv_;
  bool window_paged_;
  int n_layers_;  // layers of the KV layout
  std::vector<StateLayerSpec> state_layout_;
  StateStorage state_;
  int64_t state_floats_ = 0;
  int32_t vocab_;
  StepBatch batch_;
  std::vector<float> logits_;  // [rows, vocab]
  StepRows rows_;
};

}  // namespace strata
