// Gemma 4 text (gemma4_text), as transformers' Gemma4ForCausalLM computes it. Tensor names
// are under the config's weight prefix ("model." for Gemma4ForCausalLM).
//
// RMSNorm here is x * (mean(x^2) + eps)^-0.5 * w: plain w, not Gemma 2/3's (1 + w); "no
// scale" norms omit w. GELU is the tanh approximation (gelu_pytorch_tanh).
//
// Embeddings
//   x   = embed_tokens[ids] * sqrt(hidden)                       [n, hidden]
//   Per-layer inputs (when hidden_size_per_layer_input = D > 0), L = num_hidden_layers:
//   tok = embed_tokens_per_layer[ids] * sqrt(D)                  [n, L, D]
//   ctx = rmsnorm_D(per_layer_model_projection(x) * hidden^-0.5) [n, L, D] (per_layer_projection_norm)
//   ple = (ctx + tok) * 2^-0.5                                   [n, L, D]; layer l reads ple[:, l, :]
// Layer l (geometry from per_layer_config: full layers may have their own head_dim / heads)
//   a   = input_layernorm(x)
//   q   = rope(q_norm(q_proj(a)))        per head; attention scale 1 (the norms set the scale)
//   k   = rope(k_norm(k_proj(a)))        per KV head
//   v   = v_norm(v_proj(a))              no-scale norm; with attention_k_eq_v (full layers)
//                                         v is normed from the raw k projection, no v_proj
//   KV-shared layers (the last num_kv_shared_layers) compute no k/v: they attend over the KV
//   of the last earlier layer of their own type (kv_layout: shares_with), which that layer
//   wrote earlier in this same forward.
//   o   = o_proj(attention(q, k, v))      causal; sliding layers see the last sliding_window
//                                         positions (p > t - window)
//   x   = x + post_attention_layernorm(o)
//   m   = mlp(pre_feedforward_layernorm(x))                     gate/up/down, GELU-tanh
//   MoE block (enable_moe_block), from the same residual x:
//     r       = rmsnorm_noscale(x) * router.scale * hidden^-0.5
//     p       = softmax(router.proj(r)); top_k_experts by p, renormalized to sum 1,
//               each weight then times router.per_expert_scale[expert]
//     e       = sum_k w_k * expert_k(pre_feedforward_layernorm_2(x))
//               expert: gate_up = experts.gate_up_proj[e] [2I, H] (gate rows first, then up),
//               down = experts.down_proj[e] [H, I]: down(gelu(gate) * up)
//     m       = post_feedforward_layernorm_1(m) + post_feedforward_layernorm_2(e)
//   x   = x + post_feedforward_layernorm(m)
//   Per-layer input (D > 0):
//   x   = x + post_per_layer_input_norm(per_layer_projection(gelu(per_layer_input_gate(x)) * ple[:, l, :]))
//   x   = x * layer_scalar
// Head
//   logits = lm_head(norm(x)) (tied to embed_tokens unless the checkpoint has lm_head.weight),
//   then cap * tanh(logits / cap) when final_logit_softcapping is set.
// RoPE per layer type from rope_parameters: sliding layers `default` over their head_dim, full
// layers `proportional` (only the first partial_rotary_factor of the frequency pairs rotate,
// with exponents over the whole head_dim).
#include "model/gemma4.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_ops.h"
#include "core/check.h"
#include "model/gemma4_config.h"
#include "model/layers/lm_head.h"
#include "model/layers/attention.h"
#include "model/layers/embedding.h"
#include "model/layers/mlp.h"
#include "model/layers/moe.h"
#include "model/layers/ops.h"
#include "model/rope.h"

