#include "model/decoder.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "model/layers/lm_head.h"
#include "model/layers/attention.h"
#include "model/layers/embedding.h"
#include "model/layers/mlp.h"
#include "model/layers/moe.h"
#include "model/layers/ops.h"
#include "model/rope.h"
#include "model/weight_manifest.h"

namespace strata {

namespace {

struct DecoderLayer {
  std::vector<float> input_norm;      // [hidden]
  std::vector<float> post_attn_norm;  // [hidden]
  std::vector<float> pre_ffn_norm;    // [hidden] sandwich only
  std::vector<float> post_ffn_norm;   // [hidden] sandwich only
  AttentionWeights attn;
  AttentionParams params;
  GatedMlpWeights mlp;                // dense layers
  std::unique_ptr<MoeWeights> moe;    // sparse layers
  int rope_index = 0;
};

class DecoderModel : public Model {
 public:
  DecoderModel(ModelConfig cfg, ThreadPool& pool, DecoderSpec spec) : Model(std::move(cfg), pool), spec_(spec) {}

  std::vector<KvLayerSpec> kv_layout() const override {
    std::vector<KvLayerSpec> v(size_t(config_.n_layers));
    for (int l = 0; l < config_.n_layers; ++l) {
      auto& s = v[size_t(l)];
      s.n_kv_heads = config_.n_kv_heads;
      s.head_dim_k = config_.head_dim;
      s.head_dim_v = config_.head_dim;
      s.window = layers_[size_t(l)].params.window;
    }
    return v;
  }

  void forward(const StepBatch& batch, KvStorage& kv, StateStorage* state, float* logits) override;
  Result<std::shared_ptr<const LoraAdapter>> load_lora(const std::string& dir, int32_t max_rank) const override {
    auto manifest = decoder_manifest(config_, spec_);
    if (!manifest.ok()) return manifest.error();
    return load_lora_adapter(dir, config_, *manifest, max_rank);
  }

  DecoderSpec spec_;
  std::shared_ptr<const SafetensorsArchive> archive_;  // keeps aliased weights mapped
  EmbeddingTable embed_;
  std::vector<float> final_norm_;
  WeightMatrix lm_head_;
  std::vector<DecoderLayer> layers_;
  std::vector<RopeProvider> ropes_;  // one per distinct layer type

