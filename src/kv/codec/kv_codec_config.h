// KvCodecConfig: which KV codec each layer stores its cache in, from the flags
// --kv-cache-dtype (the default for every layer), --kv-config FILE (per-layer overrides) and
// --kv-quant-start N. Row formats and kernels: backend/reference/kv_codec.h and
// backend/cpu/kv_codec.h; the storage takes the resolved spec per layer (KvLayerSpec::codec).
//
// --kv-config is a JSON list of {"layer_idx": int, "codec": name, "group_size"?: int}; MLX's
// {"layer_idx", "bits", "group_size"} form is accepted too (bits 4 -> int4, 8 -> int8).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "backend/reference/kv_codec.h"
#include "core/status.h"

namespace strata {

struct KvLayerCodec {
  int32_t layer_idx = 0;
  KvCodecSpec spec;
};

struct KvCodecConfig {
  KvCodecSpec default_spec;          // --kv-cache-dtype, for layers the list does not name
  std::vector<KvLayerCodec> layers;  // --kv-config entries, ascending layer_idx, no duplicates
  // --kv-quant-start: tokens a sequence keeps in exact KV before its full blocks move to the
  // codec (0: every row in the codec from the start; kQuantStartAuto: the engine decides,
  // default_kv_quant_start in engine/engine.h).
  int32_t quant_start = 0;
  static constexpr int32_t kQuantStartAuto = -1;
};

// What resolve_kv_codecs needs to know of each layer of the model.
struct KvCodecLayerDims {
  bool has_kv = true;        // false: no attention KV (linear attention layers)
  int32_t shares_with = -1;  // >= 0: reads that layer's KV (its codec applies)
  int32_t head_dim_k = 0;
  int32_t head_dim_v = 0;
};

// "auto", "bf16", "fp8", "int8", "int4", "turbo"; `field` names the flag or key in errors.
Result<KvCodec> parse_kv_codec(std::string_view name, std::string_view field = "--kv-cache-dtype");

// Parses --kv-config text; `source` (the file name) prefixes every error.
Result<std::vector<KvLayerCodec>> parse_kv_config_json(std::string_view text, std::string_view source);
Result<std::vector<KvLayerCodec>> load_kv_config_file(const std::string& path);

// The flags together: dtype ("" = auto), config_path ("" = none), quant_start (>= 0, or
// KvCodecConfig::kQuantStartAuto).
Result<KvCodecConfig> make_kv_codec_config(std::string_view dtype, const std::string& config_path,
                                           int32_t quant_start = 0);

// --kv-quant-start's value: "auto" (KvCodecConfig::kQuantStartAuto) or a token count >= 0.
Result<int32_t> parse_kv_quant_start(std::string_view text);

// One spec per layer (group sizes filled in), checked against the model: a named layer must
// exist and own its KV; every codec must fit its layer's head dims (a group size that does not
// divide the head dim, turbo on a head dim that is not a power of two, ...).
Result<std::vector<KvCodecSpec>> resolve_kv_codecs(const KvCodecConfig& config,
                                                   const std::vector<KvCodecLayerDims>& layers);

// The part of the prefix-cache namespace that the codecs decide: blocks cached under one
// config are never handed to another. Blocks a sequence still holds in exact KV (before
// --kv-quant-start converts them) belong to codec_namespace(KvCodecConfig{}).
std::string codec_namespace(const KvCodecConfig& config);

// "int4/64", "bf16", ... (the group size only where the codec has groups and it is set).
std::string kv_codec_spec_name(const KvCodecSpec& spec);

}  // namespace strata
