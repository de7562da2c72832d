#include "model/qwen3_next.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_ops.h"
#include "core/check.h"
#include "model/decoder.h"
#include "model/delta_net.h"
#include "model/gated_attention.h"
#include "model/layers/lm_head.h"
#include "model/layers/embedding.h"
#include "model/layers/mlp.h"
#include "model/layers/moe.h"
#include "model/layers/ops.h"
#include "model/rope.h"

namespace strata {

namespace {

struct SharedExpertMoe {
  MoeWeights routed;
  GatedMlpWeights shared;
  WeightMatrix shared_gate;  // [1, hidden]
};

struct HybridLayer {
  std::vector<float> input_norm;      // [hidden] (1 + w)
  std::vector<float> post_attn_norm;  // [hidden] (1 + w)
  std::unique_ptr<DeltaNetLayer> linear;     // linear-attention layers
  std::unique_ptr<GatedAttentionLayer> attn;  // full-attention layers
  GatedMlpWeights mlp;                        // dense layers
  std::unique_ptr<SharedExpertMoe> moe;       // sparse layers
};

class HybridModel : public Model {
 public:
  HybridModel(ModelConfig cfg, ThreadPool& pool) : Model(std::move(cfg), pool) {}

  std::vector<KvLayerSpec> kv_layout() const override {
    std::vector<KvLayerSpec> v(layers_.size());
    for (size_t l = 0; l < layers_.size(); ++l) {
      if (layers_[l].attn) {
        v[l] = layers_[l].attn->kv_spec();
      } else {
        v[l].has_kv = false;
      }
    }
    return v;
  }

  std::vector<StateLayerSpec> state_layout() const override {
    std::vector<StateLayerSpec> v(layers_.size());
    for (size_t l = 0; l < layers_.size(); ++l)
      if (layers_[l].linear) v[l] = layers_[l].linear->dims().state_spec();
    return v;
  }

  void forward(const StepBatch& batch, KvStorage& kv, StateStorage* state, float* logits) override;

  std::shared_ptr<const SafetensorsArchive> archive_;  // keeps aliased weights mapped
  cpu::Activation act_ = cpu::Activation::kSilu;
  EmbeddingTable embed_;
  std::vector<float> final_norm_;  // [hidden] (1 + w)
  WeightMatrix lm_head_;
  std::vector<HybridLayer> layers_;
  std::unique_ptr<RopeProvider> rope_;

