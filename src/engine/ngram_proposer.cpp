#include "engine/ngram_proposer.h"

#include <algorithm>

namespace strata {

std::vector<int32_t> ngram_lookup(std::span<const int32_t> tokens, int32_t min_n, int32_t max_n, int32_t max_k) {
  std::vector<int32_t> out;
  const int64_t len = int64_t(tokens.size());
  if (max_k <= 0 || len < 2) return out;
  for (int64_t n = std::min<int64_t>(max_n, len - 1); n >= std::max<int64_t>(min_n, 1); --n) {
    const int32_t* suffix = tokens.data() + (len - n);
    // Candidate starts s with tokens[s, s + n) == suffix and s + n < len (something follows),
    // latest first: recent text predicts the continuation best.
    for (int64_t s = len - n - 1; s >= 0; --s) {
      if (!std::equal(suffix, suffix + n, tokens.data() + s)) continue;
      // Past the end the match continues into its own draft: a repeating run of period
      // len - from goes on repeating.
      const int64_t from = s + n;
      for (int64_t i = 0; i < max_k; ++i) {
        const int64_t p = from + i;
        out.push_back(p < len ? tokens[size_t(p)] : out[size_t(p - len)]);
      }
      return out;
    }
  }
  return out;
}

void NgramProposer::propose(std::span<const DraftRow> rows, std::vector<std::vector<int32_t>>* drafts) {
  drafts->resize(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) (*drafts)[i] = ngram_lookup(rows[i].tokens, min_n_, max_n_, rows[i].max_k);
}

}  // namespace strata
