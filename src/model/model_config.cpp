#include "model/model_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace strata {

namespace fs = std::filesystem;
using nlohmann::json;

const RopeConfig& ModelConfig::rope_for(const std::string& layer_type) const {
  auto it = rope_by_layer_type.find(layer_type);
  return it == rope_by_layer_type.end() ? rope : it->second;
}

namespace {

Error bad_field(const std::string& source, const std::string& field, const std::string& what) {
  return make_error(ErrorCode::kInvalidArgument, source + ": field '" + field + "' " + what);
}

bool present(const json& j, const char* key) { return j.contains(key) && !j[key].is_null(); }

// Reads an integer field into *out when present; error when it has another type.
Status read_int(const json& j, const char* key, const std::string& source, int32_t* out, bool required = false) {
  if (!present(j, key)) {
    if (required) return bad_field(source, key, "is missing");
    return Status();
  }
  const json& v = j[key];
  if (!v.is_number_integer()) return bad_field(source, key, "is not an integer: " + v.dump());
  const int64_t x = v.get<int64_t>();
  if (x < 0 || x > INT32_MAX) return bad_field(source, key, "is out of range: " + v.dump());
  *out = int32_t(x);
  return Status();
}

Status read_double(const json& j, const char* key, const std::string& source, double* out) {
  if (!present(j, key)) return Status();
  if (!j[key].is_number()) return bad_field(source, key, "is not a number: " + j[key].dump());
  *out = j[key].get<double>();
  return Status();
}

Status read_float(const json& j, const char* key, const std::string& source, float* out) {
  double d = *out;
  STRATA_RETURN_IF_ERROR(read_double(j, key, source, &d));
  *out = float(d);
  return Status();
}

Status read_bool(const json& j, const char* key, const std::string& source, bool* out) {
  if (!present(j, key)) return Status();
  if (!j[key].is_boolean()) return bad_field(source, key, "is not a boolean: " + j[key].dump());
  *out = j[key].get<bool>();
  return Status();
}

// One RoPE parameter object (transformers 5 rope_parameters entry or legacy rope_scaling),
// on top of `base` (which carries theta and the partial factor read elsewhere).
Status parse_rope_object(const json& r, const std::string& source, const std::string& field, RopeConfig* rope) {
  if (!r.is_object()) return bad_field(source, field, "is not an object: " + r.dump());
  const std::string f = field + ".";
  if (present(r, "rope_type") || present(r, "type")) {
    const json& t = present(r, "rope_type") ? r["rope_type"] : r["type"];
    if (!t.is_string()) return bad_field(source, f + "rope_type", "is not a string");
    rope->type = t.get<std::string>();
  }
  static const char* kTypes[] = {"default", "linear", "dynamic", "yarn", "llama3", "proportional"};
  bool known = false;
  for (const char* k : kTypes) known = known || rope->type == k;
  if (!known) {
    return make_error(ErrorCode::kUnsupported, source + ": field '" + f + "rope_type' has unsupported value '" + rope->type +
                                                   "' (supported: default, linear, dynamic, yarn, llama3, proportional)");
  }
  auto num = [&](const char* key, double* out) -> Status {
    if (!present(r, key)) return Status();
    if (!r[key].is_number()) return bad_field(source, f + key, "is not a number: " + r[key].dump());
    *out = r[key].get<double>();
    return Status();
  };
  STRATA_RETURN_IF_ERROR(num("rope_theta", &rope->theta));
  STRATA_RETURN_IF_ERROR(num("factor", &rope->factor));
  STRATA_RETURN_IF_ERROR(num("partial_rotary_factor", &rope->partial_rotary_factor));
  STRATA_RETURN_IF_ERROR(num("low_freq_factor", &rope->low_freq_factor));
  STRATA_RETURN_IF_ERROR(num("high_freq_factor", &rope->high_freq_factor));
  STRATA_RETURN_IF_ERROR(num("beta_fast", &rope->beta_fast));
  STRATA_RETURN_IF_ERROR(num("beta_slow", &rope->beta_slow));
  STRATA_RETURN_IF_ERROR(num("attention_factor", &rope->attention_factor));
  STRATA_RETURN_IF_ERROR(num("mscale", &rope->mscale));
  STRATA_RETURN_IF_ERROR(num("mscale_all_dim", &rope->mscale_all_dim));
  double omp = double(rope->original_max_position);
  STRATA_RETURN_IF_ERROR(num("original_max_position_embeddings", &omp));
  rope->original_max_position = int64_t(omp);
  if (present(r, "truncate")) {
    if (!r["truncate"].is_boolean()) return bad_field(source, f + "truncate", "is not a boolean");
    rope->truncate = r["truncate"].get<bool>();
  }
  if (rope->theta <= 0) return bad_field(source, f + "rope_theta", "must be positive");
  if (rope->factor <= 0) return bad_field(source, f + "factor", "must be positive");
  if (rope->partial_rotary_factor <= 0 || rope->partial_rotary_factor > 1) {
    return bad_field(source, f + "partial_rotary_factor", "must lie in (0, 1]");
  }
  if ((rope->type == "llama3") && rope->original_max_position <= 0) {
    return bad_field(source, f + "original_max_position_embeddings", "is required by rope_type " + rope->type);
  }
  if (rope->type == "llama3" && !(rope->high_freq_factor > rope->low_freq_factor)) {
    return bad_field(source, f + "high_freq_factor", "must exceed low_freq_factor");
  }
  return Status();
}

Status parse_rope(const json& c, const std::string& source, ModelConfig* cfg) {
  RopeConfig base;
  STRATA_RETURN_IF_ERROR(read_double(c, "rope_theta", source, &base.theta));
  STRATA_RETURN_IF_ERROR(read_double(c, "partial_rotary_factor", source, &base.partial_rotary_factor));
  if (present(c, "rope_parameters")) {
    const json& rp = c["rope_parameters"];
    if (!rp.is_object()) return bad_field(source, "rope_parameters", "is not an object");
    bool nested = !rp.empty();
    for (const auto& [k, v] : rp.items()) nested = nested && v.is_object();
    if (nested) {
      for (const auto& [k, v] : rp.items()) {
        RopeConfig r = base;
        STRATA_RETURN_IF_ERROR(parse_rope_object(v, source, "rope_parameters." + k, &r));
        cfg->rope_by_layer_type[k] = r;
      }
      // Layers of a type without an entry fall back to full attention's, else the first.
      auto it = cfg->rope_by_layer_type.find("full_attention");
      cfg->rope = it != cfg->rope_by_layer_type.end() ? it->second : cfg->rope_by_layer_type.begin()->second;
      return Status();
    }
    cfg->rope = base;
    return parse_rope_object(rp, source, "rope_parameters", &cfg->rope);
  }
  cfg->rope = base;
  if (present(c, "rope_scaling")) {
    STRATA_RETURN_IF_ERROR(parse_rope_object(c["rope_scaling"], source, "rope_scaling", &cfg->rope));
  }
  // Legacy Gemma 3: sliding layers use rope_local_base_freq with no scaling.
  if (present(c, "rope_local_base_freq")) {
    RopeConfig local = base;
    STRATA_RETURN_IF_ERROR(read_double(c, "rope_local_base_freq", source, &local.theta));
    cfg->rope_by_layer_type["sliding_attention"] = local;
    cfg->rope_by_layer_type["full_attention"] = cfg->rope;
  }
  return Status();
}

Status read_id_list(const json& j, const char* key, const std::string& source, std::vector<int32_t>* out) {
  if (!present(j, key)) return Status();
  const json& v = j[key];
  std::vector<int32_t> ids;
  if (v.is_number_integer()) {
    ids.push_back(v.get<int32_t>());
  } else if (v.is_array()) {
    for (const auto& x : v) {
      if (!x.is_number_integer()) return bad_field(source, key, "holds a non-integer: " + x.dump());
      ids.push_back(x.get<int32_t>());
    }
  } else {
    return bad_field(source, key, "is neither an integer nor a list: " + v.dump());
  }
  *out = ids;
  return Status();
}

Status read_single_id(const json& j, const char* key, const std::string& source, int32_t* out) {
  if (!present(j, key)) return Status();
  std::vector<int32_t> ids;
  STRATA_RETURN_IF_ERROR(read_id_list(j, key, source, &ids));
  if (!ids.empty()) *out = ids[0];
  return Status();
}

Result<json> read_json_file(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return make_error(ErrorCode::kNotFound, "cannot read " + p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  if (j.is_discarded()) return make_error(ErrorCode::kCorrupt, p.string() + ": not valid JSON");
  if (!j.is_object()) return make_error(ErrorCode::kCorrupt, p.string() + ": not a JSON object");
  return j;
}

}  // namespace

Result<ModelConfig> parse_model_config(const json& outer, const std::string& source) {
  if (!outer.is_object()) return make_error(ErrorCode::kInvalidArgument, source + ": not a JSON object");
  ModelConfig cfg;
  if (!present(outer, "model_type") || !outer["model_type"].is_string()) {
    return bad_field(source, "model_type", "is missing or not a string");
  }
  const json* c = &outer;
  std::string src = source;
  if (present(outer, "text_config")) {
    if (!outer["text_config"].is_object()) return bad_field(source, "text_config", "is not an object");
    cfg.wrapper_type = outer["model_type"].get<std::string>();
    c = &outer["text_config"];
    src = source + " (text_config)";
    if (present(*c, "model_type") && (*c)["model_type"].is_string()) {
      cfg.model_type = (*c)["model_type"].get<std::string>();
    } else {
      cfg.model_type = cfg.wrapper_type + "_text";
    }
  } else {
    cfg.model_type = outer["model_type"].get<std::string>();
  }
  const json& j = *c;
  STRATA_RETURN_IF_ERROR(read_int(j, "vocab_size", src, &cfg.vocab_size, true));
  STRATA_RETURN_IF_ERROR(read_int(j, "hidden_size", src, &cfg.hidden, true));
  STRATA_RETURN_IF_ERROR(read_int(j, "num_hidden_layers", src, &cfg.n_layers, true));
  STRATA_RETURN_IF_ERROR(read_int(j, "num_attention_heads", src, &cfg.n_heads, true));
  if (cfg.vocab_size <= 0) return bad_field(src, "vocab_size", "must be positive");
  if (cfg.hidden <= 0) return bad_field(src, "hidden_size", "must be positive");
  if (cfg.n_layers <= 0) return bad_field(src, "num_hidden_layers", "must be positive");
  if (cfg.n_heads <= 0) return bad_field(src, "num_attention_heads", "must be positive");
  cfg.n_kv_heads = cfg.n_heads;
  STRATA_RETURN_IF_ERROR(read_int(j, "num_key_value_heads", src, &cfg.n_kv_heads));
  if (cfg.n_kv_heads <= 0 || cfg.n_heads % cfg.n_kv_heads != 0) {
    return bad_field(src, "num_key_value_heads", "must divide num_attention_heads (" + std::to_string(cfg.n_heads) +
                                                     "), got " + std::to_string(cfg.n_kv_heads));
  }
  cfg.head_dim = cfg.hidden / cfg.n_heads;
  STRATA_RETURN_IF_ERROR(read_int(j, "head_dim", src, &cfg.head_dim));
  if (cfg.head_dim <= 0) return bad_field(src, "head_dim", "must be positive");
  STRATA_RETURN_IF_ERROR(read_int(j, "intermediate_size", src, &cfg.intermediate));
  STRATA_RETURN_IF_ERROR(read_int(j, "max_position_embeddings", src, &cfg.max_position));
  STRATA_RETURN_IF_ERROR(read_float(j, "rms_norm_eps", src, &cfg.rms_eps));
  // A wrapper may declare tying at either level; the text config wins when it says.
  STRATA_RETURN_IF_ERROR(read_bool(outer, "tie_word_embeddings", source, &cfg.tie_embeddings));
  if (c != &outer) STRATA_RETURN_IF_ERROR(read_bool(j, "tie_word_embeddings", src, &cfg.tie_embeddings));
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (present(outer, key) && outer[key].is_string()) {
      cfg.dtype = outer[key].get<std::string>();
      break;
    }
  }
  for (const char* key : {"hidden_act", "hidden_activation"}) {
    if (present(j, key) && j[key].is_string()) cfg.hidden_act = j[key].get<std::string>();
  }
  STRATA_RETURN_IF_ERROR(read_bool(j, "attention_bias", src, &cfg.attention_bias));
  STRATA_RETURN_IF_ERROR(read_bool(j, "mlp_bias", src, &cfg.mlp_bias));
  STRATA_RETURN_IF_ERROR(parse_rope(j, src, &cfg));
  STRATA_RETURN_IF_ERROR(read_int(j, "sliding_window", src, &cfg.sliding_window));
  STRATA_RETURN_IF_ERROR(read_float(j, "attn_logit_softcapping", src, &cfg.attn_softcap));
  STRATA_RETURN_IF_ERROR(read_float(j, "final_logit_softcapping", src, &cfg.final_softcap));
  STRATA_RETURN_IF_ERROR(read_float(j, "query_pre_attn_scalar", src, &cfg.query_pre_attn_scalar));
  // Hub checkpoints say num_experts; others num_local_experts.
  STRATA_RETURN_IF_ERROR(read_int(j, "num_local_experts", src, &cfg.n_experts));
  STRATA_RETURN_IF_ERROR(read_int(j, "num_experts", src, &cfg.n_experts));
  STRATA_RETURN_IF_ERROR(read_int(j, "num_experts_per_tok", src, &cfg.n_experts_per_tok));
  STRATA_RETURN_IF_ERROR(read_int(j, "moe_intermediate_size", src, &cfg.moe_intermediate));
  STRATA_RETURN_IF_ERROR(read_int(j, "shared_expert_intermediate_size", src, &cfg.shared_expert_intermediate));
  STRATA_RETURN_IF_ERROR(read_bool(j, "norm_topk_prob", src, &cfg.norm_topk_prob));
  STRATA_RETURN_IF_ERROR(read_int(j, "decoder_sparse_step", src, &cfg.decoder_sparse_step));
  if (present(j, "mlp_only_layers")) {
    STRATA_RETURN_IF_ERROR(read_id_list(j, "mlp_only_layers", src, &cfg.mlp_only_layers));
  }
  if (present(j, "layer_types")) {
    if (!j["layer_types"].is_array()) return bad_field(src, "layer_types", "is not a list");
    for (const auto& t : j["layer_types"]) {
      if (!t.is_string()) return bad_field(src, "layer_types", "holds a non-string: " + t.dump());
      cfg.layer_types.push_back(t.get<std::string>());
    }
    if (int(cfg.layer_types.size()) != cfg.n_layers) {
      return bad_field(src, "layer_types", "has " + std::to_string(cfg.layer_types.size()) + " entries, num_hidden_layers is " +
                                               std::to_string(cfg.n_layers));
    }
  } else {
    // Older configs: derive the pattern the way those model versions did.
    cfg.layer_types.assign(size_t(cfg.n_layers), "full_attention");
    int32_t pattern = 0;
    if (present(j, "sliding_window_pattern")) STRATA_RETURN_IF_ERROR(read_int(j, "sliding_window_pattern", src, &pattern));
    if (present(j, "_sliding_window_pattern")) STRATA_RETURN_IF_ERROR(read_int(j, "_sliding_window_pattern", src, &pattern));
    for (int i = 0; i < cfg.n_layers && cfg.sliding_window > 0; ++i) {
      bool sliding = false;
      if (cfg.model_type == "gemma2") sliding = i % 2 == 0;
      else if (cfg.model_type == "gemma3_text") sliding = pattern > 0 && (i + 1) % pattern != 0;
      else if (cfg.model_type == "mistral") sliding = true;
      if (sliding) cfg.layer_types[size_t(i)] = "sliding_attention";
    }
  }
  for (const auto& t : cfg.layer_types) {
    if (t == "sliding_attention" && cfg.sliding_window <= 0) {
      return bad_field(src, "sliding_window", "must be positive when layer_types has sliding_attention");
    }
  }
  STRATA_RETURN_IF_ERROR(read_id_list(j, "eos_token_id", src, &cfg.eos_ids));
  if (cfg.eos_ids.empty()) STRATA_RETURN_IF_ERROR(read_id_list(outer, "eos_token_id", source, &cfg.eos_ids));
  STRATA_RETURN_IF_ERROR(read_single_id(j, "bos_token_id", src, &cfg.bos_id));
  STRATA_RETURN_IF_ERROR(read_single_id(j, "pad_token_id", src, &cfg.pad_id));
  auto quant = parse_quant_config(outer, source);
  if (!quant.ok()) return quant.error();
  cfg.quant = std::make_shared<const QuantConfig>(std::move(*quant));
  cfg.text_json = std::make_shared<const json>(j);
  return cfg;
}

