// ModelRunner: packs a StepPlan into one StepBatch (prefill chunks and decodes together, no
// padding), runs Model::forward once and hands back the logits. It owns the KV storage the
// block ids index; it knows nothing of requests, sampling or the prefix cache.
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
  ModelRunner(Model& model, int32_t n_blocks, int32_t block_size);

  // Logits of the step, [rows, vocab()] f32, rows in plan order: per span every position
  // (logits_all), else its last one (sample), else none. Valid until the next run().
  const float* run(const StepPlan& plan);
  int32_t vocab() const { return vocab_; }
  const StepBatch& last_batch() const { return batch_; }

 private:
  Model& model_;
  KvStorage kv_;
  int32_t vocab_;
  StepBatch batch_;
  std::vector<float> logits_;  // [rows, vocab]
};

}  // namespace strata
