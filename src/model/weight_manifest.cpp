#include "model/weight_manifest.h"

#include <algorithm>

#include "model/decoder.h"

namespace strata {

std::vector<const WeightEntry*> WeightManifest::of_layer(int32_t layer) const {
  std::vector<const WeightEntry*> v;
  for (const auto& e : entries) {
    if (e.layer == layer) v.push_back(&e);
  }
  return v;
}

const WeightEntry* WeightManifest::find(WeightRole role, int32_t layer, int32_t expert) const {
  for (const auto& e : entries) {
    if (e.role == role && e.layer == layer && e.expert == expert) return &e;
  }
  return nullptr;
}

bool decoder_layer_sparse(const ModelConfig& c, const DecoderSpec& spec, int64_t l) {
  return spec.moe && c.n_experts > 0 &&
         std::find(c.mlp_only_layers.begin(), c.mlp_only_layers.end(), int32_t(l)) == c.mlp_only_layers.end() &&
         (l + 1) % std::max(1, c.decoder_sparse_step) == 0;
}

namespace {

// Appends entries of one layer (or the model, layer -1).
struct ManifestWriter {
  WeightManifest* m;
  int32_t layer;
  float norm_unit;
  void matrix(std::string name, WeightRole role, int64_t rows, int64_t cols, WeightFuse fuse = WeightFuse::kNone,
              int32_t expert = -1) {
    WeightEntry e;
    e.name = std::move(name);
    e.role = role;
    e.layer = layer;
    e.expert = expert;
    e.shape = {rows, cols};
    e.fuse = fuse;
    m->entries.push_back(std::move(e));
  }
  void vector(std::string name, WeightRole role, int64_t n, WeightInit init, float value, WeightFuse fuse = WeightFuse::kNone) {
    WeightEntry e;
    e.name = std::move(name);
    e.role = role;
    e.layer = layer;
    e.shape = {n};
    e.fuse = fuse;
    e.init = init;
    e.value = value;
    m->entries.push_back(std::move(e));
  }
  void norm(std::string name, WeightRole role, int64_t n) { vector(std::move(name), role, n, WeightInit::kConstant, norm_unit); }
  void bias(std::string name, WeightRole role, int64_t n, WeightFuse fuse = WeightFuse::kNone) {
    vector(std::move(name), role, n, WeightInit::kConstant, 0.0f, fuse);
  }
};

Status check_positive(const char* field, int64_t v) {
  if (v > 0) return Status();
  return make_error(ErrorCode::kInvalidArgument, std::string(field) + " must be positive, got " + std::to_string(v));
}

}  // namespace

Result<WeightManifest> decoder_manifest(const ModelConfig& cfg, const DecoderSpec& spec) {
  const int64_t H = cfg.hidden, V = cfg.vocab_size, hd = cfg.head_dim;
  const int64_t nh = cfg.n_heads, nkv = cfg.n_kv_heads;
  STRATA_RETURN_IF_ERROR(check_positive("hidden_size", H));
  STRATA_RETURN_IF_ERROR(check_positive("vocab_size", V));
  STRATA_RETURN_IF_ERROR(check_positive("head_dim", hd));
  STRATA_RETURN_IF_ERROR(check_positive("num_attention_heads", nh));
  STRATA_RETURN_IF_ERROR(check_positive("num_key_value_heads", nkv));
  WeightManifest m;
  m.tied_embeddings = cfg.tie_embeddings;
  const float unit = spec.norm_one_plus_w ? 0.0f : 1.0f;
  ManifestWriter top{&m, -1, unit};
  top.matrix("embed_tokens.weight", WeightRole::kEmbed, V, H);
  if (!m.tied_embeddings) {
    top.matrix(cfg.lm_head_name.empty() ? "lm_head.weight" : cfg.lm_head_name, WeightRole::kLmHead, V, H);
    m.entries.back().absolute = true;
  }
  top.norm("norm.weight", WeightRole::kFinalNorm, H);
  for (int32_t l = 0; l < cfg.n_layers; ++l) {
    ManifestWriter w{&m, l, unit};
    const std::string p = "layers." + std::to_string(l) + ".";
    const std::string a = p + "self_attn.";
    w.norm(p + "input_layernorm.weight", WeightRole::kInputNorm, H);
    w.norm(p + "post_attention_layernorm.weight", WeightRole::kPostAttnNorm, H);
    if (spec.sandwich_norms) {
      w.norm(p + "pre_feedforward_layernorm.weight", WeightRole::kPreFfnNorm, H);
      w.norm(p + "post_feedforward_layernorm.weight", WeightRole::kPostFfnNorm, H);
    }
    w.matrix(a + "q_proj.weight", WeightRole::kQ, nh * hd, H, WeightFuse::kQkv);
    w.matrix(a + "k_proj.weight", WeightRole::kK, nkv * hd, H, WeightFuse::kQkv);
    w.matrix(a + "v_proj.weight", WeightRole::kV, nkv * hd, H, WeightFuse::kQkv);
    w.matrix(a + "o_proj.weight", WeightRole::kO, H, nh * hd);
    if (spec.qkv_bias) {
      w.bias(a + "q_proj.bias", WeightRole::kQBias, nh * hd, WeightFuse::kQkvBias);
      w.bias(a + "k_proj.bias", WeightRole::kKBias, nkv * hd, WeightFuse::kQkvBias);
      w.bias(a + "v_proj.bias", WeightRole::kVBias, nkv * hd, WeightFuse::kQkvBias);
    }
    if (spec.o_bias) w.bias(a + "o_proj.bias", WeightRole::kOBias, H);
    if (spec.qk_norm) {
      w.norm(a + "q_norm.weight", WeightRole::kQNorm, hd);
      w.norm(a + "k_norm.weight", WeightRole::kKNorm, hd);
    }
    if (decoder_layer_sparse(cfg, spec, l)) {
      const int64_t E = cfg.n_experts, mI = cfg.moe_intermediate;
      if (cfg.n_experts_per_tok <= 0 || cfg.n_experts_per_tok > cfg.n_experts || cfg.n_experts_per_tok > 64) {
        return make_error(ErrorCode::kInvalidArgument, "num_experts_per_tok " + std::to_string(cfg.n_experts_per_tok) +
                                                           " must lie in [1, min(num_experts " + std::to_string(cfg.n_experts) + ", 64)]");
      }
      STRATA_RETURN_IF_ERROR(check_positive("moe_intermediate_size", mI));
      w.matrix(p + "mlp.gate.weight", WeightRole::kRouter, E, H);
      for (int32_t e = 0; e < E; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        w.matrix(x + "gate_proj.weight", WeightRole::kExpertGate, mI, H, WeightFuse::kExpertsGateUp, e);
        w.matrix(x + "up_proj.weight", WeightRole::kExpertUp, mI, H, WeightFuse::kExpertsGateUp, e);
        w.matrix(x + "down_proj.weight", WeightRole::kExpertDown, H, mI, WeightFuse::kExpertsDown, e);
      }
    } else {
      const int64_t I = cfg.intermediate;
      STRATA_RETURN_IF_ERROR(check_positive("intermediate_size", I));
      w.matrix(p + "mlp.gate_proj.weight", WeightRole::kGate, I, H, WeightFuse::kGateUp);
      w.matrix(p + "mlp.up_proj.weight", WeightRole::kUp, I, H, WeightFuse::kGateUp);
      w.matrix(p + "mlp.down_proj.weight", WeightRole::kDown, H, I);
      if (spec.mlp_bias) {
        w.bias(p + "mlp.gate_proj.bias", WeightRole::kGateBias, I);
        w.bias(p + "mlp.up_proj.bias", WeightRole::kUpBias, I);
        w.bias(p + "mlp.down_proj.bias", WeightRole::kDownBias, H);
      }
    }
  }
  return m;
}

}  // namespace strata
