#include "tokenizer/post_processor.h"

#include <string>

#include <nlohmann/json.hpp>

namespace strata::tokenizer {
namespace {

using json = nlohmann::json;

Status parse_into(const json& spec, PostProcessor& pp) {
  if (spec.is_null()) return Status();
  const std::string type = spec.value("type", std::string());
  if (type == "ByteLevel") return Status();
  if (type == "Sequence") {
    for (const auto& p : spec.at("processors")) STRATA_RETURN_IF_ERROR(parse_into(p, pp));
    return Status();
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    // "cls": ["[CLS]", 101], "sep": ["[SEP]", 102]
    pp.prefix.push_back(spec.at("cls").at(1).get<int32_t>());
    pp.suffix.insert(pp.suffix.begin(), spec.at("sep").at(1).get<int32_t>());
    return Status();
  }
  if (type == "TemplateProcessing") {
    const auto& specials = spec.at("special_tokens");
    bool after_sequence = false;
    for (const auto& piece : spec.at("single")) {
      if (piece.contains("Sequence")) {
        after_sequence = true;
        continue;
      }
      if (!piece.contains("SpecialToken")) {
        return make_error(ErrorCode::kCorrupt, "tokenizer.json TemplateProcessing: unknown template piece " + piece.dump());
      }
      const std::string name = piece["SpecialToken"].at("id").get<std::string>();
      if (!specials.contains(name)) {
        return make_error(ErrorCode::kCorrupt, "tokenizer.json TemplateProcessing: special token '" + name + "' has no ids");
      }
      auto& target = after_sequence ? pp.suffix : pp.prefix;
      for (const auto& id : specials[name].at("ids")) target.push_back(id.get<int32_t>());
    }
    return Status();
  }
  return make_error(ErrorCode::kUnsupported, "tokenizer.json post_processor type '" + type + "' is not supported");
}

}  // namespace

Result<PostProcessor> parse_post_processor(const json& spec) {
  PostProcessor pp;
  try {
    auto st = parse_into(spec, pp);
    if (!st.ok()) return st.error();
  } catch (const json::exception& e) {
    return make_error(ErrorCode::kCorrupt, std::string("tokenizer.json post_processor: ") + e.what());
  }
  return pp;
}

}  // namespace strata::tokenizer
