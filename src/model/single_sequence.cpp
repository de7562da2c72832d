#include "model/single_sequence.h"

namespace strata {

namespace {

int32_t blocks_for(int32_t context, int32_t block_size) { return (context + block_size - 1) / block_size; }

bool any_state(const std::vector<StateLayerSpec>& layout) {
  for (const auto& s : layout) {
    if (s.has_state) return true;
  }
  return false;
}

}  // namespace

SingleSequence::SingleSequence(Model& model, int32_t context, int32_t block_size, std::vector<KvLayerSpec> layout)
    : model_(model),
      context_(context),
      kv_(layout.empty() ? model.kv_layout() : layout, blocks_for(context, block_size), block_size),
      state_(model.state_layout(), 1),
      has_state_(any_state(model.state_layout())) {
  block_table_.resize(size_t(blocks_for(context, block_size)));
  for (size_t i = 0; i < block_table_.size(); ++i) block_table_[i] = int32_t(i);
}

void SingleSequence::reset() {
  position_ = 0;
  if (has_state_) state_.reset(0);
}

Result<std::vector<float>> SingleSequence::prefill(const std::vector<int32_t>& ids, bool want_all_logits) {
  if (ids.empty()) return make_error(ErrorCode::kInvalidArgument, "prompt is empty");
  const int64_t total = int64_t(position_) + int64_t(ids.size());
  if (total > context_) {
    return make_error(ErrorCode::kOutOfRange, "prompt of " + std::to_string(ids.size()) + " tokens (after " +
                                                  std::to_string(position_) + " cached) exceeds the context of " +
                                                  std::to_string(context_) + " tokens");
  }
  const int32_t vocab = model_.config().vocab_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return make_error(ErrorCode::kOutOfRange, "token id " + std::to_string(ids[i]) + " at index " + std::to_string(i) +
                                                    " is outside the vocabulary of " + std::to_string(vocab));
    }
  }
  StepBatch batch;
  batch.tokens = ids;
  SeqSpan span;
  span.n_tokens = int32_t(ids.size());
  span.pos0 = position_;
  const int32_t bs = kv_.block_size();
  span.block_table.assign(block_table_.begin(), block_table_.begin() + (total + bs - 1) / bs);
  span.state_slot = has_state_ ? 0 : -1;
  span.adapter = adapter_;
  span.logits_last = true;
  span.logits_all = want_all_logits;
  batch.seqs.push_back(std::move(span));
  std::vector<float> logits(size_t(batch.n_logit_rows()) * size_t(vocab));
  model_.forward(batch, kv_, has_state_ ? &state_ : nullptr, logits.data());
  position_ = int32_t(total);
  return logits;
}

Result<std::vector<float>> SingleSequence::step(int32_t id) { return prefill({id}, false); }

int32_t argmax(const float* v, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (v[i] > v[best]) best = i;
  }
  return int32_t(best);
}

}  // namespace strata