namespace strata {

namespace {

struct Gemma4Moe {
  WeightMatrix router;                   // [n_experts, hidden]
  std::vector<float> router_scale;       // [hidden] router.scale * hidden^-0.5
  std::vector<float> per_expert_scale;   // [n_experts]
  std::vector<GatedMlpWeights> experts;  // [n_experts], views into the fused tensors
  std::vector<float> post_mlp_norm;      // [hidden] post_feedforward_layernorm_1
  std::vector<float> pre_norm;           // [hidden] pre_feedforward_layernorm_2
  std::vector<float> post_norm;          // [hidden] post_feedforward_layernorm_2
};

struct Gemma4Layer {
  Gemma4LayerGeometry geo;
  int rope_index = 0;
  AttentionWeights attn;                 // k/v empty on KV-shared layers, v empty with k_eq_v
  AttentionParams params;
  std::vector<float> input_norm;         // [hidden]
  std::vector<float> post_attn_norm;     // [hidden]
  std::vector<float> pre_ffn_norm;       // [hidden]
  std::vector<float> post_ffn_norm;      // [hidden]
  GatedMlpWeights mlp;
  std::unique_ptr<Gemma4Moe> moe;
  WeightMatrix ple_gate;                 // [D, hidden] per_layer_input_gate
  WeightMatrix ple_proj;                 // [hidden, D] per_layer_projection
  std::vector<float> ple_norm;           // [hidden] post_per_layer_input_norm
  float layer_scalar = 1.0f;
};

class Gemma4Model : public Model {
 public:
  Gemma4Model(ModelConfig cfg, ThreadPool& pool, Gemma4TextConfig g4)
      : Model(std::move(cfg), pool), g4_(std::move(g4)) {}

  std::vector<KvLayerSpec> kv_layout() const override {
    std::vector<KvLayerSpec> v(layers_.size());
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Gemma4LayerGeometry& g = layers_[l].geo;
      v[l].n_kv_heads = g.n_kv_heads;
      v[l].head_dim_k = g.head_dim;
      v[l].head_dim_v = g.head_dim;
      v[l].window = layers_[l].params.window;
      v[l].shares_with = g.kv_source;
    }
    return v;
  }

  void forward(const StepBatch& batch, KvStorage& kv, StateStorage* state, float* logits) override;

  Gemma4TextConfig g4_;
  std::shared_ptr<const SafetensorsArchive> archive_;  // keeps aliased weights mapped
  EmbeddingTable embed_;
  float embed_scale_ = 1.0f;
  EmbeddingTable ple_embed_;             // [ple_vocab, L * D]
  float ple_embed_scale_ = 1.0f;
  WeightMatrix ple_model_proj_;          // [L * D, hidden]
  std::vector<float> ple_proj_norm_;     // [D]
  std::vector<float> final_norm_;        // [hidden]
  WeightMatrix lm_head_;                 // [vocab, hidden]
  std::vector<Gemma4Layer> layers_;
  std::vector<RopeProvider> ropes_;      // one per distinct (layer type, head_dim)

  // Step buffers, reused across calls.
  std::vector<int32_t> positions_;
  std::vector<float> x_, h_, branch_, branch2_, rows_;
  std::vector<float> ple_;               // [n, L, D]
  std::vector<float> ple_tmp_;           // [n, L * D]
  std::vector<float> gate_, gate_in_;    // [n, D]
  std::vector<float> q_, k_, v_, attn_;  // attention activations of one layer
  std::vector<float> router_logits_;     // [n, n_experts]
  std::vector<int32_t> topk_ids_;        // [n, top_k]
  std::vector<float> topk_weights_;      // [n, top_k]
  MlpScratch mlp_scratch_;
  MoeScratch moe_scratch_;

