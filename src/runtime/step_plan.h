// StepPlan: what one step computes, decided by the scheduler before the step runs and not
// changed after. The runner packs it into one StepBatch; the engine commits it afterwards.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/sequence.h"

namespace strata {

struct ScheduledSpan {
  Sequence* seq = nullptr;
  int32_t pos0 = 0;       // first position computed = seq->n_computed when planned
  int32_t n_tokens = 0;   // tokens [pos0, pos0 + n_tokens) of seq->tokens
  bool sample = false;    // the span reaches the sequence's last token: sample the next one
  bool logits_all = false;  // logits for every position (prompt logprobs still owed, or a verify)
  // Speculative verify: the span is the pending token plus n_draft drafted tokens (sample and
  // logits_all set); commit keeps the longest prefix the request's sampler agrees with.
  int32_t n_draft = 0;
  // Recurrent state (hybrid families): before the step, load the snapshot under restore_hash
  // into the sequence's slot (a prefix hit at pos0); after it, snapshot the slot under
  // save_hash (the span ends at a snapshot boundary).
  bool restore_state = false;
  uint64_t restore_hash = 0;
  bool save_state = false;
  uint64_t save_hash = 0;
};

struct StepPlan {
  std::vector<ScheduledSpan> spans;  // decodes first, then prefill chunks, each in policy order
  std::vector<uint64_t> preempted;   // ids of sequences preempted while planning
  int32_t n_tokens = 0;

  bool empty() const { return spans.empty(); }
};

}  // namespace strata
