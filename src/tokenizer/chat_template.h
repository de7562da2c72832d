// ChatTemplate: a Jinja interpreter for Hugging Face chat templates, rendering exactly what
// transformers' apply_chat_template renders (jinja2 with trim_blocks and lstrip_blocks,
// `raise_exception`, `tojson`, loop controls, namespace(), ...).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace strata::tokenizer {

namespace jinja {
struct Template;
}

class ChatTemplate {
 public:
  ChatTemplate();
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Parses template source; a syntax error names the template line.
  static Result<ChatTemplate> parse(const std::string& source);

  // Renders with `context` as the global variables: messages, tools, add_generation_prompt,
  // bos_token, eos_token and any extra keyword arguments (enable_thinking, ...). An error in
  // the template (raise_exception, a type error) is an Error naming the template line.
  // nlohmann::json sorts object keys, so dicts reach the template in sorted order (visible
  // in `tojson` output); use render_ordered to keep the caller's key order as Python does.
  Result<std::string> render(const nlohmann::json& context) const;
  Result<std::string> render_ordered(const nlohmann::ordered_json& context) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The text of a special token as tokenizer_config.json writes it: a plain string, or an
// AddedToken object {"content": ..., ...}; anything else (null, absent) gives "".
std::string special_token_text(const nlohmann::ordered_json& value);

}  // namespace strata::tokenizer
