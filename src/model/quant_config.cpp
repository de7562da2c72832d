#include "model/quant_config.h"

#include <nlohmann/json.hpp>

namespace strata {

using nlohmann::json;

const char* quant_format_name(QuantFormat f) {
  switch (f) {
    case QuantFormat::kNone: return "none";
    case QuantFormat::kFp8Block: return "fp8";
    case QuantFormat::kFp8Compressed: return "compressed-tensors fp8";
    case QuantFormat::kMlxAffine: return "mlx affine";
    case QuantFormat::kAwq: return "awq";
    case QuantFormat::kGptq: return "gptq";
  }
  return "?";
}

QuantGroup QuantConfig::group_of(const std::string& module) const {
  auto it = mlx_overrides.find(module);
  if (it != mlx_overrides.end()) return it->second;
  return QuantGroup{bits, group_size};
}

std::string QuantConfig::describe() const {
  std::string s = quant_format_name(format);
  switch (format) {
    case QuantFormat::kNone: return s;
    case QuantFormat::kFp8Block:
      return s + " e4m3 8-bit, block " + std::to_string(block_rows) + "x" + std::to_string(block_cols);
    case QuantFormat::kFp8Compressed: return s + " e4m3 8-bit, scale per " + fp8_strategy;
    case QuantFormat::kMlxAffine:
    case QuantFormat::kAwq:
      break;
    case QuantFormat::kGptq:
      s += std::string(gptq_sym ? " sym" : " asym") + (gptq_desc_act ? ", act-order" : "");
      break;
  }
  s += ", " + std::to_string(bits) + "-bit, group " + std::to_string(group_size);
  if (!mlx_overrides.empty()) s += " (" + std::to_string(mlx_overrides.size()) + " per-module overrides)";
  return s;
}

namespace {

Error bad(const std::string& source, const std::string& field, const std::string& what) {
  return make_error(ErrorCode::kInvalidArgument, source + ": field '" + field + "' " + what);
}

bool present(const json& j, const char* key) { return j.is_object() && j.contains(key) && !j[key].is_null(); }

Status read_int(const json& j, const char* key, const std::string& source, const std::string& path, int32_t* out) {
  if (!present(j, key)) return bad(source, path + key, "is missing");
  if (!j[key].is_number_integer()) return bad(source, path + key, "is not an integer: " + j[key].dump());
  *out = j[key].get<int32_t>();
  return Status();
}

Status read_names(const json& j, const char* key, const std::string& source, const std::string& path,
                  std::vector<std::string>* out) {
  if (!present(j, key)) return Status();
  if (!j[key].is_array()) return bad(source, path + key, "is not a list: " + j[key].dump());
  for (const auto& n : j[key]) {
    if (!n.is_string()) return bad(source, path + key, "holds a non-string: " + n.dump());
    out->push_back(n.get<std::string>());
  }
  return Status();
}

Status check_int_bits(const std::string& source, const std::string& field, int32_t bits, std::initializer_list<int32_t> ok) {
  for (int32_t b : ok) {
    if (bits == b) return Status();
  }
  std::string list;
  for (int32_t b : ok) list += (list.empty() ? "" : ", ") + std::to_string(b);
  return bad(source, field, "is " + std::to_string(bits) + ", strata supports " + list);
}

Status check_group(const std::string& source, const std::string& field, int32_t g) {
  if (g == 32 || g == 64 || g == 128) return Status();
  return bad(source, field, "is " + std::to_string(g) + ", strata supports 32, 64, 128");
}

Status parse_fp8_block(const json& q, const std::string& source, const std::string& path, QuantConfig* c) {
  c->format = QuantFormat::kFp8Block;
  c->bits = 8;
  if (present(q, "fmt") && q["fmt"] != "e4m3") return bad(source, path + "fmt", "is " + q["fmt"].dump() + ", strata supports \"e4m3\"");
  if (!present(q, "weight_block_size")) return bad(source, path + "weight_block_size", "is missing");
  const json& b = q["weight_block_size"];
  if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() || b[0].get<int64_t>() <= 0 ||
      b[1].get<int64_t>() <= 0) {
    return bad(source, path + "weight_block_size", "is not two positive integers: " + b.dump());
  }
  c->block_rows = b[0].get<int32_t>();
  c->block_cols = b[1].get<int32_t>();
  if (present(q, "activation_scheme") && q["activation_scheme"] != "dynamic") {
    return bad(source, path + "activation_scheme", "is " + q["activation_scheme"].dump() + ", strata supports \"dynamic\"");
  }
  return read_names(q, "modules_to_not_convert", source, path, &c->not_converted);
}

// compressed-tensors: one config group whose weights are float 8-bit, per tensor or channel.
Status parse_compressed(const json& q, const std::string& source, const std::string& path, QuantConfig* c) {
  const std::string fmt = present(q, "format") && q["format"].is_string() ? q["format"].get<std::string>() : "";
  if (fmt != "float-quantized" && fmt != "naive-quantized") {
    return bad(source, path + "format", "is " + (present(q, "format") ? q["format"].dump() : std::string("missing")) +
                                            ", strata supports \"float-quantized\" (FP8)");
  }
  if (!present(q, "config_groups") || !q["config_groups"].is_object() || q["config_groups"].empty()) {
    return bad(source, path + "config_groups", "is missing or empty");
  }
  c->format = QuantFormat::kFp8Compressed;
  for (const auto& [name, g] : q["config_groups"].items()) {
    const std::string gp = path + "config_groups." + name + ".weights.";
    if (!present(g, "weights")) return bad(source, path + "config_groups." + name + ".weights", "is missing");
    const json& w = g["weights"];
    int32_t bits = 0;
    STRATA_RETURN_IF_ERROR(read_int(w, "num_bits", source, gp, &bits));
    if (bits != 8) return bad(source, gp + "num_bits", "is " + std::to_string(bits) + ", strata supports 8");
    if (!present(w, "type") || w["type"] != "float") {
      return bad(source, gp + "type", "is " + (present(w, "type") ? w["type"].dump() : std::string("missing")) +
                                          ", strata supports \"float\"");
    }
    const std::string strategy = present(w, "strategy") && w["strategy"].is_string() ? w["strategy"].get<std::string>() : "";
    if (strategy != "tensor" && strategy != "channel") {
      return bad(source, gp + "strategy", "is " + (present(w, "strategy") ? w["strategy"].dump() : std::string("missing")) +
                                              ", strata supports \"tensor\", \"channel\"");
    }
    if (present(w, "symmetric") && w["symmetric"] != true) return bad(source, gp + "symmetric", "is false, strata supports true");
    if (!c->fp8_strategy.empty() && c->fp8_strategy != strategy) c->fp8_strategy = "tensor/channel";
    else c->fp8_strategy = strategy;
  }
  c->bits = 8;
  return read_names(q, "ignore", source, path, &c->not_converted);
}

Status parse_awq(const json& q, const std::string& source, const std::string& path, QuantConfig* c) {
  c->format = QuantFormat::kAwq;
  STRATA_RETURN_IF_ERROR(read_int(q, "bits", source, path, &c->bits));
  STRATA_RETURN_IF_ERROR(check_int_bits(source, path + "bits", c->bits, {4}));
  STRATA_RETURN_IF_ERROR(read_int(q, "group_size", source, path, &c->group_size));
  STRATA_RETURN_IF_ERROR(check_group(source, path + "group_size", c->group_size));
  const std::string version = present(q, "version") && q["version"].is_string() ? q["version"].get<std::string>() : "gemm";
  if (version != "gemm" && version != "GEMM") {
    return bad(source, path + "version", "is \"" + version + "\", strata supports \"gemm\"");
  }
  if (present(q, "zero_point") && q["zero_point"] != true) return bad(source, path + "zero_point", "is false, strata supports true");
  return read_names(q, "modules_to_not_convert", source, path, &c->not_converted);
}

Status parse_gptq(const json& q, const std::string& source, const std::string& path, QuantConfig* c) {
  c->format = QuantFormat::kGptq;
  STRATA_RETURN_IF_ERROR(read_int(q, "bits", source, path, &c->bits));
  STRATA_RETURN_IF_ERROR(check_int_bits(source, path + "bits", c->bits, {4, 8}));
  STRATA_RETURN_IF_ERROR(read_int(q, "group_size", source, path, &c->group_size));
  STRATA_RETURN_IF_ERROR(check_group(source, path + "group_size", c->group_size));
  if (present(q, "sym")) {
    if (!q["sym"].is_boolean()) return bad(source, path + "sym", "is not a boolean: " + q["sym"].dump());
    c->gptq_sym = q["sym"].get<bool>();
  }
  if (present(q, "desc_act")) {
    if (!q["desc_act"].is_boolean()) return bad(source, path + "desc_act", "is not a boolean: " + q["desc_act"].dump());
    c->gptq_desc_act = q["desc_act"].get<bool>();
  }
  const std::string fmt = present(q, "checkpoint_format") && q["checkpoint_format"].is_string()
                              ? q["checkpoint_format"].get<std::string>()
                              : "gptq";
  if (fmt != "gptq" && fmt != "gptq_v2") {
    return bad(source, path + "checkpoint_format", "is \"" + fmt + "\", strata supports \"gptq\", \"gptq_v2\"");
  }
  c->gptq_zero_plus_one = fmt == "gptq";
  return read_names(q, "modules_to_not_convert", source, path, &c->not_converted);
}

// mlx-lm: {"group_size", "bits", ["mode": "affine"], "<module path>": {group_size, bits} | false, ...}.
Status parse_mlx(const json& q, const std::string& source, const std::string& path, QuantConfig* c) {
  c->format = QuantFormat::kMlxAffine;
  if (present(q, "mode") && q["mode"] != "affine") return bad(source, path + "mode", "is " + q["mode"].dump() + ", strata supports \"affine\"");
  STRATA_RETURN_IF_ERROR(read_int(q, "bits", source, path, &c->bits));
  STRATA_RETURN_IF_ERROR(check_int_bits(source, path + "bits", c->bits, {2, 4, 8}));
  STRATA_RETURN_IF_ERROR(read_int(q, "group_size", source, path, &c->group_size));
  STRATA_RETURN_IF_ERROR(check_group(source, path + "group_size", c->group_size));
  for (const auto& [key, v] : q.items()) {
    if (key == "bits" || key == "group_size" || key == "mode" || key == "quant_method") continue;
    if (v.is_boolean()) {
      if (v.get<bool>()) c->mlx_overrides[key] = QuantGroup{c->bits, c->group_size};
      else c->mlx_overrides[key] = QuantGroup{0, 0};
      continue;
    }
    if (!v.is_object()) return bad(source, path + key, "is not a {group_size, bits} object or false: " + v.dump());
    QuantGroup g;
    STRATA_RETURN_IF_ERROR(read_int(v, "bits", source, path + key + ".", &g.bits));
    STRATA_RETURN_IF_ERROR(check_int_bits(source, path + key + ".bits", g.bits, {2, 4, 8}));
    STRATA_RETURN_IF_ERROR(read_int(v, "group_size", source, path + key + ".", &g.group_size));
    STRATA_RETURN_IF_ERROR(check_group(source, path + key + ".group_size", g.group_size));
    c->mlx_overrides[key] = g;
  }
  return Status();
}

}  // namespace