 private:
  void per_layer_inputs(const StepBatch& batch, int64_t n);
  void attention(Gemma4Layer& L, int layer, const StepBatch& batch, KvStorage& kv, const float* a, int64_t n,
                 float* out);
  void moe_block(const Gemma4Moe& m, const float* x, int64_t n, float* out);
};

void Gemma4Model::per_layer_inputs(const StepBatch& batch, int64_t n) {
  const int64_t hidden = config_.hidden;
  const int64_t D = g4_.ple_dim;
  const int64_t LD = int64_t(layers_.size()) * D;
  ple_.resize(size_t(n * LD));
  ple_tmp_.resize(size_t(n * LD));
  ple_embed_.gather(pool_, batch.tokens.data(), n, ple_embed_scale_, ple_tmp_.data());
  cpu::matmul(pool_, x_.data(), n, ple_model_proj_, nullptr, ple_.data());
  const float proj_scale = float(1.0 / std::sqrt(double(hidden)));
  for (float& v : ple_) v *= proj_scale;
  cpu::rms_norm(pool_, ple_.data(), ple_proj_norm_.data(), ple_.data(), n * int64_t(layers_.size()), D, config_.rms_eps,
                false);
  const float mix = float(1.0 / std::sqrt(2.0));
  for (size_t i = 0; i < ple_.size(); ++i) ple_[i] = (ple_[i] + ple_tmp_[i]) * mix;
}

void Gemma4Model::attention(Gemma4Layer& L, int layer, const StepBatch& batch, KvStorage& kv, const float* a,
                            int64_t n, float* out) {
  const Gemma4LayerGeometry& g = L.geo;
  const float eps = config_.rms_eps;
  RopeProvider& rope = ropes_[size_t(L.rope_index)];
  q_.resize(size_t(n * g.n_heads * g.head_dim));
  attn_.resize(size_t(n * g.n_heads * g.head_dim));
  cpu::matmul(pool_, a, n, L.attn.q, nullptr, q_.data());
  cpu::rms_norm(pool_, q_.data(), L.attn.q_norm.data(), q_.data(), n * g.n_heads, g.head_dim, eps, false);
  apply_rope(pool_, rope, batch, positions_.data(), q_.data(), g.n_heads, g.head_dim);
  if (g.kv_source < 0) {
    const int64_t kv_floats = n * g.n_kv_heads * g.head_dim;
    k_.resize(size_t(kv_floats));
    v_.resize(size_t(kv_floats));
    cpu::matmul(pool_, a, n, L.attn.k, nullptr, k_.data());
    if (g.k_eq_v) {
      std::copy_n(k_.data(), kv_floats, v_.data());
    } else {
      cpu::matmul(pool_, a, n, L.attn.v, nullptr, v_.data());
    }
    cpu::rms_norm(pool_, k_.data(), L.attn.k_norm.data(), k_.data(), n * g.n_kv_heads, g.head_dim, eps, false);
    apply_rope(pool_, rope, batch, positions_.data(), k_.data(), g.n_kv_heads, g.head_dim);
    cpu::rms_norm(pool_, v_.data(), nullptr, v_.data(), n * g.n_kv_heads, g.head_dim, eps, false);
    write_kv(pool_, batch, kv, layer, k_.data(), v_.data());
  }
  // A KV-shared layer reads its source's pools (KvStorage follows shares_with); the source
  // ran earlier in this forward, so the new positions are already there.
  attend(pool_, batch, kv, layer, L.params, q_.data(), attn_.data());
  cpu::matmul(pool_, attn_.data(), n, L.attn.o, nullptr, out);
}

void Gemma4Model::moe_block(const Gemma4Moe& m, const float* x, int64_t n, float* out) {
  const int64_t hidden = config_.hidden;
  const int32_t n_experts = int32_t(m.experts.size());
  const int32_t k = g4_.top_k;
  // Routing reads the residual stream through its own no-scale norm and scale vector.
  branch2_.resize(size_t(n * hidden));
  cpu::rms_norm(pool_, x, m.router_scale.data(), branch2_.data(), n, hidden, config_.rms_eps, false);
  router_logits_.resize(size_t(n * n_experts));
  topk_ids_.resize(size_t(n * k));
  topk_weights_.resize(size_t(n * k));
  cpu::matmul(pool_, branch2_.data(), n, m.router, nullptr, router_logits_.data());
  route_topk(router_logits_.data(), n, n_experts, k, /*renormalize=*/true, topk_ids_.data(), topk_weights_.data());
  for (size_t i = 0; i < topk_ids_.size(); ++i) topk_weights_[i] *= m.per_expert_scale[size_t(topk_ids_[i])];
  cpu::rms_norm(pool_, x, m.pre_norm.data(), branch2_.data(), n, hidden, config_.rms_eps, false);
  moe_experts_forward(pool_, m.experts, cpu::Activation::kGeluTanh, branch2_.data(), n, hidden, topk_ids_.data(),
                      topk_weights_.data(), k, moe_scratch_, out);
}

void Gemma4Model::forward(const StepBatch& batch, KvStorage& kv, StateStorage* /*state*/, float* logits) {
  const int64_t n = batch.n_tokens();
  const int64_t hidden = config_.hidden;
  const float eps = config_.rms_eps;
  if (n == 0) return;
  batch_positions(batch, &positions_);
  x_.resize(size_t(n * hidden));
  h_.resize(size_t(n * hidden));
  branch_.resize(size_t(n * hidden));
  embed_.gather(pool_, batch.tokens.data(), n, embed_scale_, x_.data());
  const int64_t D = g4_.ple_dim;
  if (D > 0) per_layer_inputs(batch, n);

  for (size_t l = 0; l < layers_.size(); ++l) {
    Gemma4Layer& L = layers_[l];
    cpu::rms_norm(pool_, x_.data(), L.input_norm.data(), h_.data(), n, hidden, eps, false);
    attention(L, int(l), batch, kv, h_.data(), n, branch_.data());
    cpu::rms_norm(pool_, branch_.data(), L.post_attn_norm.data(), branch_.data(), n, hidden, eps, false);
    add_inplace(x_.data(), branch_.data(), n * hidden);

    cpu::rms_norm(pool_, x_.data(), L.pre_ffn_norm.data(), h_.data(), n, hidden, eps, false);
    gated_mlp_forward(pool_, L.mlp, cpu::Activation::kGeluTanh, h_.data(), n, mlp_scratch_, branch_.data());
    if (L.moe) {
      const Gemma4Moe& m = *L.moe;
      cpu::rms_norm(pool_, branch_.data(), m.post_mlp_norm.data(), branch_.data(), n, hidden, eps, false);
      moe_block(m, x_.data(), n, h_.data());
      cpu::rms_norm(pool_, h_.data(), m.post_norm.data(), h_.data(), n, hidden, eps, false);
      add_inplace(branch_.data(), h_.data(), n * hidden);
    }
    cpu::rms_norm(pool_, branch_.data(), L.post_ffn_norm.data(), branch_.data(), n, hidden, eps, false);
    add_inplace(x_.data(), branch_.data(), n * hidden);

    if (D > 0) {
      gate_.resize(size_t(n * D));
      gate_in_.resize(size_t(n * D));
      const int64_t LD = int64_t(layers_.size()) * D;
      for (int64_t t = 0; t < n; ++t) std::copy_n(&ple_[size_t(t * LD + int64_t(l) * D)], D, &gate_in_[size_t(t * D)]);
      cpu::matmul(pool_, x_.data(), n, L.ple_gate, nullptr, gate_.data());
      cpu::gated_act(pool_, gate_.data(), gate_in_.data(), gate_.data(), n * D, cpu::Activation::kGeluTanh);
      cpu::matmul(pool_, gate_.data(), n, L.ple_proj, nullptr, branch_.data());
      cpu::rms_norm(pool_, branch_.data(), L.ple_norm.data(), branch_.data(), n, hidden, eps, false);
      add_inplace(x_.data(), branch_.data(), n * hidden);
    }
    if (L.layer_scalar != 1.0f) {
      for (float& v : x_) v *= L.layer_scalar;
    }
  }

  lm_head_forward(pool_, batch, x_.data(), hidden, LmHeadWeights{&final_norm_, eps, false, &lm_head_, config_.final_softcap, config_.hidden_output}, rows_,
                  logits);
}

// A multiplier as the checkpoint's dtype holds it (transformers casts the embedding scale to
// the weight dtype before multiplying).
float in_dtype(float v, DType dt) {
  if (dt == DType::kBF16) return bf16_to_f32(f32_to_bf16(v));
  if (dt == DType::kF16) return f16_to_f32(f32_to_f16(v));
  return v;
}

// Expert e's gate, up and down matrices as views into the fused tensors
// gate_up [E, 2I, H] (rows [0, I) gate, [I, 2I) up) and down [E, H, I].
Status load_fused_experts(const WeightLoader& w, const std::string& gate_up, const std::string& down, int64_t E, int64_t H,
                          int64_t I, std::vector<GatedMlpWeights>* experts) {
  auto gu = w.tensor(gate_up, {E, 2 * I, H});
  if (!gu.ok()) return gu.error();
  auto dn = w.tensor(down, {E, H, I});
  if (!dn.ok()) return dn.error();
  const auto* gu_bytes = static_cast<const uint8_t*>((*gu)->data);
  const auto* dn_bytes = static_cast<const uint8_t*>((*dn)->data);
  const size_t gu_elt = dtype_size((*gu)->dtype), dn_elt = dtype_size((*dn)->dtype);
  experts->resize(size_t(E));
  for (int64_t e = 0; e < E; ++e) {
    GatedMlpWeights& m = (*experts)[size_t(e)];
    const uint8_t* gate = gu_bytes + size_t(e * 2 * I * H) * gu_elt;
    const uint8_t* up = gate + size_t(I * H) * gu_elt;
    const uint8_t* down = dn_bytes + size_t(e * H * I) * dn_elt;
    STRATA_RETURN_IF_ERROR(take(pack_checkpoint_matrix(**gu, gate, I, H), &m.gate));
    STRATA_RETURN_IF_ERROR(take(pack_checkpoint_matrix(**gu, up, I, H), &m.up));
    STRATA_RETURN_IF_ERROR(take(pack_checkpoint_matrix(**dn, down, H, I), &m.down));
  }
  return Status();
}

Status load_layer(const ModelConfig& cfg, const Gemma4TextConfig& g4, const WeightManifest& M, const WeightLoader& w, int l,
                  Gemma4Layer* L) {
  const int64_t H = cfg.hidden;
  const Gemma4LayerGeometry& g = L->geo;
  // Layer l's entry with `role` (gemma4_manifest lists every one this loader reads).
  auto at = [&](WeightRole role) -> const WeightEntry& {
    const WeightEntry* e = M.find(role, l);
    STRATA_CHECK(e != nullptr, "the Gemma 4 manifest lists every tensor its loader reads");
    return *e;
  };
  auto vec = [&](WeightRole role, std::vector<float>* out) { return take(w.vector(at(role).name, at(role).shape[0]), out); };
  auto mat = [&](WeightRole role, WeightMatrix* out) {
    const WeightEntry& e = at(role);
    return take(w.matrix(e.name, e.shape[0], e.shape[1]), out);
  };
  STRATA_RETURN_IF_ERROR(vec(WeightRole::kInputNorm, &L->input_norm));
  STRATA_RETURN_IF_ERROR(vec(WeightRole::kPostAttnNorm, &L->post_attn_norm));
  STRATA_RETURN_IF_ERROR(vec(WeightRole::kPreFfnNorm, &L->pre_ffn_norm));
  STRATA_RETURN_IF_ERROR(vec(WeightRole::kPostFfnNorm, &L->post_ffn_norm));
  STRATA_RETURN_IF_ERROR(mat(WeightRole::kQ, &L->attn.q));
  STRATA_RETURN_IF_ERROR(mat(WeightRole::kO, &L->attn.o));
  STRATA_RETURN_IF_ERROR(vec(WeightRole::kQNorm, &L->attn.q_norm));
  if (g.kv_source < 0) {
    STRATA_RETURN_IF_ERROR(mat(WeightRole::kK, &L->attn.k));
    if (!g.k_eq_v) STRATA_RETURN_IF_ERROR(mat(WeightRole::kV, &L->attn.v));
    STRATA_RETURN_IF_ERROR(vec(WeightRole::kKNorm, &L->attn.k_norm));
  }
  if (cfg.attention_bias) {
    return make_error(ErrorCode::kUnsupported, "gemma4_text: attention_bias true is not supported");
  }

  // The MLP width (twice as wide on KV-shared layers with use_double_wide_mlp) is the manifest's.
  STRATA_RETURN_IF_ERROR(mat(WeightRole::kGate, &L->mlp.gate));
  STRATA_RETURN_IF_ERROR(mat(WeightRole::kUp, &L->mlp.up));
  STRATA_RETURN_IF_ERROR(mat(WeightRole::kDown, &L->mlp.down));

  if (g4.moe) {
    auto m = std::make_unique<Gemma4Moe>();
    STRATA_RETURN_IF_ERROR(mat(WeightRole::kRouter, &m->router));
    STRATA_RETURN_IF_ERROR(vec(WeightRole::kRouterScale, &m->router_scale));
    const float root = float(1.0 / std::sqrt(double(H)));
    for (float& s : m->router_scale) s *= root;
    STRATA_RETURN_IF_ERROR(vec(WeightRole::kExpertScale, &m->per_expert_scale));
    STRATA_RETURN_IF_ERROR(load_fused_experts(w, at(WeightRole::kFusedExpertsGateUp).name, at(WeightRole::kFusedExpertsDown).name,
                                              cfg.n_experts, H, cfg.moe_intermediate, &m->experts));
    STRATA_RETURN_IF_ERROR(vec(WeightRole::kMoePostMlpNorm, &m->post_mlp_norm));
    STRATA_RETURN_IF_ERROR(vec(WeightRole::kMoePreNorm, &m->pre_norm));
    STRATA_RETURN_IF_ERROR(vec(WeightRole::kMoePostNorm, &m->post_norm));
    L->moe = std::move(m);
  }

  if (g4.ple_dim > 0) {
    STRATA_RETURN_IF_ERROR(mat(WeightRole::kPleGate, &L->ple_gate));
    STRATA_RETURN_IF_ERROR(mat(WeightRole::kPleProj, &L->ple_proj));
    STRATA_RETURN_IF_ERROR(vec(WeightRole::kPleNorm, &L->ple_norm));
  }
  // layer_scalar is a buffer: checkpoints written before it existed leave it at 1.
  if (w.has(at(WeightRole::kLayerScalar).name)) {
    std::vector<float> s;
    STRATA_RETURN_IF_ERROR(vec(WeightRole::kLayerScalar, &s));
    L->layer_scalar = s[0];
  }

  L->params.n_heads = g.n_heads;
  L->params.n_kv_heads = g.n_kv_heads;
  L->params.head_dim = g.head_dim;
  L->params.head_dim_v = g.head_dim;
  L->params.scale = 1.0f;
  L->params.softcap = 0.0f;
  L->params.window = g.sliding ? cfg.sliding_window : 0;
  L->params.norm_eps = cfg.rms_eps;
  return Status();
}

}  // namespace

