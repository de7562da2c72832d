#include "engine/model_runner.h"

#include "core/check.h"

namespace strata {

ModelRunner::ModelRunner(Model& model, int32_t n_blocks, int32_t block_size)
    : model_(model), kv_(model.kv_layout(), n_blocks, block_size), vocab_(model.config().vocab_size) {}

const float* ModelRunner::run(const StepPlan& plan) {
  batch_.tokens.clear();
  batch_.seqs.resize(plan.spans.size());
  for (size_t i = 0; i < plan.spans.size(); ++i) {
    const ScheduledSpan& span = plan.spans[i];
    const Sequence& seq = *span.seq;
    STRATA_CHECK(span.pos0 + span.n_tokens <= seq.n_tokens(), "span past the sequence's tokens");
    STRATA_CHECK(int64_t(seq.blocks.size()) * kv_.block_size() >= span.pos0 + span.n_tokens,
                 "span past the sequence's blocks");
    batch_.tokens.insert(batch_.tokens.end(), seq.tokens.begin() + span.pos0,
                         seq.tokens.begin() + span.pos0 + span.n_tokens);
    SeqSpan& s = batch_.seqs[i];
    s.n_tokens = span.n_tokens;
    s.pos0 = span.pos0;
    s.block_table = seq.blocks;
    s.state_slot = -1;
    s.logits_last = span.sample;
    s.logits_all = span.logits_all;
  }
  logits_.resize(size_t(batch_.n_logit_rows()) * size_t(vocab_));
  model_.forward(batch_, kv_, nullptr, logits_.data());
  return logits_.data();
}

}  // namespace strata
