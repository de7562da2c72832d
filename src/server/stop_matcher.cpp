#include "server/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace strata::server {

size_t partial_suffix_length(std::string_view text, std::string_view marker) {
  const size_t max_len = std::min(text.size(), marker.size() - (marker.empty() ? 0 : 1));
  for (size_t len = max_len; len > 0; --len) {
    if (text.substr(text.size() - len) == marker.substr(0, len)) return len;
  }
  return 0;
}

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return "";
  held_.append(text);
  if (stops_.empty()) return std::exchange(held_, std::string());
  size_t best = std::string::npos;
  for (const auto& s : stops_) {
    const size_t pos = held_.find(s);
    if (pos < best) {
      best = pos;
      matched_ = s;
    }
  }
  if (best != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, best);
    held_.clear();
    return out;
  }
  size_t keep = 0;
  for (const auto& s : stops_) keep = std::max(keep, partial_suffix_length(held_, s));
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  if (stopped_) return "";
  return std::exchange(held_, std::string());
}

}  // namespace strata::server
