#include "tokenizer/tokenizer_config.h"

#include <nlohmann/json.hpp>

namespace strata::tokenizer {
namespace {

using json = nlohmann::json;

// A special-token value: a string, an AddedToken dict {"content": ...}, or null.
Result<std::string> token_string(const json& v, const char* field) {
  if (v.is_null()) return std::string();
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return make_error(ErrorCode::kCorrupt, std::string(field) + ": expected a string or an AddedToken object, got " + v.dump());
}

}  // namespace

const std::string* TokenizerConfig::find_template(const std::string& name) const {
  for (const auto& [n, source] : chat_templates) {
    if (n == name) return &source;
  }
  return nullptr;
}

void TokenizerConfig::set_template(const std::string& name, std::string source) {
  for (auto& [n, s] : chat_templates) {
    if (n == name) {
      s = std::move(source);
      return;
    }
  }
  chat_templates.emplace_back(name, std::move(source));
}

Result<TokenizerConfig> parse_tokenizer_config(const std::string& text) {
  TokenizerConfig c;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return make_error(ErrorCode::kCorrupt, e.what());
  }
  if (!j.is_object()) return make_error(ErrorCode::kCorrupt, "expected a JSON object");
  for (auto [field, target] : {std::pair{"bos_token", &c.bos_token}, std::pair{"eos_token", &c.eos_token}}) {
    if (!j.contains(field)) continue;
    auto s = token_string(j[field], field);
    if (!s.ok()) return s.error();
    *target = std::move(*s);
  }
  if (j.contains("tokenizer_class") && j["tokenizer_class"].is_string()) c.tokenizer_class = j["tokenizer_class"].get<std::string>();
  if (j.contains("add_prefix_space") && j["add_prefix_space"].is_boolean()) c.add_prefix_space = j["add_prefix_space"].get<bool>();
  if (j.contains("legacy") && j["legacy"].is_boolean()) c.legacy = j["legacy"].get<bool>();
  if (j.contains("chat_template")) {
    const json& t = j["chat_template"];
    if (t.is_string()) {
      c.chat_templates.emplace_back("default", t.get<std::string>());
    } else if (t.is_array()) {
      for (const auto& entry : t) {
        if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() || !entry.contains("template") ||
            !entry["template"].is_string()) {
          return make_error(ErrorCode::kCorrupt, "chat_template: list entries must be {name, template}, got " + entry.dump());
        }
        c.set_template(entry["name"].get<std::string>(), entry["template"].get<std::string>());
      }
    } else if (!t.is_null()) {
      return make_error(ErrorCode::kCorrupt, "chat_template: expected a string or a list");
    }
  }
  return c;
}

Status parse_generation_config(const std::string& text, TokenizerConfig& config) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return make_error(ErrorCode::kCorrupt, e.what());
  }
  if (!j.is_object() || !j.contains("eos_token_id")) return Status();
  const json& e = j["eos_token_id"];
  if (e.is_number_integer()) {
    config.generation_eos_ids.push_back(e.get<int32_t>());
  } else if (e.is_array()) {
    for (const auto& v : e) {
      if (!v.is_number_integer()) return make_error(ErrorCode::kCorrupt, "eos_token_id: expected integers, got " + e.dump());
      config.generation_eos_ids.push_back(v.get<int32_t>());
    }
  } else if (!e.is_null()) {
    return make_error(ErrorCode::kCorrupt, "eos_token_id: expected an integer or a list, got " + e.dump());
  }
  return Status();
}

}  // namespace strata::tokenizer