Result<std::unique_ptr<Model>> load_gemma4_text(const ModelConfig& cfg, const WeightLoader& w, ThreadPool& pool) {
  auto g4 = parse_gemma4_text_config(cfg);
  if (!g4.ok()) return g4.error();
  // Gemma4TextConfig defaults hidden_activation to gelu_pytorch_tanh; ModelConfig's default
  // (silu) only stands for an absent key here.
  const bool act_given = cfg.text_json->contains("hidden_activation") || cfg.text_json->contains("hidden_act");
  if (act_given && cfg.hidden_act != "gelu_pytorch_tanh" && cfg.hidden_act != "gelu_tanh") {
    return make_error(ErrorCode::kUnsupported,
                      "gemma4_text config: hidden_activation '" + cfg.hidden_act + "' is not supported (gelu_pytorch_tanh)");
  }
  auto manifest = gemma4_manifest(cfg, *g4);
  if (!manifest.ok()) return manifest.error();
  const WeightManifest& M = *manifest;
  auto name = [&M](WeightRole role) -> const std::string& { return M.find(role)->name; };
  auto m = std::make_unique<Gemma4Model>(cfg, pool, *g4);
  m->archive_ = w.archive();
  const int64_t H = cfg.hidden, V = cfg.vocab_size, n_layers = cfg.n_layers;
  STRATA_RETURN_IF_ERROR(take(w.embedding(name(WeightRole::kEmbed), V, H), &m->embed_));
  m->embed_scale_ = in_dtype(float(std::sqrt(double(H))), m->embed_.dtype);
  STRATA_RETURN_IF_ERROR(take(w.vector(name(WeightRole::kFinalNorm), H), &m->final_norm_));
  if (M.tied_embeddings) {
    auto t = w.tensor(name(WeightRole::kEmbed), {V, H});
    if (!t.ok()) return t.error();
    STRATA_RETURN_IF_ERROR(take(pack_checkpoint_matrix(**t, (*t)->data, V, H), &m->lm_head_));
  } else {
    STRATA_RETURN_IF_ERROR(take(w.with_prefix("").matrix(name(WeightRole::kLmHead), V, H), &m->lm_head_));
  }

  const int64_t D = g4->ple_dim;
  if (D > 0) {
    // Token ids index both tables; a smaller per-layer vocabulary would leave ids unmapped.
    if (g4->ple_vocab < cfg.vocab_size) {
      return make_error(ErrorCode::kUnsupported, "gemma4_text config: vocab_size_per_layer_input " +
                                                     std::to_string(g4->ple_vocab) + " is smaller than vocab_size " +
                                                     std::to_string(cfg.vocab_size));
    }
    STRATA_RETURN_IF_ERROR(take(w.embedding(name(WeightRole::kPleEmbed), g4->ple_vocab, n_layers * D), &m->ple_embed_));
    m->ple_embed_scale_ = in_dtype(float(std::sqrt(double(D))), m->ple_embed_.dtype);
    STRATA_RETURN_IF_ERROR(take(w.matrix(name(WeightRole::kPleModelProj), n_layers * D, H), &m->ple_model_proj_));
    STRATA_RETURN_IF_ERROR(take(w.vector(name(WeightRole::kPleProjNorm), D), &m->ple_proj_norm_));
  }

  // One RoPE provider per distinct (layer type, head_dim).
  std::vector<std::pair<bool, int32_t>> rope_keys;
  m->layers_.resize(size_t(n_layers));
  for (int l = 0; l < cfg.n_layers; ++l) {
    Gemma4Layer& L = m->layers_[size_t(l)];
    L.geo = g4->layers[size_t(l)];
    const std::pair<bool, int32_t> key{L.geo.sliding, L.geo.head_dim};
    auto it = std::find(rope_keys.begin(), rope_keys.end(), key);
    if (it == rope_keys.end()) {
      const RopeConfig& rc = cfg.rope_for(L.geo.sliding ? "sliding_attention" : "full_attention");
      auto rp = RopeProvider::create(rc, L.geo.head_dim, cfg.max_position);
      if (!rp.ok()) return rp.error();
      m->ropes_.push_back(std::move(*rp));
      rope_keys.push_back(key);
      it = rope_keys.end() - 1;
    }
    L.rope_index = int(it - rope_keys.begin());
    STRATA_RETURN_IF_ERROR(load_layer(cfg, *g4, M, w, l, &L));
  }
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace strata
