#include "model/gemma4_config.h"

#include <string>

#include <nlohmann/json.hpp>

namespace strata {

namespace {

Error bad(const std::string& key, const std::string& why) {
  return make_error(ErrorCode::kInvalidArgument, "gemma4_text config: " + key + " " + why);
}

// An integer key that may be absent or null (then `fallback`).
Result<int64_t> int_or(const nlohmann::json& j, const std::string& key, int64_t fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number_integer()) return bad(key, "must be an integer, got " + it->dump());
  return it->get<int64_t>();
}

Result<bool> bool_or(const nlohmann::json& j, const std::string& key, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return bad(key, "must be a boolean, got " + it->dump());
  return it->get<bool>();
}

template <class T>
Status take(Result<T> r, T* out) {
  if (!r.ok()) return r.error();
  *out = std::move(*r);
  return Status();
}

}  // namespace

Result<Gemma4TextConfig> parse_gemma4_text_config(const ModelConfig& cfg) {
  if (cfg.text_json == nullptr || !cfg.text_json->is_object()) return bad("(text config)", "is missing");
  const nlohmann::json& j = *cfg.text_json;
  Gemma4TextConfig c;
  int64_t ple = 0, ple_vocab = 0, shared = 0, top_k = 0, global_hd = 0, global_kv = 0;
  bool k_eq_v = false;
  STRATA_RETURN_IF_ERROR(take(int_or(j, "hidden_size_per_layer_input", 0), &ple));
  STRATA_RETURN_IF_ERROR(take(int_or(j, "vocab_size_per_layer_input", cfg.vocab_size), &ple_vocab));
  STRATA_RETURN_IF_ERROR(take(int_or(j, "num_kv_shared_layers", 0), &shared));
  STRATA_RETURN_IF_ERROR(take(int_or(j, "top_k_experts", 0), &top_k));
  // Before per_layer_config existed, full layers' geometry was spelled with these two keys.
  STRATA_RETURN_IF_ERROR(take(int_or(j, "global_head_dim", 0), &global_hd));
  STRATA_RETURN_IF_ERROR(take(int_or(j, "num_global_key_value_heads", 0), &global_kv));
  STRATA_RETURN_IF_ERROR(take(bool_or(j, "attention_k_eq_v", false), &k_eq_v));
  STRATA_RETURN_IF_ERROR(take(bool_or(j, "use_double_wide_mlp", false), &c.double_wide_mlp));
  STRATA_RETURN_IF_ERROR(take(bool_or(j, "enable_moe_block", false), &c.moe));
  if (auto b = j.find("use_bidirectional_attention"); b != j.end() && !b->is_null() && *b != false) {
    return make_error(ErrorCode::kUnsupported,
                      "gemma4_text config: use_bidirectional_attention " + b->dump() + " is not supported (causal only)");
  }
  if (ple < 0) return bad("hidden_size_per_layer_input", "must be >= 0, got " + std::to_string(ple));
  if (ple > 0 && ple_vocab <= 0) return bad("vocab_size_per_layer_input", "must be positive, got " + std::to_string(ple_vocab));
  if (shared < 0 || shared >= cfg.n_layers) {
    return bad("num_kv_shared_layers", "must lie in [0, num_hidden_layers), got " + std::to_string(shared));
  }
  c.ple_dim = int32_t(ple);
  c.ple_vocab = int32_t(ple_vocab);
  c.n_kv_shared_layers = int32_t(shared);
  c.top_k = int32_t(top_k);
  if (c.moe) {
    if (cfg.n_experts <= 0) return bad("num_experts", "must be positive with enable_moe_block");
    if (cfg.moe_intermediate <= 0) return bad("moe_intermediate_size", "must be positive with enable_moe_block");
    if (c.top_k <= 0 || c.top_k > cfg.n_experts || c.top_k > 64) {
      return bad("top_k_experts", "must lie in [1, min(num_experts, 64)], got " + std::to_string(c.top_k));
    }
  }

  const nlohmann::json* per_layer = nullptr;
  if (auto pl = j.find("per_layer_config"); pl != j.end() && !pl->is_null()) {
    if (!pl->is_object()) return bad("per_layer_config", "must be an object keyed by layer index");
    per_layer = &*pl;
  }
  c.layers.resize(size_t(cfg.n_layers));
  for (int32_t l = 0; l < cfg.n_layers; ++l) {
    Gemma4LayerGeometry& g = c.layers[size_t(l)];
    const std::string type = cfg.layer_types.empty() ? "full_attention" : cfg.layer_types[size_t(l)];
    if (type != "sliding_attention" && type != "full_attention") {
      return bad("layer_types[" + std::to_string(l) + "]", "'" + type + "' is not sliding_attention or full_attention");
    }
    g.sliding = type == "sliding_attention";
    g.n_heads = cfg.n_heads;
    g.head_dim = (!g.sliding && global_hd > 0) ? int32_t(global_hd) : cfg.head_dim;
    g.k_eq_v = k_eq_v && !g.sliding;
    g.n_kv_heads = (g.k_eq_v && global_kv > 0) ? int32_t(global_kv) : cfg.n_kv_heads;
    if (per_layer != nullptr) {
      auto e = per_layer->find(std::to_string(l));
      if (e != per_layer->end() && !e->is_null()) {
        const std::string where = "per_layer_config." + std::to_string(l) + ".";
        if (!e->is_object()) return bad(where.substr(0, where.size() - 1), "must be an object");
        int64_t hd = g.head_dim, nh = g.n_heads, nkv = g.n_kv_heads;
        auto field = [&](const char* key, int64_t* v) -> Status {
          auto r = int_or(*e, key, *v);
          if (!r.ok()) return bad(where + key, "must be an integer, got " + (*e)[key].dump());
          *v = *r;
          return Status();
        };
        STRATA_RETURN_IF_ERROR(field("head_dim", &hd));
        STRATA_RETURN_IF_ERROR(field("num_attention_heads", &nh));
        STRATA_RETURN_IF_ERROR(field("num_key_value_heads", &nkv));
        g.head_dim = int32_t(hd);
        g.n_heads = int32_t(nh);
        g.n_kv_heads = int32_t(nkv);
      }
    }
    const std::string where = "layer " + std::to_string(l);
    if (g.head_dim <= 0 || g.head_dim % 2 != 0) {
      return bad(where + " head_dim", "must be even and positive, got " + std::to_string(g.head_dim));
    }
    if (g.n_heads <= 0 || g.n_kv_heads <= 0 || g.n_heads % g.n_kv_heads != 0) {
      return bad(where + " num_attention_heads / num_key_value_heads",
                 "must be positive with the heads a multiple of the KV heads, got " + std::to_string(g.n_heads) + " / " +
                     std::to_string(g.n_kv_heads));
    }
  }

  // The last num_kv_shared_layers layers reuse the KV of the last earlier layer of their type.
  const int32_t first_shared = cfg.n_layers - c.n_kv_shared_layers;
  for (int32_t l = first_shared; l < cfg.n_layers && c.n_kv_shared_layers > 0; ++l) {
    Gemma4LayerGeometry& g = c.layers[size_t(l)];
    for (int32_t s = first_shared - 1; s >= 0 && g.kv_source < 0; --s) {
      if (c.layers[size_t(s)].sliding == g.sliding) g.kv_source = s;
    }
    if (g.kv_source < 0) {
      return bad("num_kv_shared_layers", "makes layer " + std::to_string(l) +
                                             " share KV, but no earlier layer has its type");
    }
    const Gemma4LayerGeometry& src = c.layers[size_t(g.kv_source)];
    if (src.head_dim != g.head_dim || src.n_kv_heads != g.n_kv_heads || src.k_eq_v != g.k_eq_v) {
      return bad("per_layer_config", "gives layer " + std::to_string(l) + " a KV geometry unlike layer " +
                                         std::to_string(g.kv_source) + ", whose KV it shares");
    }
  }
  return c;
}

