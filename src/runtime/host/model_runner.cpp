#include "runtime/host/model_runner.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"
#include "runtime/host/kv_block_bytes.h"

namespace strata {

ModelRunner::ModelRunner(Model& model, const std::vector<KvLayerSpec>& layout, int32_t n_blocks,
                         int32_t block_size, int32_t n_window_blocks, int32_t n_state_slots)
    : model_(model),
      kv_(layout, n_blocks, block_size, n_window_blocks > 0 ? n_window_blocks : -1),
      window_paged_(n_window_blocks > 0),
      n_layers_(int(layout.size())),
      state_layout_(model.state_layout()),
      vocab_(model.config().output_width()) {
  for (const auto& s : state_layout_) {
    if (s.has_state) state_floats_ += s.conv_floats + s.recurrent_floats;
  }
  if (state_floats_ > 0) state_ = StateStorage(state_layout_, n_state_slots);
}

void ModelRunner::save_state(int32_t slot, float* dst) {
  for (size_t l = 0; l < state_layout_.size(); ++l) {
    const StateLayerSpec& s = state_layout_[l];
    if (!s.has_state) continue;
    dst = std::copy_n(state_.conv(int(l), slot), s.conv_floats, dst);
    dst = std::copy_n(state_.recurrent(int(l), slot), s.recurrent_floats, dst);
  }
}

void ModelRunner::load_state(int32_t slot, const float* src) {
  for (size_t l = 0; l < state_layout_.size(); ++l) {
    const StateLayerSpec& s = state_layout_[l];
    if (!s.has_state) continue;
    std::copy_n(src, s.conv_floats, state_.conv(int(l), slot));
    src += s.conv_floats;
    std::copy_n(src, s.recurrent_floats, state_.recurrent(int(l), slot));
    src += s.recurrent_floats;
  }
}

const float* ModelRunner::run(const StepPlan& plan) {
  batch_.tokens.clear();
  batch_.seqs.resize(plan.spans.size());
  for (size_t i = 0; i < plan.spans.size(); ++i) {
    const ScheduledSpan& span = plan.spans[i];
    const Sequence& seq = *span.seq;
    const int64_t end = int64_t(span.pos0) + span.n_tokens;
    STRATA_CHECK(end <= seq.n_tokens(), "span past the sequence's tokens");
    STRATA_CHECK(int64_t(seq.blocks.size()) * kv_.block_size() >= end, "span past the sequence's blocks");
    STRATA_CHECK(!window_paged_ || int64_t(seq.window_blocks.size()) * kv_.block_size() >= end,
                 "span past the sequence's window blocks");
    STRATA_CHECK(state_floats_ == 0 || seq.state_slot >= 0, "span of a hybrid model without a state slot");
    batch_.tokens.insert(batch_.tokens.end(), seq.tokens.begin() + span.pos0,
                         seq.tokens.begin() + span.pos0 + span.n_tokens);
    SeqSpan& s = batch_.seqs[i];
    s.n_tokens = span.n_tokens;
    s.pos0 = span.pos0;
    s.block_table = seq.blocks;
    s.n_quant_blocks = seq.n_quant_blocks;
    if (window_paged_) {
      s.window_block_table = seq.window_blocks;
    } else {
      s.window_block_table.clear();
    }
    s.state_slot = state_floats_ > 0 ? seq.state_slot : -1;
    s.adapter = seq.adapter;
    s.logits_last = span.sample;
    s.logits_all = span.logits_all;
  }
  logits_.resize(size_t(batch_.n_logit_rows()) * size_t(vocab_));
  model_.forward(batch_, kv_, state_floats_ > 0 ? &state_ : nullptr, logits_.data());
  return logits_.data();
}

const StepRows& ModelRunner::run(const StepPlan& plan, const std::vector<uint8_t>& want_logits,
                                 std::span<const RowSample> samples) {
  rows_.logits = run(plan);
  const int64_t n = batch_.n_logit_rows();
  rows_.host_row.resize(size_t(n));
  for (int64_t r = 0; r < n; ++r) rows_.host_row[size_t(r)] = int32_t(r);
  rows_.argmax.clear();
  // Every row comes back as logits; the engine hands no RowSamples to a host executor.
  STRATA_CHECK(samples.empty() || std::none_of(samples.begin(), samples.end(), [](const RowSample& s) { return s.sampler != nullptr; }),
               "a host executor samples no rows");
  rows_.sampled.assign(size_t(n), StepRows::kNotSampled);
  return rows_;
}

std::vector<int64_t> ModelRunner::block_tensor_bytes() const {
  return tier_tensor_bytes(kv_, n_layers_);
}

void ModelRunner::read_block(int32_t block, uint8_t* out) {
  gather_tier_block(kv_, n_layers_, block, out);
}

void ModelRunner::write_block(int32_t block, const uint8_t* in) {
  scatter_tier_block(kv_, n_layers_, block, in);
}

std::vector<int64_t> ModelRunner::window_block_tensor_bytes() const {
  if (!window_paged_) return {};
  return tier_tensor_bytes(kv_, n_layers_, true);
}

void ModelRunner::read_window_blocks(std::span<const int32_t> blocks, uint8_t* out) {
  STRATA_CHECK(window_paged_, "no sliding-window pool");
  const std::vector<int64_t> t = tier_tensor_bytes(kv_, n_layers_, true);
  const int64_t bb = std::accumulate(t.begin(), t.end(), int64_t(0));
  for (size_t i = 0; i < blocks.size(); ++i) gather_tier_block(kv_, n_layers_, blocks[i], out + int64_t(i) * bb, true);
}

void ModelRunner::write_window_blocks(std::span<const int32_t> blocks, const uint8_t* in) {
  STRATA_CHECK(window_paged_, "no sliding-window pool");
  const std::vector<int64_t> t = tier_tensor_bytes(kv_, n_layers_, true);
  const int64_t bb = std::accumulate(t.begin(), t.end(), int64_t(0));
  for (size_t i = 0; i < blocks.size(); ++i) scatter_tier_block(kv_, n_layers_, blocks[i], in + int64_t(i) * bb, true);
}

}  // namespace strata
