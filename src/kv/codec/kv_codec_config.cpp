#include "kv/codec/kv_codec_config.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace strata {

namespace {

Error bad(std::string msg) { return make_error(ErrorCode::kInvalidArgument, std::move(msg)); }

bool has_groups(KvCodec c) { return c == KvCodec::kInt8 || c == KvCodec::kInt4 || c == KvCodec::kTurbo; }

}  // namespace

Result<KvCodec> parse_kv_codec(std::string_view name, std::string_view field) {
  for (KvCodec c : {KvCodec::kAuto, KvCodec::kBf16, KvCodec::kFp8, KvCodec::kInt8, KvCodec::kInt4, KvCodec::kTurbo}) {
    if (name == kv_codec_name(c)) return c;
  }
  return bad(std::string(field) + ": unknown KV codec '" + std::string(name) +
             "' (expected auto, bf16, fp8, int8, int4 or turbo)");
}

std::string kv_codec_spec_name(const KvCodecSpec& spec) {
  std::string s = kv_codec_name(spec.codec);
  if (has_groups(spec.codec) && spec.group_size > 0) {
    s += '/';
    s += std::to_string(spec.group_size);
  }
  if (spec.part == KvCodecPart::kKeysOnly) s += "(keys)";
  if (spec.part == KvCodecPart::kValuesOnly) s += "(values)";
  return s;
}

Result<std::vector<KvLayerCodec>> parse_kv_config_json(std::string_view text, std::string_view source) {
  const std::string src(source);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad(src + ": not valid JSON");
  if (!j.is_array()) return bad(src + ": expected a JSON list of {layer_idx, codec | bits, group_size?} entries");
  std::vector<KvLayerCodec> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const nlohmann::json& e = j[i];
    const std::string where = src + ": entry " + std::to_string(i);
    if (!e.is_object()) return bad(where + ": expected an object, got " + e.dump());
    for (const auto& [key, value] : e.items()) {
      if (key != "layer_idx" && key != "codec" && key != "bits" && key != "group_size") {
        return bad(where + ": unknown field \"" + key + "\" (expected layer_idx, codec, bits, group_size)");
      }
    }
    KvLayerCodec lc;
    if (!e.contains("layer_idx")) return bad(where + ": missing \"layer_idx\"");
    const auto& li = e["layer_idx"];
    if (!li.is_number_integer() || li.get<int64_t>() < 0 || li.get<int64_t>() > INT32_MAX) {
      return bad(where + ": \"layer_idx\" is " + li.dump() + "; expected an integer >= 0");
    }
    lc.layer_idx = int32_t(li.get<int64_t>());
    const bool has_codec = e.contains("codec"), has_bits = e.contains("bits");
    if (!has_codec && !has_bits) return bad(where + ": needs \"codec\" or \"bits\"");
    if (has_codec) {
      if (!e["codec"].is_string()) return bad(where + ": \"codec\" is " + e["codec"].dump() + "; expected a string");
      auto c = parse_kv_codec(e["codec"].get<std::string>(), where + ": \"codec\"");
      if (!c.ok()) return c.error();
      lc.spec.codec = *c;
    }
    if (has_bits) {
      const auto& b = e["bits"];
      if (!b.is_number_integer() || (b.get<int64_t>() != 4 && b.get<int64_t>() != 8)) {
        return bad(where + ": \"bits\" is " + b.dump() + "; expected 4 or 8");
      }
      const KvCodec c = b.get<int64_t>() == 4 ? KvCodec::kInt4 : KvCodec::kInt8;
      if (has_codec && lc.spec.codec != c) {
        return bad(where + ": \"bits\" " + b.dump() + " contradicts \"codec\" " + e["codec"].dump());
      }
      lc.spec.codec = c;
    }
    if (e.contains("group_size")) {
      const auto& g = e["group_size"];
      if (!g.is_number_integer() || g.get<int64_t>() <= 0 || g.get<int64_t>() > 4096) {
        return bad(where + ": \"group_size\" is " + g.dump() + "; expected a positive integer");
      }
      if (!has_groups(lc.spec.codec)) {
        return bad(where + ": \"group_size\" applies to int8, int4 and turbo, not " + kv_codec_name(lc.spec.codec));
      }
      lc.spec.group_size = int32_t(g.get<int64_t>());
    }
    for (const auto& prev : out) {
      if (prev.layer_idx == lc.layer_idx) {
        return bad(where + ": layer_idx " + std::to_string(lc.layer_idx) + " appears twice");
      }
    }
    out.push_back(lc);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.layer_idx < b.layer_idx; });
  return out;
}

