#include "model/pooling.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace strata {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

Result<json> read_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return make_error(ErrorCode::kNotFound, p.string() + ": cannot be opened");
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded()) return make_error(ErrorCode::kInvalidArgument, p.string() + ": is not valid JSON");
  return j;
}

Error bad(const fs::path& p, const std::string& what) {
  return make_error(ErrorCode::kInvalidArgument, p.string() + ": " + what);
}

}  // namespace

Result<PoolingConfig> load_pooling_config(const std::string& dir) {
  PoolingConfig out;
  const fs::path modules_path = fs::path(dir) / "modules.json";
  if (!fs::exists(modules_path)) return out;
  auto modules = read_json(modules_path);
  if (!modules.ok()) return modules.error();
  if (!modules->is_array()) return bad(modules_path, "must be an array of modules");
  std::string pooling_dir;
  bool have_pooling = false;
  for (const json& m : *modules) {
    if (!m.is_object() || !m.contains("type") || !m["type"].is_string()) {
      return bad(modules_path, "every module needs a string 'type', got " + m.dump());
    }
    const std::string type = m["type"].get<std::string>();
    const std::string path = m.contains("path") && m["path"].is_string() ? m["path"].get<std::string>() : "";
    if (type.ends_with(".Pooling")) {
      have_pooling = true;
      pooling_dir = path;
    } else if (type.ends_with(".Normalize")) {
      if (!have_pooling) return bad(modules_path, "Normalize before Pooling is not supported");
      out.normalize = true;
    } else if (!type.ends_with(".Transformer")) {
      return make_error(ErrorCode::kUnsupported, modules_path.string() + ": module type '" + type +
                                                     "' is not supported (Transformer, Pooling, Normalize)");
    }
  }
  if (!have_pooling) return out;
  out.present = true;

  const fs::path pool_path = fs::path(dir) / pooling_dir / "config.json";
  auto pool = read_json(pool_path);
  if (!pool.ok()) return pool.error();
  if (!pool->is_object()) return bad(pool_path, "must be an object");
  bool last_token = false;
  for (const auto& [key, v] : pool->items()) {
    if (!key.starts_with("pooling_mode_")) continue;
    if (!v.is_boolean()) return bad(pool_path, "field '" + key + "' must be a boolean, got " + v.dump());
    if (!v.get<bool>()) continue;
    if (key == "pooling_mode_lasttoken") {
      last_token = true;
    } else {
      return make_error(ErrorCode::kUnsupported, pool_path.string() + ": '" + key +
                                                     "' is not supported (last-token pooling only: pooling_mode_lasttoken)");
    }
  }
  if (!last_token) return make_error(ErrorCode::kUnsupported, pool_path.string() + ": no pooling mode is set (pooling_mode_lasttoken)");
  if (pool->contains("word_embedding_dimension")) {
    const json& d = (*pool)["word_embedding_dimension"];
    if (!d.is_number_integer() || d.get<int64_t>() <= 0 || d.get<int64_t>() > INT32_MAX) {
      return bad(pool_path, "field 'word_embedding_dimension' must be a positive integer, got " + d.dump());
    }
    out.dimension = d.get<int32_t>();
  }

  const fs::path st_path = fs::path(dir) / "config_sentence_transformers.json";
  if (fs::exists(st_path)) {
    auto st = read_json(st_path);
    if (!st.ok()) return st.error();
    if (st->contains("prompts") && !(*st)["prompts"].is_null()) {
      const json& p = (*st)["prompts"];
      if (!p.is_object()) return bad(st_path, "field 'prompts' must be an object, got " + p.dump());
      for (const auto& [name, text] : p.items()) {
        if (!text.is_string()) return bad(st_path, "prompt '" + name + "' must be a string, got " + text.dump());
        out.prompts[name] = text.get<std::string>();
      }
    }
    if (st->contains("default_prompt_name") && !(*st)["default_prompt_name"].is_null()) {
      const json& d = (*st)["default_prompt_name"];
      if (!d.is_string() || !out.prompts.count(d.get<std::string>())) {
        return bad(st_path, "field 'default_prompt_name' must name one of 'prompts', got " + d.dump());
      }
      out.default_prompt_name = d.get<std::string>();
    }
  }
  return out;
}

}  // namespace strata
