// The model's head: gathers the final hidden rows that produce logits, in
// StepBatch::n_logit_rows() order, then final RMSNorm, LM head and final soft-cap.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/weight.h"
#include "core/thread_pool.h"
#include "model/step_batch.h"

namespace strata {

struct LmHeadWeights {
  const std::vector<float>* final_norm;  // [hidden]
  float eps;
  bool one_plus_w;                       // (1 + w) RMSNorm (Gemma, Qwen3-Next)
  const WeightMatrix* lm_head;           // [vocab, hidden]
  float final_softcap;                   // 0: none
  bool hidden_output = false;            // write the normed rows, not logits (pooling models)
};

// x: [batch.n_tokens(), hidden]; rows: scratch; logits: [batch.n_logit_rows(), vocab], or
// [batch.n_logit_rows(), hidden] with hidden_output.
void lm_head_forward(ThreadPool& pool, const StepBatch& batch, const float* x, int64_t hidden, const LmHeadWeights& w,
                     std::vector<float>& rows, float* logits);

}  // namespace strata