  // Step buffers, reused across calls.
  std::vector<int32_t> positions_;
  std::vector<float> x_, h_, branch_, rows_;
  AttentionScratch attn_scratch_;
  MlpScratch mlp_scratch_;
  MoeScratch moe_scratch_;
  std::vector<float> lora_scratch_;
};

void DecoderModel::forward(const StepBatch& batch, KvStorage& kv, StateStorage* /*state*/, float* logits) {
  const int64_t n = batch.n_tokens();
  const int64_t hidden = config_.hidden;
  const float eps = config_.rms_eps;
  const bool opw = spec_.norm_one_plus_w;
  if (n == 0) return;
  batch_positions(batch, &positions_);
  x_.resize(size_t(n * hidden));
  h_.resize(size_t(n * hidden));
  branch_.resize(size_t(n * hidden));
  embed_.gather(pool_, batch.tokens.data(), n, spec_.embed_scale, x_.data());
  const bool adapters = std::any_of(batch.seqs.begin(), batch.seqs.end(), [](const SeqSpan& s) { return s.adapter >= 0; });
  LinearLora lora{&pool_, &batch, &lora_, 0, &lora_scratch_};

  for (size_t l = 0; l < layers_.size(); ++l) {
    DecoderLayer& L = layers_[l];
    L.params.rope = &ropes_[size_t(L.rope_index)];
    lora.layer = int32_t(l);
    const LinearLora* lo = adapters ? &lora : nullptr;
    cpu::rms_norm(pool_, x_.data(), L.input_norm.data(), h_.data(), n, hidden, eps, opw);
    attention_forward(pool_, L.attn, L.params, batch, positions_.data(), h_.data(), kv, int(l), attn_scratch_,
                      branch_.data(), lo);
    if (spec_.sandwich_norms) cpu::rms_norm(pool_, branch_.data(), L.post_attn_norm.data(), branch_.data(), n, hidden, eps, opw);
    cpu::add(pool_, x_.data(), branch_.data(), x_.data(), n * hidden);
    const std::vector<float>& ffn_norm = spec_.sandwich_norms ? L.pre_ffn_norm : L.post_attn_norm;
    cpu::rms_norm(pool_, x_.data(), ffn_norm.data(), h_.data(), n, hidden, eps, opw);
    if (L.moe) {
      moe_forward(pool_, *L.moe, spec_.act, h_.data(), n, hidden, moe_scratch_, branch_.data());
    } else {
      gated_mlp_forward(pool_, L.mlp, spec_.act, h_.data(), n, mlp_scratch_, branch_.data(), lo);
    }
    if (spec_.sandwich_norms) cpu::rms_norm(pool_, branch_.data(), L.post_ffn_norm.data(), branch_.data(), n, hidden, eps, opw);
    cpu::add(pool_, x_.data(), branch_.data(), x_.data(), n * hidden);
  }

  lm_head_forward(pool_, batch, x_.data(), hidden, LmHeadWeights{&final_norm_, eps, opw, &lm_head_, spec_.final_softcap, config_.hidden_output}, rows_,
                  logits);
}


}  // namespace

Result<cpu::Activation> activation_from_name(const std::string& name) {
  if (name == "silu" || name == "swish") return cpu::Activation::kSilu;
  if (name == "gelu_pytorch_tanh" || name == "gelu_tanh" || name == "gelu_new") return cpu::Activation::kGeluTanh;
  return make_error(ErrorCode::kUnsupported, "activation '" + name + "' is not supported (silu, gelu_pytorch_tanh)");
}

namespace {

// Where one manifest entry of a layer goes in the CPU model (null: a role the decoder lacks).
struct LayerSlots {
  DecoderLayer* L;
  WeightMatrix* matrix(const WeightEntry& e) {
    GatedMlpWeights* x = e.expert >= 0 ? &L->moe->experts[size_t(e.expert)] : nullptr;
    switch (e.role) {
      case WeightRole::kQ: return &L->attn.q;
      case WeightRole::kK: return &L->attn.k;
      case WeightRole::kV: return &L->attn.v;
      case WeightRole::kO: return &L->attn.o;
      case WeightRole::kGate: return &L->mlp.gate;
      case WeightRole::kUp: return &L->mlp.up;
      case WeightRole::kDown: return &L->mlp.down;
      case WeightRole::kRouter: return &L->moe->router;
      case WeightRole::kExpertGate: return &x->gate;
      case WeightRole::kExpertUp: return &x->up;
      case WeightRole::kExpertDown: return &x->down;
      default: return nullptr;
    }
  }
  std::vector<float>* vector(const WeightEntry& e) {
    switch (e.role) {
      case WeightRole::kInputNorm: return &L->input_norm;
      case WeightRole::kPostAttnNorm: return &L->post_attn_norm;
      case WeightRole::kPreFfnNorm: return &L->pre_ffn_norm;
      case WeightRole::kPostFfnNorm: return &L->post_ffn_norm;
      case WeightRole::kQBias: return &L->attn.q_bias;
      case WeightRole::kKBias: return &L->attn.k_bias;
      case WeightRole::kVBias: return &L->attn.v_bias;
      case WeightRole::kOBias: return &L->attn.o_bias;
      case WeightRole::kQNorm: return &L->attn.q_norm;
      case WeightRole::kKNorm: return &L->attn.k_norm;
      case WeightRole::kGateBias: return &L->mlp.gate_bias;
      case WeightRole::kUpBias: return &L->mlp.up_bias;
      case WeightRole::kDownBias: return &L->mlp.down_bias;
      default: return nullptr;
    }
  }
};

Status load_layer_weights(const WeightManifest& manifest, const WeightLoader& w, int32_t l, DecoderLayer* L) {
  LayerSlots slots{L};
  for (const WeightEntry* e : manifest.of_layer(l)) {
    if (e->is_matrix()) {
      WeightMatrix* dst = slots.matrix(*e);
      if (dst == nullptr) return make_error(ErrorCode::kInternal, "the CPU decoder has no slot for " + e->name);
      STRATA_RETURN_IF_ERROR(take(w.matrix(e->name, e->shape[0], e->shape[1]), dst));
    } else {
      std::vector<float>* dst = slots.vector(*e);
      if (dst == nullptr) return make_error(ErrorCode::kInternal, "the CPU decoder has no slot for " + e->name);
      STRATA_RETURN_IF_ERROR(take(w.vector(e->name, e->shape[0]), dst));
    }
  }
  return Status();
}

}  // namespace

Result<std::unique_ptr<Model>> load_decoder(const ModelConfig& cfg, const WeightLoader& w, ThreadPool& pool,
                                            const DecoderSpec& spec) {
  auto manifest = decoder_manifest(cfg, spec);
  if (!manifest.ok()) return manifest.error();
  auto m = std::make_unique<DecoderModel>(cfg, pool, spec);
  m->archive_ = w.archive();
  const int64_t hd = cfg.head_dim, nh = cfg.n_heads, nkv = cfg.n_kv_heads;
  const WeightEntry* embed = manifest->find(WeightRole::kEmbed);
  const WeightEntry* final_norm = manifest->find(WeightRole::kFinalNorm);
  STRATA_RETURN_IF_ERROR(take(w.embedding(embed->name, embed->shape[0], embed->shape[1]), &m->embed_));
  STRATA_RETURN_IF_ERROR(take(w.vector(final_norm->name, final_norm->shape[0]), &m->final_norm_));
  if (manifest->tied_embeddings) {
    STRATA_RETURN_IF_ERROR(take(w.matrix(embed->name, embed->shape[0], embed->shape[1]), &m->lm_head_));
  } else {
    const WeightEntry* head = manifest->find(WeightRole::kLmHead);
    STRATA_RETURN_IF_ERROR(take(w.with_prefix("").matrix(head->name, head->shape[0], head->shape[1]), &m->lm_head_));
  }

  // One RoPE provider per distinct layer type.
  std::vector<std::string> rope_types;
  for (int l = 0; l < cfg.n_layers; ++l) {
    const std::string& t = cfg.layer_types.empty() ? std::string("full_attention") : cfg.layer_types[size_t(l)];
    if (std::find(rope_types.begin(), rope_types.end(), t) == rope_types.end()) rope_types.push_back(t);
  }
  for (const auto& t : rope_types) {
    auto rp = RopeProvider::create(cfg.rope_for(t), cfg.head_dim, cfg.max_position);
    if (!rp.ok()) return rp.error();
    m->ropes_.push_back(std::move(*rp));
  }

  const float scale = spec.attn_scale > 0.0f ? spec.attn_scale : float(1.0 / std::sqrt(double(hd)));
  m->layers_.resize(size_t(cfg.n_layers));
  for (int l = 0; l < cfg.n_layers; ++l) {
    DecoderLayer& L = m->layers_[size_t(l)];
    const std::string& type = cfg.layer_types.empty() ? std::string("full_attention") : cfg.layer_types[size_t(l)];
    if (type != "full_attention" && type != "sliding_attention") {
      return make_error(ErrorCode::kUnsupported, "layer " + std::to_string(l) + " has layer type '" + type + "', which the " +
                                                     cfg.model_type + " family does not support");
    }
    L.rope_index = int(std::find(rope_types.begin(), rope_types.end(), type) - rope_types.begin());
    L.params.n_heads = int32_t(nh);
    L.params.n_kv_heads = int32_t(nkv);
    L.params.head_dim = int32_t(hd);
    L.params.head_dim_v = int32_t(hd);
    L.params.scale = scale;
    L.params.softcap = spec.attn_softcap;
    L.params.window = type == "sliding_attention" ? cfg.sliding_window : 0;
    L.params.norm_eps = cfg.rms_eps;
    L.params.norm_one_plus_w = spec.norm_one_plus_w;
    if (decoder_layer_sparse(cfg, spec, l)) {
      L.moe = std::make_unique<MoeWeights>();
      L.moe->top_k = cfg.n_experts_per_tok;
      L.moe->norm_topk_prob = cfg.norm_topk_prob;
      L.moe->experts.resize(size_t(cfg.n_experts));
    }
    STRATA_RETURN_IF_ERROR(load_layer_weights(*manifest, w, l, &L));
  }
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace strata
