// ReasoningSplitter: separates a reasoning model's thinking (<think>...</think>, as Qwen3,
// DeepSeek-R1 and their derivatives write it) from its answer, over text that arrives in
// pieces. The reasoning goes to `reasoning_content`, the rest to `content`. Whitespace right
// inside the tags and between </think> and the answer is dropped; text that could still be a
// tag is held back. A model whose prompt already opened the tag (DeepSeek-R1's template ends
// with "<think>\n") starts inside. Output that never opens a tag is content, unchanged.
#pragma once

#include <string>
#include <string_view>

namespace strata::server {

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

class ReasoningSplitter {
 public:
  explicit ReasoningSplitter(bool start_inside = false, std::string open = "<think>", std::string close = "</think>");

  ReasoningDelta push(std::string_view text);
  // Everything still held back (a reasoning that never closed stays reasoning).
  ReasoningDelta finish();

  bool saw_reasoning() const { return saw_reasoning_; }

 private:
  enum class State { kBefore, kInside, kAfter };
  void run(ReasoningDelta& out, bool final);

  std::string open_, close_;
  State state_;
  std::string held_;
  bool reasoning_started_ = false;  // a non-space reasoning character was emitted
  bool content_started_ = false;    // after </think>: a non-space content character was emitted
  bool saw_reasoning_ = false;
};

// True when a rendered prompt leaves the model inside an opened <think> (ends with "<think>"
// and optional whitespace).
bool prompt_opens_reasoning(std::string_view prompt, std::string_view open = "<think>");

}  // namespace strata::server
