#include "engine/draft_model_proposer.h"

#include <algorithm>

#include "core/check.h"
#include "engine/engine.h"

namespace strata {

Status DraftModelProposer::check(const Model* draft, const std::string& dir, const ModelConfig& target,
                                 int32_t max_model_len) {
  auto bad = [&](const std::string& m) { return make_error(ErrorCode::kInvalidArgument, "--draft-model " + dir + ": " + m); };
  if (draft == nullptr) return bad("no draft model loaded");
  const ModelConfig& c = draft->config();
  if (c.vocab_size != target.vocab_size) {
    return bad("vocabulary of " + std::to_string(c.vocab_size) + " tokens differs from the target's " +
               std::to_string(target.vocab_size) + "; the draft must share the target's tokenizer");
  }
  if (c.max_position > 0 && c.max_position < max_model_len) {
    return bad("context of " + std::to_string(c.max_position) + " positions is shorter than --max-model-len " +
               std::to_string(max_model_len));
  }
  for (const auto& s : draft->state_layout()) {
    if (s.has_state) return bad("model type '" + c.model_type + "' keeps recurrent state, which a draft cannot roll back yet");
  }
  return Status();
}

Result<std::unique_ptr<DraftModelProposer>> DraftModelProposer::create(std::shared_ptr<Model> draft, const std::string& dir,
                                                                       const ModelConfig& target, int32_t max_model_len,
                                                                       int32_t n_blocks, int32_t block_size) {
  auto bad = [&](const std::string& m) { return make_error(ErrorCode::kInvalidArgument, "--draft-model " + dir + ": " + m); };
  STRATA_RETURN_IF_ERROR(check(draft.get(), dir, target, max_model_len));
  auto layout = resolve_kv_layout(*draft, KvCodecConfig{});
  if (!layout.ok()) return bad(layout.error().message);
  if (n_blocks < 2) return bad("a KV pool of " + std::to_string(n_blocks) + " blocks is too small");
  return std::make_unique<DraftModelProposer>(std::move(draft), *layout, n_blocks, block_size);
}

DraftModelProposer::DraftModelProposer(std::shared_ptr<Model> draft, const std::vector<KvLayerSpec>& layout,
                                       int32_t n_blocks, int32_t block_size)
    : model_(std::move(draft)), kv_(n_blocks, block_size), runner_(*model_, layout, n_blocks, block_size) {}

void DraftModelProposer::release(Sequence& seq) {
  kv_.release(seq.blocks, 0.0);
  seq.blocks.clear();
  seq.n_computed = 0;
}

void DraftModelProposer::forget(uint64_t seq_id) {
  auto it = mirrors_.find(seq_id);
  if (it == mirrors_.end()) return;
  release(it->second);
  mirrors_.erase(it);
}

bool DraftModelProposer::reserve(Sequence& seq, int32_t n_tokens, std::span<const DraftRow> batch) {
  const int32_t bs = kv_.block_size();
  while (int32_t(seq.blocks.size()) * bs < n_tokens) {
    int32_t b = kv_.allocate(0.0);
    if (b < 0) {
      // Evict a mirror that is not drafting in this batch.
      auto victim = std::find_if(mirrors_.begin(), mirrors_.end(), [&](const auto& m) {
        return !m.second.blocks.empty() &&
               std::none_of(batch.begin(), batch.end(), [&](const DraftRow& r) { return r.seq_id == m.first; });
      });
      if (victim == mirrors_.end()) return false;
      release(victim->second);
      continue;
    }
    seq.blocks.push_back(b);
  }
  return true;
}

void DraftModelProposer::propose(std::span<const DraftRow> rows, std::vector<std::vector<int32_t>>* drafts) {
  drafts->assign(rows.size(), {});
  const int32_t vocab = model_->config().vocab_size;
  std::vector<Sequence*> seqs(rows.size(), nullptr);
  int32_t steps = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const DraftRow& r = rows[i];
    Sequence& m = mirrors_[r.seq_id];
    m.id = r.seq_id;
    // Keep the KV of the longest prefix the mirror shares with the target's committed tokens.
    const int32_t n = int32_t(r.tokens.size());
    int32_t same = 0;
    const int32_t limit = std::min(m.n_computed, n - 1);  // the pending token is computed here
    while (same < limit && m.tokens[size_t(same)] == r.tokens[size_t(same)]) ++same;
    m.n_computed = same;
    m.tokens.assign(r.tokens.begin(), r.tokens.end());
    // A draft of k runs the pending token and k - 1 drafts: KV for n + k - 1 positions.
    const int32_t bs = kv_.block_size();
    const size_t keep = size_t((n + r.max_k - 1 + bs - 1) / bs);
    if (m.blocks.size() > keep) {
      kv_.release(std::span<const int32_t>(m.blocks).subspan(keep), 0.0);
      m.blocks.resize(keep);
    }
    if (!reserve(m, n + r.max_k - 1, rows)) {
      release(m);
      continue;
    }
    seqs[i] = &m;
    steps = std::max(steps, r.max_k);
  }
  for (int32_t step = 0; step < steps; ++step) {
    StepPlan plan;
    std::vector<size_t> row_of;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (seqs[i] == nullptr || step >= rows[i].max_k) continue;
      ScheduledSpan span;
      span.seq = seqs[i];
      span.pos0 = seqs[i]->n_computed;
      span.n_tokens = seqs[i]->n_tokens() - span.pos0;
      span.sample = true;
      plan.spans.push_back(span);
      plan.n_tokens += span.n_tokens;
      row_of.push_back(i);
    }
    if (plan.spans.empty()) break;
    const float* logits = runner_.run(plan);
    ++n_forwards_;
    for (size_t j = 0; j < row_of.size(); ++j) {
      const float* row = logits + j * size_t(vocab);
      // Greedy, lowest id on ties; NaN rows draft nothing more.
      int32_t best = -1;
      float best_v = 0.0f;
      for (int32_t v = 0; v < vocab; ++v) {
        if (row[v] == row[v] && (best < 0 || row[v] > best_v)) {
          best = v;
          best_v = row[v];
        }
      }
      Sequence& m = *seqs[row_of[j]];
      m.n_computed = m.n_tokens();
      if (best < 0) {
        seqs[row_of[j]] = nullptr;
        continue;
      }
      m.tokens.push_back(best);
      (*drafts)[row_of[j]].push_back(best);
    }
  }
}

}  // namespace strata
