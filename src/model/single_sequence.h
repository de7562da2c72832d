// SingleSequence: one sequence run through a Model with its own KV cache (sized for
// `context` tokens) and one recurrent-state slot. The prompt is prefilled in one forward;
// each decode step is one token through the cache. For tests, the CLI and tools; the engine
// drives models through its own block pool instead.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/kv_storage.h"
#include "model/model.h"

namespace strata {

class SingleSequence {
 public:
  // block_size: tokens per KV block. layout: the KV layout with each layer's codec (empty: the
  // model's kv_layout(), exact KV).
  SingleSequence(Model& model, int32_t context, int32_t block_size = 16, std::vector<KvLayerSpec> layout = {});

  int32_t context() const { return context_; }
  int32_t position() const { return position_; }  // tokens cached so far
  int32_t vocab() const { return model_.config().vocab_size; }

  // Runs on the model's LoRA slot `slot` (Model::add_lora); -1: the base weights.
  void set_adapter(int32_t slot) { adapter_ = slot; }
  // Forgets the sequence (cache positions and recurrent state).
  void reset();
  // Appends `ids` in one forward. Logits: [ids.size(), vocab] when want_all_logits, else the
  // last token's [vocab]. Errors: empty prompt, an id outside the vocabulary, or a total past
  // the context.
  Result<std::vector<float>> prefill(const std::vector<int32_t>& ids, bool want_all_logits = false);
  // Appends one token; returns its logits [vocab].
  Result<std::vector<float>> step(int32_t id);

 private:
  Model& model_;
  int32_t context_;
  int32_t position_ = 0;
  int32_t adapter_ = -1;
  KvStorage kv_;
  StateStorage state_;
  bool has_state_ = false;
  std::vector<int32_t> block_table_;
};

// Index of the largest value (lowest index wins ties).
int32_t argmax(const float* v, int64_t n);

}  // namespace strata
