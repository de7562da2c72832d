// Regex: a compiled PCRE2 pattern (UTF + Unicode properties, JIT) for the Split
// pre-tokenizer and the Replace normalizer/decoder. Compiled once at load; matching is
// thread-safe (each thread keeps its own match data and JIT stack).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace strata::tokenizer {

class Regex {
 public:
  // Compiles `pattern` (a regex, or a literal when `literal`); an error names the pattern.
  static Result<Regex> compile(const std::string& pattern, bool literal = false);

  // Appends the [start, end) byte ranges of all non-overlapping matches in `text` (valid
  // UTF-8), left to right. Empty matches are skipped.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
  std::string pattern_;
  std::string literal_;  // non-empty: matched by plain search instead of PCRE2
};

}  // namespace strata::tokenizer