Result<std::vector<KvLayerCodec>> load_kv_config_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error(ErrorCode::kNotFound, "--kv-config: cannot open '" + path + "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  return parse_kv_config_json(ss.str(), "--kv-config " + path);
}

Result<KvCodecConfig> make_kv_codec_config(std::string_view dtype, const std::string& config_path,
                                           int32_t quant_start) {
  KvCodecConfig c;
  if (!dtype.empty()) {
    auto codec = parse_kv_codec(dtype);
    if (!codec.ok()) return codec.error();
    c.default_spec.codec = *codec;
  }
  if (!config_path.empty()) {
    auto layers = load_kv_config_file(config_path);
    if (!layers.ok()) return layers.error();
    c.layers = std::move(*layers);
  }
  if (quant_start < 0 && quant_start != KvCodecConfig::kQuantStartAuto) {
    return bad("--kv-quant-start: " + std::to_string(quant_start) + " is negative");
  }
  c.quant_start = quant_start;
  return c;
}

Result<int32_t> parse_kv_quant_start(std::string_view text) {
  if (text == "auto") return KvCodecConfig::kQuantStartAuto;
  int64_t v = 0;
  bool digits = !text.empty() && text.size() <= 9;
  for (char ch : text) {
    if (ch < '0' || ch > '9') digits = false;
    else v = v * 10 + (ch - '0');
  }
  if (!digits) return bad("--kv-quant-start: '" + std::string(text) + "' is neither 'auto' nor a token count >= 0");
  return int32_t(v);
}

Result<std::vector<KvCodecSpec>> resolve_kv_codecs(const KvCodecConfig& config,
                                                   const std::vector<KvCodecLayerDims>& layers) {
  std::vector<KvCodecSpec> out(layers.size(), config.default_spec);
  for (const auto& lc : config.layers) {
    const std::string where = "--kv-config: layer_idx " + std::to_string(lc.layer_idx);
    if (size_t(lc.layer_idx) >= layers.size()) {
      return bad(where + " does not exist (the model has " + std::to_string(layers.size()) + " layers)");
    }
    const KvCodecLayerDims& d = layers[size_t(lc.layer_idx)];
    if (!d.has_kv) return bad(where + " has no attention KV cache");
    if (d.shares_with >= 0) {
      return bad(where + " reads layer " + std::to_string(d.shares_with) + "'s KV; set the codec on layer " +
                 std::to_string(d.shares_with));
    }
    out[size_t(lc.layer_idx)] = lc.spec;
  }
  for (size_t l = 0; l < layers.size(); ++l) {
    const KvCodecLayerDims& d = layers[l];
    KvCodecSpec& s = out[l];
    if (!d.has_kv || d.shares_with >= 0) {
      s = KvCodecSpec{};  // the owner's codec applies
      continue;
    }
    if (has_groups(s.codec) && s.group_size == 0) s.group_size = kv_default_group(s.codec, d.head_dim_k);
    for (const KvRowFormat& f : {kv_key_format(s, d.head_dim_k), kv_value_format(s, d.head_dim_v)}) {
      const std::string problem = kv_format_problem(f);
      if (!problem.empty()) {
        const bool named = std::any_of(config.layers.begin(), config.layers.end(),
                                       [&](const KvLayerCodec& lc) { return size_t(lc.layer_idx) == l; });
        return bad(std::string(named ? "--kv-config" : "--kv-cache-dtype") + ": codec " + kv_codec_spec_name(s) +
                   " on layer " + std::to_string(l) + " (head dim " + std::to_string(f.dim) + "): " + problem);
      }
    }
  }
  return out;
}

std::string codec_namespace(const KvCodecConfig& config) {
  std::string s = "kv:";
  s += kv_codec_spec_name(config.default_spec);
  for (const auto& lc : config.layers) {
    if (lc.spec == config.default_spec) continue;
    s += ';';
    s += std::to_string(lc.layer_idx);
    s += '=';
    s += kv_codec_spec_name(lc.spec);
  }
  return s;
}

}  // namespace strata