Status apply_generation_config(const json& g, const std::string& source, ModelConfig* cfg) {
  if (!g.is_object()) return make_error(ErrorCode::kInvalidArgument, source + ": not a JSON object");
  STRATA_RETURN_IF_ERROR(read_id_list(g, "eos_token_id", source, &cfg->eos_ids));
  STRATA_RETURN_IF_ERROR(read_single_id(g, "bos_token_id", source, &cfg->bos_id));
  STRATA_RETURN_IF_ERROR(read_single_id(g, "pad_token_id", source, &cfg->pad_id));
  STRATA_RETURN_IF_ERROR(read_float(g, "temperature", source, &cfg->default_temperature));
  STRATA_RETURN_IF_ERROR(read_float(g, "top_p", source, &cfg->default_top_p));
  STRATA_RETURN_IF_ERROR(read_float(g, "min_p", source, &cfg->default_min_p));
  STRATA_RETURN_IF_ERROR(read_float(g, "repetition_penalty", source, &cfg->default_repetition_penalty));
  if (present(g, "top_k")) STRATA_RETURN_IF_ERROR(read_int(g, "top_k", source, &cfg->default_top_k));
  if (present(g, "do_sample")) {
    bool b = false;
    STRATA_RETURN_IF_ERROR(read_bool(g, "do_sample", source, &b));
    cfg->default_do_sample = b ? 1 : 0;
  }
  return Status();
}

Result<ModelConfig> load_model_config(const std::string& dir) {
  const fs::path cpath = fs::path(dir) / "config.json";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return make_error(ErrorCode::kNotFound, "model directory " + dir + " does not exist");
  if (!fs::exists(cpath, ec)) return make_error(ErrorCode::kNotFound, "no config.json in " + dir);
  auto j = read_json_file(cpath);
  if (!j.ok()) return j.error();
  auto cfg = parse_model_config(*j, cpath.string());
  if (!cfg.ok()) return cfg.error();
  const fs::path gpath = fs::path(dir) / "generation_config.json";
  if (fs::exists(gpath, ec)) {
    auto g = read_json_file(gpath);
    if (!g.ok()) return g.error();
    STRATA_RETURN_IF_ERROR(apply_generation_config(*g, gpath.string(), &*cfg));
  }
  return cfg;
}

}  // namespace strata
