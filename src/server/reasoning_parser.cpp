#include "server/reasoning_parser.h"

#include "server/stop_matcher.h"

namespace strata::server {

namespace {

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

size_t first_non_space(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && is_space(s[i])) ++i;
  return i;
}

}  // namespace

ReasoningSplitter::ReasoningSplitter(bool start_inside, std::string open, std::string close)
    : open_(std::move(open)), close_(std::move(close)), state_(start_inside ? State::kInside : State::kBefore) {
  saw_reasoning_ = start_inside;
}

bool prompt_opens_reasoning(std::string_view prompt, std::string_view open) {
  size_t end = prompt.size();
  while (end > 0 && is_space(prompt[end - 1])) --end;
  return end >= open.size() && prompt.substr(end - open.size(), open.size()) == open;
}

ReasoningDelta ReasoningSplitter::push(std::string_view text) {
  held_.append(text);
  ReasoningDelta out;
  run(out, false);
  return out;
}

ReasoningDelta ReasoningSplitter::finish() {
  ReasoningDelta out;
  run(out, true);
  held_.clear();
  return out;
}

void ReasoningSplitter::run(ReasoningDelta& out, bool final) {
  for (;;) {
    if (state_ == State::kBefore) {
      const size_t ns = first_non_space(held_);
      const std::string_view rest = std::string_view(held_).substr(ns);
      if (rest.empty()) {
        if (final) out.content += held_;
        return;
      }
      if (rest.substr(0, open_.size()) == open_) {
        held_.erase(0, ns + open_.size());
        state_ = State::kInside;
        saw_reasoning_ = true;
        continue;
      }
      if (!final && open_.substr(0, rest.size()) == rest) return;  // may still become the tag
      state_ = State::kAfter;
      content_started_ = true;  // no reasoning: the text is content, untouched
      continue;
    }
    if (state_ == State::kInside) {
      if (!reasoning_started_) {
        const size_t ns = first_non_space(held_);
        held_.erase(0, ns);
        if (held_.empty()) return;
      }
      const size_t pos = held_.find(close_);
      if (pos != std::string::npos) {
        std::string r = held_.substr(0, pos);
        while (!r.empty() && is_space(r.back())) r.pop_back();
        if (!r.empty()) reasoning_started_ = true;
        out.reasoning += r;
        held_.erase(0, pos + close_.size());
        state_ = State::kAfter;
        continue;
      }
      if (final) {
        out.reasoning += held_;
        held_.clear();
        return;
      }
      // Hold back a possible partial close tag and trailing whitespace (dropped if the tag follows).
      size_t keep = partial_suffix_length(held_, close_);
      size_t end = held_.size() - keep;
      while (end > 0 && is_space(held_[end - 1])) --end;
      if (end > 0) {
        reasoning_started_ = true;
        out.reasoning += held_.substr(0, end);
        held_.erase(0, end);
      }
      return;
    }
    // kAfter
    if (!content_started_) {
      held_.erase(0, first_non_space(held_));
      if (held_.empty()) return;
      content_started_ = true;
    }
    out.content += held_;
    held_.clear();
    return;
  }
}

}  // namespace strata::server