  // Step buffers, reused across calls.
  std::vector<int32_t> positions_;
  std::vector<float> x_, h_, branch_, shared_, shared_gate_, rows_;
  std::vector<DeltaNetSpan> spans_;
  DeltaNetScratch delta_scratch_;
  GatedAttentionScratch attn_scratch_;
  MlpScratch mlp_scratch_;
  MoeScratch moe_scratch_;
};

void HybridModel::forward(const StepBatch& batch, KvStorage& kv, StateStorage* state, float* logits) {
  const int64_t n = batch.n_tokens(), H = config_.hidden;
  const float eps = config_.rms_eps;
  if (n == 0) return;
  batch_positions(batch, &positions_);
  x_.resize(size_t(n * H));
  h_.resize(size_t(n * H));
  branch_.resize(size_t(n * H));
  embed_.gather(pool_, batch.tokens.data(), n, 1.0f, x_.data());

  const bool has_linear = std::any_of(layers_.begin(), layers_.end(), [](const HybridLayer& L) { return bool(L.linear); });
  if (has_linear) {
    STRATA_CHECK(state != nullptr, "a hybrid model needs recurrent-state storage");
    // Position 0 means no tokens before: whatever the slot held belongs to someone else.
    for (const auto& s : batch.seqs) {
      STRATA_CHECK(s.n_tokens == 0 || (s.state_slot >= 0 && s.state_slot < state->n_slots()),
                   "span without a recurrent-state slot");
      if (s.n_tokens > 0 && s.pos0 == 0) state->reset(s.state_slot);
    }
  }

  for (size_t l = 0; l < layers_.size(); ++l) {
    HybridLayer& L = layers_[l];
    cpu::rms_norm(pool_, x_.data(), L.input_norm.data(), h_.data(), n, H, eps, true);
    if (L.linear) {
      spans_.clear();
      int64_t t0 = 0;
      for (const auto& s : batch.seqs) {
        if (s.n_tokens > 0)
          spans_.push_back({t0, s.n_tokens, s.pos0, state->conv(int(l), s.state_slot), state->recurrent(int(l), s.state_slot)});
        t0 += s.n_tokens;
      }
      L.linear->forward(pool_, h_.data(), n, spans_, delta_scratch_, branch_.data());
    } else {
      L.attn->forward(pool_, *rope_, batch, positions_.data(), h_.data(), kv, int(l), attn_scratch_, branch_.data());
    }
    add_inplace(x_.data(), branch_.data(), n * H);

    cpu::rms_norm(pool_, x_.data(), L.post_attn_norm.data(), h_.data(), n, H, eps, true);
    if (L.moe) {
      moe_forward(pool_, L.moe->routed, act_, h_.data(), n, H, moe_scratch_, branch_.data());
      shared_.resize(size_t(n * H));
      shared_gate_.resize(size_t(n));
      gated_mlp_forward(pool_, L.moe->shared, act_, h_.data(), n, mlp_scratch_, shared_.data());
      cpu::matmul(pool_, h_.data(), n, L.moe->shared_gate, nullptr, shared_gate_.data());
      for (int64_t t = 0; t < n; ++t) {
        const float g = 1.0f / (1.0f + std::exp(-shared_gate_[size_t(t)]));
        for (int64_t i = 0; i < H; ++i) branch_[size_t(t * H + i)] += g * shared_[size_t(t * H + i)];
      }
    } else {
      gated_mlp_forward(pool_, L.mlp, act_, h_.data(), n, mlp_scratch_, branch_.data());
    }
    add_inplace(x_.data(), branch_.data(), n * H);
  }

  lm_head_forward(pool_, batch, x_.data(), H, LmHeadWeights{&final_norm_, eps, true, &lm_head_, 0.0f, config_.hidden_output}, rows_,
                  logits);
}


// Experts as the manifest lists them: one tensor each (kExpertGate / kExpertUp / kExpertDown)
// or fused (kFusedExpertsGateUp [E, 2I, H] with gate rows first, kFusedExpertsDown [E, H, I]).
Status load_experts(const WeightLoader& w, const WeightManifest& M, int32_t l, int64_t hidden, int64_t inter, int32_t n_experts,
                    std::vector<GatedMlpWeights>* experts) {
  experts->resize(size_t(n_experts));
  const WeightEntry* fgu = M.find(WeightRole::kFusedExpertsGateUp, l);
  const WeightEntry* fdn = M.find(WeightRole::kFusedExpertsDown, l);
  if (fgu == nullptr || fdn == nullptr) {
    for (int32_t e = 0; e < n_experts; ++e) {
      GatedMlpWeights& m = (*experts)[size_t(e)];
      for (auto [role, dst] : {std::pair{WeightRole::kExpertGate, &m.gate}, std::pair{WeightRole::kExpertUp, &m.up},
                               std::pair{WeightRole::kExpertDown, &m.down}}) {
        const WeightEntry* x = M.find(role, l, e);
        STRATA_CHECK(x != nullptr, "the hybrid manifest lists every expert tensor its loader reads");
        STRATA_RETURN_IF_ERROR(take(w.matrix(x->name, x->shape[0], x->shape[1]), dst));
      }
    }
    return Status();
  }
  auto gu = w.tensor(fgu->name, fgu->shape);
  if (!gu.ok()) return gu.error();
  auto dn = w.tensor(fdn->name, fdn->shape);
  if (!dn.ok()) return dn.error();
  const auto* gu_bytes = static_cast<const uint8_t*>((*gu)->data);
  const auto* dn_bytes = static_cast<const uint8_t*>((*dn)->data);
  const size_t gu_row = dtype_row_bytes((*gu)->dtype, hidden), dn_row = dtype_row_bytes((*dn)->dtype, inter);
  for (int32_t e = 0; e < n_experts; ++e) {
    GatedMlpWeights& m = (*experts)[size_t(e)];
    const uint8_t* base = gu_bytes + size_t(e) * size_t(2 * inter) * gu_row;
    STRATA_RETURN_IF_ERROR(take(pack_checkpoint_matrix(**gu, base, inter, hidden), &m.gate));
    STRATA_RETURN_IF_ERROR(take(pack_checkpoint_matrix(**gu, base + size_t(inter) * gu_row, inter, hidden), &m.up));
    STRATA_RETURN_IF_ERROR(
        take(pack_checkpoint_matrix(**dn, dn_bytes + size_t(e) * size_t(hidden) * dn_row, hidden, inter), &m.down));
  }
  return Status();
}

}  // namespace

Status resolve_hybrid_layer_types(ModelConfig* cfg) {
  const nlohmann::json& j = *cfg->text_json;
  if (j.contains("layer_types")) return Status();
  int64_t interval = 4;
  if (j.contains("full_attention_interval")) {
    if (!j["full_attention_interval"].is_number_integer() || j["full_attention_interval"].get<int64_t>() <= 0)
      return make_error(ErrorCode::kInvalidArgument,
                        "config full_attention_interval must be a positive integer, got " + j["full_attention_interval"].dump());
    interval = j["full_attention_interval"].get<int64_t>();
  }
  cfg->layer_types.assign(size_t(cfg->n_layers), "linear_attention");
  for (int l = 0; l < cfg->n_layers; ++l)
    if ((l + 1) % interval == 0) cfg->layer_types[size_t(l)] = "full_attention";
  return Status();
}

Result<std::unique_ptr<Model>> load_qwen3_next_family(const ModelConfig& config, const WeightLoader& w, ThreadPool& pool,
                                                      HybridFamily family) {
  ModelConfig cfg = config;
  if (!cfg.text_json) return make_error(ErrorCode::kInvalidArgument, cfg.model_type + ": no config object");
  STRATA_RETURN_IF_ERROR(resolve_hybrid_layer_types(&cfg));
  auto dims = parse_delta_net_dims(cfg, "config.json");
  if (!dims.ok()) return dims.error();
  auto act = activation_from_name(cfg.hidden_act);
  if (!act.ok()) return act.error();

  auto manifest = hybrid_manifest(cfg, family, &w);
  if (!manifest.ok()) return manifest.error();
  const WeightManifest& M = *manifest;
  // The entry with `role` in `layer` (hybrid_manifest lists every one read here).
  auto at = [&M](WeightRole role, int32_t layer = -1) -> const WeightEntry& {
    const WeightEntry* e = M.find(role, layer);
    STRATA_CHECK(e != nullptr, "the hybrid manifest lists every tensor its loader reads");
    return *e;
  };
  auto vec = [&](const WeightEntry& e, std::vector<float>* out) { return take(w.vector(e.name, e.shape[0]), out); };
  auto mat = [&](const WeightEntry& e, WeightMatrix* out) {
    return take((e.absolute ? w.with_prefix("") : w).matrix(e.name, e.shape[0], e.shape[1]), out);
  };

  auto m = std::make_unique<HybridModel>(cfg, pool);
  m->archive_ = w.archive();
  m->act_ = *act;
  const int64_t H = cfg.hidden, V = cfg.vocab_size;
  STRATA_RETURN_IF_ERROR(take(w.embedding(at(WeightRole::kEmbed).name, V, H), &m->embed_));
  STRATA_RETURN_IF_ERROR(vec(at(WeightRole::kFinalNorm), &m->final_norm_));
  if (M.tied_embeddings) {
    auto t = w.tensor(at(WeightRole::kEmbed).name, {V, H});
    if (!t.ok()) return t.error();
    STRATA_RETURN_IF_ERROR(take(pack_checkpoint_matrix(**t, (*t)->data, V, H), &m->lm_head_));
  } else {
    STRATA_RETURN_IF_ERROR(mat(at(WeightRole::kLmHead), &m->lm_head_));
  }
  auto rope = RopeProvider::create(cfg.rope_for("full_attention"), cfg.head_dim, cfg.max_position);
  if (!rope.ok()) return rope.error();
  m->rope_ = std::make_unique<RopeProvider>(std::move(*rope));

  m->layers_.resize(size_t(cfg.n_layers));
  for (int32_t l = 0; l < cfg.n_layers; ++l) {
    HybridLayer& L = m->layers_[size_t(l)];
    STRATA_RETURN_IF_ERROR(vec(at(WeightRole::kInputNorm, l), &L.input_norm));
    STRATA_RETURN_IF_ERROR(vec(at(WeightRole::kPostAttnNorm, l), &L.post_attn_norm));
    // hybrid_manifest refused any other layer type.
    if (cfg.layer_types[size_t(l)] == "linear_attention") {
      auto d = DeltaNetLayer::load(w, M, l, *dims, cfg.hidden, cfg.rms_eps);
      if (!d.ok()) return d.error();
      L.linear = std::make_unique<DeltaNetLayer>(std::move(*d));
    } else {
      auto a = GatedAttentionLayer::load(w, M, l, cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.rms_eps);
      if (!a.ok()) return a.error();
      L.attn = std::make_unique<GatedAttentionLayer>(std::move(*a));
    }

    if (M.find(WeightRole::kRouter, l) == nullptr) {
      STRATA_RETURN_IF_ERROR(mat(at(WeightRole::kGate, l), &L.mlp.gate));
      STRATA_RETURN_IF_ERROR(mat(at(WeightRole::kUp, l), &L.mlp.up));
      STRATA_RETURN_IF_ERROR(mat(at(WeightRole::kDown, l), &L.mlp.down));
      continue;
    }
    auto moe = std::make_unique<SharedExpertMoe>();
    moe->routed.top_k = cfg.n_experts_per_tok;
    // Qwen3.5-MoE always renormalizes the top-k weights; Qwen3-Next follows the config.
    moe->routed.norm_topk_prob = family == HybridFamily::kQwen35Moe || cfg.norm_topk_prob;
    STRATA_RETURN_IF_ERROR(mat(at(WeightRole::kRouter, l), &moe->routed.router));
    STRATA_RETURN_IF_ERROR(load_experts(w, M, l, H, cfg.moe_intermediate, cfg.n_experts, &moe->routed.experts));
    STRATA_RETURN_IF_ERROR(mat(at(WeightRole::kSharedGate, l), &moe->shared.gate));
    STRATA_RETURN_IF_ERROR(mat(at(WeightRole::kSharedUp, l), &moe->shared.up));
    STRATA_RETURN_IF_ERROR(mat(at(WeightRole::kSharedDown, l), &moe->shared.down));
    STRATA_RETURN_IF_ERROR(mat(at(WeightRole::kSharedExpertGate, l), &moe->shared_gate));
    L.moe = std::move(moe);
  }
  return std::unique_ptr<Model>(std::move(m));
}

Result<std::unique_ptr<Model>> load_qwen3_next(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool) {
  return load_qwen3_next_family(cfg, weights, pool, HybridFamily::kQwen3Next);
}

}  // namespace strata
