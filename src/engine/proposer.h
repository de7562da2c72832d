// Proposer: where a speculating sequence's drafted tokens come from (engine/speculative.h has
// the method). The engine asks once per step, for every speculating decode at once, so a
// proposer that runs a model drafts for all of them in batched forwards; the engine times
// each call for its choice of k. A proposer only
// guesses: the target's verify decides, so a wrong or short draft costs time, never tokens.
//
// Heads that read the target's own hidden states or KV (MTP, EAGLE) plug in here too: they
// keep per-sequence state keyed by seq_id like the draft model does and, when added, take the
// verify step's features through an observe hook beside propose(); nothing here assumes a
// separate model.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace strata {

struct DraftRow {
  uint64_t seq_id = 0;               // Sequence::id, stable while the request lives
  std::span<const int32_t> tokens;   // prompt + generated, committed; the last one is the
                                     // pending token (sampled, no KV yet)
  int32_t max_k = 0;                 // drafted tokens wanted at most, >= 1
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual const char* name() const = 0;
  // Writes up to rows[i].max_k tokens continuing rows[i].tokens into (*drafts)[i] (resized to
  // rows.size(); an empty draft is allowed). Rows of one call are one batch.
  virtual void propose(std::span<const DraftRow> rows, std::vector<std::vector<int32_t>>* drafts) = 0;
  // The sequence ended: whatever the proposer keeps for it can go.
  virtual void forget(uint64_t /*seq_id*/) {}
};

}  // namespace strata
