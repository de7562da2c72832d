// The weight manifest of the gated-DeltaNet hybrids (model/qwen3_next.h): every tensor their
// CPU and GPU loaders read, with the dummy model's inits.
#include <algorithm>
#include <cmath>

#include "model/delta_net.h"
#include "model/qwen3_next.h"

namespace strata {

namespace {

Status positive(const char* field, int64_t v) {
  if (v > 0) return Status();
  return make_error(ErrorCode::kInvalidArgument, std::string(field) + " must be positive, got " + std::to_string(v));
}

struct Writer {
  WeightManifest* m;
  int32_t layer = -1;
  WeightEntry& add(std::string name, WeightRole role, std::vector<int64_t> shape, WeightFuse fuse = WeightFuse::kNone,
                   int32_t expert = -1) {
    WeightEntry e;
    e.name = std::move(name);
    e.role = role;
    e.layer = layer;
    e.expert = expert;
    e.shape = std::move(shape);
    e.fuse = fuse;
    m->entries.push_back(std::move(e));
    return m->entries.back();
  }
  WeightEntry& constant(std::string name, WeightRole role, int64_t n, float value) {
    WeightEntry& e = add(std::move(name), role, {n});
    e.init = WeightInit::kConstant;
    e.value = value;
    return e;
  }
  // (1 + w) RMSNorm: a dummy's unit is 0.
  WeightEntry& norm(std::string name, WeightRole role, int64_t n) { return constant(std::move(name), role, n, 0.0f); }
  WeightEntry& uniform(std::string name, WeightRole role, std::vector<int64_t> shape, float lo, float hi) {
    WeightEntry& e = add(std::move(name), role, std::move(shape));
    e.init = WeightInit::kUniform;
    e.value = lo;
    e.value_hi = hi;
    return e;
  }
};

}  // namespace

Result<HybridFamily> hybrid_family(const std::string& t) {
  if (t == "qwen3_next") return HybridFamily::kQwen3Next;
  if (t == "qwen3_5_text") return HybridFamily::kQwen35;
  if (t == "qwen3_5_moe_text") return HybridFamily::kQwen35Moe;
  return make_error(ErrorCode::kUnsupported, "model_type '" + t + "' is not a DeltaNet hybrid");
}

bool hybrid_layer_sparse(const ModelConfig& c, HybridFamily family, int64_t l) {
  if (family == HybridFamily::kQwen35Moe) return true;
  if (family != HybridFamily::kQwen3Next || c.n_experts <= 0) return false;
  return std::find(c.mlp_only_layers.begin(), c.mlp_only_layers.end(), int32_t(l)) == c.mlp_only_layers.end() &&
         (l + 1) % std::max(1, c.decoder_sparse_step) == 0;
}

Result<WeightManifest> hybrid_manifest(const ModelConfig& cfg, HybridFamily family, const WeightLoader* checkpoint) {
  auto dr = parse_delta_net_dims(cfg, "config.json");
  if (!dr.ok()) return dr.error();
  const DeltaNetDims& d = *dr;
  const int64_t H = cfg.hidden, V = cfg.vocab_size, hd = cfg.head_dim, nh = cfg.n_heads, nkv = cfg.n_kv_heads;
  STRATA_RETURN_IF_ERROR(positive("hidden_size", H));
  STRATA_RETURN_IF_ERROR(positive("vocab_size", V));
  STRATA_RETURN_IF_ERROR(positive("head_dim", hd));
  STRATA_RETURN_IF_ERROR(positive("num_attention_heads", nh));
  STRATA_RETURN_IF_ERROR(positive("num_key_value_heads", nkv));
  if (int64_t(cfg.layer_types.size()) != cfg.n_layers) {
    return make_error(ErrorCode::kInvalidArgument, "config layer_types lists " + std::to_string(cfg.layer_types.size()) +
                                                       " layers, num_hidden_layers is " + std::to_string(cfg.n_layers));
  }
  const int64_t kd = d.key_dim(), vd = d.value_dim(), nv = d.n_v_heads, nk = d.n_k_heads, r = nv / nk;
  WeightManifest m;
  // A dummy's head is tied as the config says, else named as checkpoints name it.
  m.tied_embeddings = checkpoint != nullptr ? cfg.lm_head_name.empty() : cfg.tie_embeddings;
  Writer top{&m};
  top.add("embed_tokens.weight", WeightRole::kEmbed, {V, H});
  if (!m.tied_embeddings) {
    top.add(cfg.lm_head_name.empty() ? "lm_head.weight" : cfg.lm_head_name, WeightRole::kLmHead, {V, H}).absolute = true;
  }
  top.norm("norm.weight", WeightRole::kFinalNorm, H);
  // Real checkpoints' conv kernels are kaiming-uniform over fan-in conv_kernel; A_log is the log
  // of a rate in (0, 16]; dt_bias starts at 1. A dummy drawn near those keeps the decay
  // exp(-exp(A_log) softplus(a + dt_bias)) inside (0, 1) and the state finite.
  const float conv_bound = float(1.0 / std::sqrt(double(d.conv_kernel)));
  for (int32_t l = 0; l < cfg.n_layers; ++l) {
    Writer w{&m, l};
    const std::string p = "layers." + std::to_string(l) + ".";
    w.norm(p + "input_layernorm.weight", WeightRole::kInputNorm, H);
    w.norm(p + "post_attention_layernorm.weight", WeightRole::kPostAttnNorm, H);
    const std::string& type = cfg.layer_types[size_t(l)];
    if (type == "linear_attention") {
      const std::string a = p + "linear_attn.";
      if (family == HybridFamily::kQwen3Next) {
        w.add(a + "in_proj_qkvz.weight", WeightRole::kDeltaQkvz, {nk * (2 * d.d_k + 2 * r * d.d_v), H}, WeightFuse::kDeltaInProj);
        w.add(a + "in_proj_ba.weight", WeightRole::kDeltaBa, {2 * nv, H}, WeightFuse::kDeltaInProj);
      } else {
        w.add(a + "in_proj_qkv.weight", WeightRole::kDeltaQkv, {2 * kd + vd, H}, WeightFuse::kDeltaInProj);
        w.add(a + "in_proj_z.weight", WeightRole::kDeltaZ, {vd, H}, WeightFuse::kDeltaInProj);
        w.add(a + "in_proj_b.weight", WeightRole::kDeltaB, {nv, H}, WeightFuse::kDeltaInProj);
        w.add(a + "in_proj_a.weight", WeightRole::kDeltaA, {nv, H}, WeightFuse::kDeltaInProj);
      }
      w.uniform(a + "conv1d.weight", WeightRole::kDeltaConv, {d.conv_dim(), 1, d.conv_kernel}, -conv_bound, conv_bound);
      w.constant(a + "conv1d.bias", WeightRole::kDeltaConvBias, d.conv_dim(), 0.0f).optional = true;
      w.uniform(a + "A_log", WeightRole::kDeltaALog, {nv}, 0.0f, float(std::log(16.0)));
      w.uniform(a + "dt_bias", WeightRole::kDeltaDtBias, {nv}, 0.5f, 1.5f);
      w.constant(a + "norm.weight", WeightRole::kDeltaNorm, d.d_v, 1.0f);  // plain w
      w.add(a + "out_proj.weight", WeightRole::kDeltaOut, {H, vd});
    } else if (type == "full_attention") {
      const std::string a = p + "self_attn.";
      w.add(a + "q_proj.weight", WeightRole::kQGate, {2 * nh * hd, H});
      w.add(a + "k_proj.weight", WeightRole::kK, {nkv * hd, H});
      w.add(a + "v_proj.weight", WeightRole::kV, {nkv * hd, H});
      w.add(a + "o_proj.weight", WeightRole::kO, {H, nh * hd});
      if (cfg.attention_bias) {
        w.constant(a + "q_proj.bias", WeightRole::kQGateBias, 2 * nh * hd, 0.0f);
        w.constant(a + "k_proj.bias", WeightRole::kKBias, nkv * hd, 0.0f);
        w.constant(a + "v_proj.bias", WeightRole::kVBias, nkv * hd, 0.0f);
      }
      w.norm(a + "q_norm.weight", WeightRole::kQNorm, hd);
      w.norm(a + "k_norm.weight", WeightRole::kKNorm, hd);
    } else {
      return make_error(ErrorCode::kUnsupported, "config layer_types[" + std::to_string(l) + "] is '" + type + "'; " +
                                                     cfg.model_type + " has linear_attention and full_attention layers");
    }
    const std::string f = p + "mlp.";
    if (!hybrid_layer_sparse(cfg, family, l)) {
      STRATA_RETURN_IF_ERROR(positive("intermediate_size", cfg.intermediate));
      const int64_t I = cfg.intermediate;
      w.add(f + "gate_proj.weight", WeightRole::kGate, {I, H}, WeightFuse::kGateUp);
      w.add(f + "up_proj.weight", WeightRole::kUp, {I, H}, WeightFuse::kGateUp);
      w.add(f + "down_proj.weight", WeightRole::kDown, {H, I});
      continue;
    }
    const int64_t E = cfg.n_experts, mI = cfg.moe_intermediate, sI = cfg.shared_expert_intermediate;
    STRATA_RETURN_IF_ERROR(positive("num_experts", E));
    if (cfg.n_experts_per_tok <= 0 || cfg.n_experts_per_tok > E || cfg.n_experts_per_tok > 64) {
      return make_error(ErrorCode::kInvalidArgument, "config num_experts_per_tok " + std::to_string(cfg.n_experts_per_tok) +
                                                         " must lie in [1, min(num_experts " + std::to_string(E) + ", 64)]");
    }
    STRATA_RETURN_IF_ERROR(positive("moe_intermediate_size", mI));
    STRATA_RETURN_IF_ERROR(positive("shared_expert_intermediate_size", sI));
    w.add(f + "gate.weight", WeightRole::kRouter, {E, H});
    if (checkpoint == nullptr || checkpoint->has(f + "experts.gate_up_proj")) {
      w.add(f + "experts.gate_up_proj", WeightRole::kFusedExpertsGateUp, {E, 2 * mI, H});
      w.add(f + "experts.down_proj", WeightRole::kFusedExpertsDown, {E, H, mI});
    } else {
      for (int32_t e = 0; e < E; ++e) {
        const std::string x = f + "experts." + std::to_string(e) + ".";
        w.add(x + "gate_proj.weight", WeightRole::kExpertGate, {mI, H}, WeightFuse::kExpertsGateUp, e);
        w.add(x + "up_proj.weight", WeightRole::kExpertUp, {mI, H}, WeightFuse::kExpertsGateUp, e);
        w.add(x + "down_proj.weight", WeightRole::kExpertDown, {H, mI}, WeightFuse::kExpertsDown, e);
      }
    }
    const std::string s = f + "shared_expert.";
    w.add(s + "gate_proj.weight", WeightRole::kSharedGate, {sI, H}, WeightFuse::kSharedGateUp);
    w.add(s + "up_proj.weight", WeightRole::kSharedUp, {sI, H}, WeightFuse::kSharedGateUp);
    w.add(s + "down_proj.weight", WeightRole::kSharedDown, {H, sI});
    w.add(f + "shared_expert_gate.weight", WeightRole::kSharedExpertGate, {1, H});
  }
  return m;
}

}  // namespace strata
