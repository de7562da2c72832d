#include "tokenizer/chat_template.h"

namespace strata::tokenizer {

struct ChatTemplate::Impl {
  std::string source;
};

ChatTemplate::ChatTemplate() : impl_(std::make_unique<Impl>()) {}
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

Result<ChatTemplate> ChatTemplate::parse(const std::string& source) {
  ChatTemplate t;
  t.impl_->source = source;
  return t;
}

Result<std::string> ChatTemplate::render(const nlohmann::json& context) const {
  return make_error(ErrorCode::kUnsupported, "chat template rendering is not implemented yet");
}

}  // namespace strata::tokenizer
