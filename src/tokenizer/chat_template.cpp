#include "tokenizer/chat_template.h"

#include <exception>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/failure.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/json.h"
#include "tokenizer/jinja/parser.h"

namespace strata::tokenizer {

struct ChatTemplate::Impl {
  jinja::Template tmpl;
};

namespace {

Error template_error(const jinja::Failure& f) {
  std::string where = f.line > 0 ? "chat template line " + std::to_string(f.line) : "chat template";
  return make_error(ErrorCode::kInvalidArgument, where + ": " + f.message);
}

}  // namespace

ChatTemplate::ChatTemplate() : impl_(std::make_unique<Impl>()) {}
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

Result<ChatTemplate> ChatTemplate::parse(const std::string& source) {
  ChatTemplate t;
  try {
    t.impl_->tmpl = jinja::parse_template(source);
  } catch (const jinja::Failure& f) {
    return template_error(f);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kInvalidArgument, std::string("chat template: ") + e.what());
  }
  return t;
}

Result<std::string> ChatTemplate::render(const nlohmann::json& context) const {
  return render_ordered(nlohmann::ordered_json::parse(context.dump()));
}

Result<std::string> ChatTemplate::render_ordered(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) {
    return make_error(ErrorCode::kInvalidArgument, "chat template context must be a JSON object, got " + std::string(context.type_name()));
  }
  try {
    return jinja::render_template(impl_->tmpl, jinja::from_json(context));
  } catch (const jinja::Failure& f) {
    return template_error(f);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kInvalidArgument, std::string("chat template: ") + e.what());
  }
}

std::string special_token_text(const nlohmann::ordered_json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object()) {
    auto it = value.find("content");
    if (it != value.end() && it->is_string()) return it->get<std::string>();
  }
  return "";
}

}  // namespace strata::tokenizer
