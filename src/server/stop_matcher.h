// StopMatcher: ends a generation at the first stop string, over text that arrives in pieces.
// Text that could still grow into a stop string is held back, so a stop string never reaches
// the client, not even partly; what push() and flush() return concatenates to the text up to
// (excluding) the first stop string, or to all of it when none matched.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace strata::server {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Appends text; returns what is safe to emit. After a match, returns the text before the
  // stop string and ignores further input.
  std::string push(std::string_view text);
  // The held-back rest when the generation ended without a match ("" after a match).
  std::string flush();

  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }  // the stop string that matched

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

// Length of the longest suffix of `text` that is a proper prefix of `marker`.
size_t partial_suffix_length(std::string_view text, std::string_view marker);

}  // namespace strata::server
