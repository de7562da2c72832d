// NgramProposer: prompt lookup. The last n tokens of a sequence (n from max_n down to min_n)
// are looked for earlier in its own prompt + output; at the latest earlier match the tokens
// that followed are the draft. No model, no state.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/proposer.h"

namespace strata {

// Up to max_k tokens that followed the latest earlier occurrence of the longest suffix of
// `tokens` of length in [min_n, max_n]; empty when none occurs. An occurrence may overlap the
// suffix but must end before the last token, so that something follows it; a match whose
// continuation reaches the end goes on with its own period (a repeating run keeps repeating).
std::vector<int32_t> ngram_lookup(std::span<const int32_t> tokens, int32_t min_n, int32_t max_n, int32_t max_k);

class NgramProposer final : public Proposer {
 public:
  NgramProposer(int32_t min_n, int32_t max_n) : min_n_(min_n), max_n_(max_n) {}
  const char* name() const override { return "ngram"; }
  void propose(std::span<const DraftRow> rows, std::vector<std::vector<int32_t>>* drafts) override;

 private:
  int32_t min_n_, max_n_;
};

}  // namespace strata