Result<WeightManifest> gemma4_manifest(const ModelConfig& cfg, const Gemma4TextConfig& g4) {
  const int64_t H = cfg.hidden, V = cfg.vocab_size, nL = cfg.n_layers, D = g4.ple_dim;
  if (H <= 0 || V <= 0) return make_error(ErrorCode::kInvalidArgument, "gemma4_text config: hidden_size and vocab_size must be positive");
  if (int64_t(g4.layers.size()) != nL) return make_error(ErrorCode::kInvalidArgument, "gemma4_text config: one geometry per layer");
  WeightManifest m;
  int32_t layer = -1;
  // RMSNorm here scales by plain w: a dummy's norms hold 1.
  auto add = [&](std::string name, WeightRole role, std::vector<int64_t> shape, bool norm = false) -> WeightEntry& {
    WeightEntry e;
    e.name = std::move(name);
    e.role = role;
    e.layer = layer;
    e.shape = std::move(shape);
    if (norm) {
      e.init = WeightInit::kConstant;
      e.value = 1.0f;
    }
    m.entries.push_back(std::move(e));
    return m.entries.back();
  };
  add("embed_tokens.weight", WeightRole::kEmbed, {V, H});
  m.tied_embeddings = cfg.lm_head_name.empty();
  if (!m.tied_embeddings) add(cfg.lm_head_name, WeightRole::kLmHead, {V, H}).absolute = true;
  add("norm.weight", WeightRole::kFinalNorm, {H}, true);
  if (D > 0) {
    add("embed_tokens_per_layer.weight", WeightRole::kPleEmbed, {g4.ple_vocab, nL * D});
    add("per_layer_model_projection.weight", WeightRole::kPleModelProj, {nL * D, H});
    add("per_layer_projection_norm.weight", WeightRole::kPleProjNorm, {D}, true);
  }
  for (layer = 0; layer < int32_t(nL); ++layer) {
    const Gemma4LayerGeometry& g = g4.layers[size_t(layer)];
    const int64_t hd = g.head_dim, q_rows = int64_t(g.n_heads) * hd, kv_rows = int64_t(g.n_kv_heads) * hd;
    const std::string p = "layers." + std::to_string(layer) + ".";
    const std::string a = p + "self_attn.";
    add(p + "input_layernorm.weight", WeightRole::kInputNorm, {H}, true);
    add(p + "post_attention_layernorm.weight", WeightRole::kPostAttnNorm, {H}, true);
    add(p + "pre_feedforward_layernorm.weight", WeightRole::kPreFfnNorm, {H}, true);
    add(p + "post_feedforward_layernorm.weight", WeightRole::kPostFfnNorm, {H}, true);
    add(a + "q_proj.weight", WeightRole::kQ, {q_rows, H});
    if (g.kv_source < 0) {
      // KV-shared layers' checkpoints may still carry k/v tensors; they are not read.
      add(a + "k_proj.weight", WeightRole::kK, {kv_rows, H});
      if (!g.k_eq_v) add(a + "v_proj.weight", WeightRole::kV, {kv_rows, H});
      add(a + "k_norm.weight", WeightRole::kKNorm, {hd}, true);
    }
    add(a + "o_proj.weight", WeightRole::kO, {H, q_rows});
    add(a + "q_norm.weight", WeightRole::kQNorm, {hd}, true);
    const int64_t inter = int64_t(cfg.intermediate) * (g4.double_wide_mlp && g.kv_source >= 0 ? 2 : 1);
    if (inter <= 0) return make_error(ErrorCode::kInvalidArgument, "gemma4_text config: intermediate_size must be positive");
    add(p + "mlp.gate_proj.weight", WeightRole::kGate, {inter, H});
    add(p + "mlp.up_proj.weight", WeightRole::kUp, {inter, H});
    add(p + "mlp.down_proj.weight", WeightRole::kDown, {H, inter});
    if (g4.moe) {
      const int64_t E = cfg.n_experts, mI = cfg.moe_intermediate;
      if (E <= 0 || mI <= 0) {
        return make_error(ErrorCode::kInvalidArgument, "gemma4_text config: num_experts and moe_intermediate_size must be positive");
      }
      add(p + "router.proj.weight", WeightRole::kRouter, {E, H});
      add(p + "router.scale", WeightRole::kRouterScale, {H}, true);
      add(p + "router.per_expert_scale", WeightRole::kExpertScale, {E}, true);
      add(p + "experts.gate_up_proj", WeightRole::kFusedExpertsGateUp, {E, 2 * mI, H});
      add(p + "experts.down_proj", WeightRole::kFusedExpertsDown, {E, H, mI});
      add(p + "post_feedforward_layernorm_1.weight", WeightRole::kMoePostMlpNorm, {H}, true);
      add(p + "pre_feedforward_layernorm_2.weight", WeightRole::kMoePreNorm, {H}, true);
      add(p + "post_feedforward_layernorm_2.weight", WeightRole::kMoePostNorm, {H}, true);
    }
    if (D > 0) {
      add(p + "per_layer_input_gate.weight", WeightRole::kPleGate, {D, H});
      add(p + "per_layer_projection.weight", WeightRole::kPleProj, {H, D});
      add(p + "post_per_layer_input_norm.weight", WeightRole::kPleNorm, {H}, true);
    }
    // layer_scalar is a buffer: checkpoints written before it existed leave it at 1.
    add(p + "layer_scalar", WeightRole::kLayerScalar, {1}, true).optional = true;
  }
  return m;
}

}  // namespace strata