Result<QuantConfig> parse_quant_config(const json& config, const std::string& source) {
  QuantConfig c;
  if (!config.is_object()) return c;
  if (present(config, "quantization_config")) {
    const json& q = config["quantization_config"];
    if (!q.is_object()) return bad(source, "quantization_config", "is not an object: " + q.dump());
    if (present(q, "quant_method")) {
      if (!q["quant_method"].is_string()) return bad(source, "quantization_config.quant_method", "is not a string");
      const std::string m = q["quant_method"].get<std::string>();
      const std::string path = "quantization_config.";
      if (m == "fp8") STRATA_RETURN_IF_ERROR(parse_fp8_block(q, source, path, &c));
      else if (m == "compressed-tensors") STRATA_RETURN_IF_ERROR(parse_compressed(q, source, path, &c));
      else if (m == "awq") STRATA_RETURN_IF_ERROR(parse_awq(q, source, path, &c));
      else if (m == "gptq") STRATA_RETURN_IF_ERROR(parse_gptq(q, source, path, &c));
      else if (m == "mlx") STRATA_RETURN_IF_ERROR(parse_mlx(q, source, path, &c));
      else {
        return bad(source, "quantization_config.quant_method",
                   "is \"" + m + "\", strata supports fp8, compressed-tensors, awq, gptq (and MLX's \"quantization\")");
      }
      return c;
    }
  }
  // mlx-lm writes `quantization` (and the same object as `quantization_config`, without a quant_method).
  for (const char* key : {"quantization", "quantization_config"}) {
    if (present(config, key)) {
      if (!config[key].is_object()) return bad(source, key, "is not an object: " + config[key].dump());
      STRATA_RETURN_IF_ERROR(parse_mlx(config[key], source, std::string(key) + ".", &c));
      return c;
    }
  }
  return c;
}

}  // namespace strata
