// Gemma 4 text (gemma4_text) on the GPU: the loader and the step of CudaDecoder for the forward
// that model/gemma4.cpp describes (the spec; its config parsing is reused, not forked).
//
// Geometry: layers have their own head_dim / heads (per_layer_config). The step buffers and the
// KV pool are sized for the largest per-layer geometry (gemma4_shape writes it into the
// decoder's config): every pool block holds rows of n_kv_heads x head_dim at their largest, and
// a layer with smaller rows packs them at its own row size from the start of its region (the
// rest of the region stays unused). Layers that share an earlier layer's KV own a pool region
// they never write (the pool keeps one region per layer, so block bytes stay per layer for the
// KV copies); their QKV projection is the q rows only and they attend over the source's pool.
//
// Layer l (x the f32 residual stream; norms plain: x / rms(x) * w):
//   h = input_norm(x); q, k, v = qkv(h); v = rms_norm(v) (no weight); q, k: norm, RoPE
//   x += post_attention_norm(o(attention)); h = pre_ffn_norm(x)        (launch_sandwich_add_norm)
//   m = down(gelu(gate(h)) * up(h))
//   MoE block: m = post_ffn_norm_1(m) + post_ffn_norm_2(experts(pre_ffn_norm_2(x)))
//             with the router reading rms_norm(x) * router.scale * hidden^-0.5
//   x += post_ffn_norm(m)
//   per-layer input: x += ple_norm(ple_proj(gelu(ple_gate(x)) * ple[:, l])); x *= layer_scalar
//   h = next input_norm(x)                                              (launch_scaled_residual)
#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/family_kernels.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/moe.h"
#include "core/check.h"
#include "model/gemma4_config.h"
#include "model/rope.h"
#include "model/weight_loader.h"
#include "runtime/cuda/cuda_family.h"
#include "runtime/cuda/cuda_model_parts.h"
#include "tensor/dtype.h"

namespace strata::cuda {

using namespace model_parts;

namespace model_parts {

Status gemma4_shape(ModelConfig* cfg) {
  auto g4 = parse_gemma4_text_config(*cfg);
  if (!g4.ok()) return g4.error();
  int32_t hd = 0, nh = 0, nkv = 0;
  for (const Gemma4LayerGeometry& g : g4->layers) {
    hd = std::max(hd, g.head_dim);
    nh = std::max(nh, g.n_heads);
    nkv = std::max(nkv, g.n_kv_heads);
  }
  cfg->head_dim = hd;
  cfg->n_heads = nh;
  cfg->n_kv_heads = nkv;
  if (g4->double_wide_mlp && g4->n_kv_shared_layers > 0) cfg->intermediate *= 2;
  return Status();
}

Result<size_t> gemma4_extra_bytes(const ModelConfig& cfg, const CudaModelOptions& o) {
  auto g4 = parse_gemma4_text_config(cfg);
  if (!g4.ok()) return g4.error();
  const size_t H = size_t(cfg.hidden), L = size_t(cfg.n_layers), D = size_t(g4->ple_dim), T = size_t(o.max_tokens);
  const size_t E = g4->moe ? size_t(cfg.n_experts) : 0, mI = size_t(cfg.moe_intermediate), K = T * size_t(g4->top_k);
  size_t b = 0;
  auto add = [&](size_t bytes) { b += align256(bytes); };
  for (size_t l = 0; l < 2 * L; ++l) add(4 * size_t(cfg.head_dim));  // RoPE tables: at most two per layer count
  if (D > 0) {
    add(2 * size_t(g4->ple_vocab) * L * D);
    add(2 * L * D * H);
    add(4 * D);
    for (size_t l = 0; l < L; ++l) {
      add(2 * D * H);
      add(2 * H * D);
      add(4 * H);
    }
    add(4 * T * L * D);
    add(4 * T * L * D);
    add(4 * T * D);
    add(2 * T * D);
  }
  add(2 * T * H);
  if (E > 0) {
    for (size_t l = 0; l < L; ++l) {
      add(2 * E * H);
      add(2 * E * 2 * mI * H);
      add(2 * E * H * mI);
      add(4 * H);
      add(4 * E);
      for (int i = 0; i < 3; ++i) add(4 * H);
    }
    add(4 * T * E);
    add(4 * K);
    add(4 * K);
    add(4 * (E + 1));
    add(4 * K);
    add(4 * K);
    add(2 * K * 2 * mI);
    add(2 * K * mI);
    add(4 * K * H);
    add(2 * T * H);
    add(4 * T * H);
  }
  return b;
}

}  // namespace model_parts

namespace {

// A multiplier as the checkpoint's dtype holds it (transformers casts the embedding scales to
// the weight dtype before multiplying; model/gemma4.cpp does the same).
float in_dtype(float v, DType dt) {
  if (dt == DType::kBF16) return bf16_to_f32(f32_to_bf16(v));
  if (dt == DType::kF16) return f16_to_f32(f32_to_f16(v));
  return v;
}

}  // namespace

Result<std::unique_ptr<CudaDecoder>> CudaDecoder::load_gemma4(const ModelConfig& config,
                                                              std::shared_ptr<const SafetensorsArchive> archive,
                                                              const CudaModelOptions& options) {
  auto g4r = parse_gemma4_text_config(config);
  if (!g4r.ok()) return g4r.error();
  const Gemma4TextConfig& g4 = *g4r;
  auto flags = family_flags(config);
  if (!flags.ok()) return flags.error();
  std::unique_ptr<CudaDecoder> m(new CudaDecoder());
  m->cfg_ = config;
  STRATA_RETURN_IF_ERROR(gemma4_shape(&m->cfg_));
  if (g4.moe) m->cfg_.n_experts_per_tok = g4.top_k;
  m->gemma4_ = true;
  m->qk_norm_ = true;
  m->act_ = int32_t(Act::kGeluTanh);
  m->sandwich_ = true;
  m->final_softcap_ = flags->final_softcap;
  m->moe_ = g4.moe;
  m->fused_ok_ = false;
  m->attn_scale_ = 1.0f;
  m->ple_dim_ = g4.ple_dim;
  m->attn_cfg_ = config;
  m->auto_f32_kv_ = WeightSplit::splits(*archive, options);
  STRATA_RETURN_IF_ERROR(m->init_common(options));
  const Dims d = dims_of(m->cfg_);
  // One query tiling serves every layer: each layer's geometry must tile like the largest.
  for (const Gemma4LayerGeometry& g : g4.layers) {
    if (g.head_dim % 8 != 0 || g.head_dim > 256) {
      return make_error(ErrorCode::kUnsupported, "gemma4_text head_dim " + std::to_string(g.head_dim) + " (the CUDA attention needs a multiple of 8, at most 256)");
    }
    for (int32_t splits : {1, 2}) {
      if (attention_tokens_per_tile(g.n_heads, g.n_kv_heads, g.head_dim, splits) !=
          attention_tokens_per_tile(int32_t(d.nh), int32_t(d.nkv), int32_t(d.hd), splits)) {
        return make_error(ErrorCode::kUnsupported, "gemma4_text per-layer attention geometry (heads " + std::to_string(g.n_heads) + "/" +
                                                       std::to_string(g.n_kv_heads) + ", head_dim " + std::to_string(g.head_dim) +
                                                       ") tiles unlike the largest layer's on the GPU");
      }
    }
  }
  const bool tied = m->cfg_.lm_head_name.empty();  // gemma4_manifest's tied_embeddings
  auto extra = gemma4_extra_bytes(config, options);
  if (!extra.ok()) return extra.error();
  STRATA_RETURN_IF_ERROR(m->take_weight_arena(arena_bytes(d, options, tied, 0) + *extra));
  DeviceArena& A = *m->arena_;
  Buffers& B = *m->buf_;
  const WeightLoader w(archive, m->cfg_.weight_prefix, m->cfg_.quant);
  auto manifest = gemma4_manifest(m->cfg_, g4);
  if (!manifest.ok()) return manifest.error();
  const WeightManifest& M = *manifest;
  // The entry with `role` in `layer` (gemma4_manifest lists every one read here).
  auto at = [&M](WeightRole role, int32_t layer = -1) -> const WeightEntry& {
    const WeightEntry* e = M.find(role, layer);
    STRATA_CHECK(e != nullptr, "the Gemma 4 manifest lists every tensor its GPU loader reads");
    return *e;
  };
  auto f32_of = [&w](const WeightEntry& e) { return (e.absolute ? w.with_prefix("") : w).f32(e.name, e.shape); };
  auto vec_of = [&w](const WeightEntry& e) { return w.vector(e.name, e.shape[0]); };
  // f32 / f16 checkpoints: matrices go up as bf16 hi + lo pairs (weight_split.h).
  B.split = WeightSplit::for_checkpoint(*archive, options, m->cfg_.model_type);
  auto upload_matrix = [&B](DeviceArena& a, const std::vector<float>& v, const std::string& what) {
    return B.split->upload(a, v, what);
  };
  const int64_t H = d.H, V = d.V, nL = d.L, Dp = g4.ple_dim;


  {
    auto t = w.tensor(at(WeightRole::kEmbed).name, {V, H});
    if (!t.ok()) return t.error();
    m->embed_scale_ = in_dtype(float(std::sqrt(double(H))), (*t)->dtype);
  }
  STRATA_CUDA_LOAD(B.embed, f32_of(at(WeightRole::kEmbed)), upload_matrix, "embedding");
  if (tied) {
    B.lm_head = B.embed;
  } else {
    STRATA_CUDA_LOAD(B.lm_head, f32_of(at(WeightRole::kLmHead)), upload_matrix, "LM head");
  }
  STRATA_CUDA_LOAD(B.final_norm, vec_of(at(WeightRole::kFinalNorm)), upload_f32, "final norm");
  if (Dp > 0) {
    if (g4.ple_vocab < V) {
      return make_error(ErrorCode::kUnsupported, "gemma4_text config: vocab_size_per_layer_input " + std::to_string(g4.ple_vocab) +
                                                     " is smaller than vocab_size " + std::to_string(V));
    }
    auto t = w.tensor(at(WeightRole::kPleEmbed).name, at(WeightRole::kPleEmbed).shape);
    if (!t.ok()) return t.error();
    m->ple_embed_scale_ = in_dtype(float(std::sqrt(double(Dp))), (*t)->dtype);
    STRATA_CUDA_LOAD(B.ple_embed, f32_of(at(WeightRole::kPleEmbed)), upload_matrix, "per-layer embedding");
    STRATA_CUDA_LOAD(B.ple_model_proj, f32_of(at(WeightRole::kPleModelProj)), upload_matrix, "per-layer model projection");
    STRATA_CUDA_LOAD(B.ple_proj_norm, vec_of(at(WeightRole::kPleProjNorm)), upload_f32, "per-layer projection norm");
  }

  // RoPE tables per distinct (layer type, head_dim): sliding layers 'default', full layers
  // 'proportional' (rot_dim = head_dim with zero frequencies past the rotated pairs, which the
  // QKV post's half-split pairing (i, i + head_dim / 2) then leaves unrotated, as on the CPU).
  std::vector<std::pair<bool, int32_t>> rope_keys;
  m->layers_.resize(size_t(nL));
  for (int64_t l = 0; l < nL; ++l) {
    const Gemma4LayerGeometry& g = g4.layers[size_t(l)];
    Layer& L = m->layers_[size_t(l)];
    const std::pair<bool, int32_t> key{g.sliding, g.head_dim};
    auto it = std::find(rope_keys.begin(), rope_keys.end(), key);
    if (it == rope_keys.end()) {
      const RopeConfig& rc = m->cfg_.rope_for(g.sliding ? "sliding_attention" : "full_attention");
      if (rc.type == "dynamic") return make_error(ErrorCode::kUnsupported, "dynamic RoPE has no CUDA forward yet");
      auto tab = compute_rope(rc, g.head_dim, m->cfg_.max_position);
      if (!tab.ok()) return tab.error();
      float* f = nullptr;
      STRATA_CUDA_LOAD(f, Result<std::vector<float>>(tab->inv_freq), upload_f32, "RoPE table");
      B.rope_inv_freq.push_back(f);
      B.rope_rot_dim.push_back(tab->rot_dim);
      B.rope_attn_factor.push_back(tab->attn_factor);
      rope_keys.push_back(key);
      it = rope_keys.end() - 1;
    }
    L.rope = int32_t(it - rope_keys.begin());
    L.window = g.sliding ? m->cfg_.sliding_window : 0;
    L.n_heads = g.n_heads;
    L.n_kv_heads = g.n_kv_heads;
    L.head_dim = g.head_dim;
    L.own_kv = g.kv_source < 0;
    L.kv_layer = L.own_kv ? int32_t(l) : g.kv_source;
    const int32_t li = int32_t(l);
    auto lat = [&](WeightRole role) -> const WeightEntry& { return at(role, li); };
    {
      auto q = f32_of(lat(WeightRole::kQ));
      if (!q.ok()) return q.error();
      std::vector<float> qkv = std::move(*q);
      if (L.own_kv) {
        auto k = f32_of(lat(WeightRole::kK));
        if (!k.ok()) return k.error();
        qkv.insert(qkv.end(), k->begin(), k->end());
        // attention_k_eq_v: the values are the raw key projection, so the k rows serve twice.
        auto v = g.k_eq_v ? std::move(k) : f32_of(lat(WeightRole::kV));
        if (!v.ok()) return v.error();
        qkv.insert(qkv.end(), v->begin(), v->end());
      }
      STRATA_CUDA_LOAD(L.qkv, Result<std::vector<float>>(std::move(qkv)), upload_matrix, "qkv");
    }
    STRATA_CUDA_LOAD(L.o, f32_of(lat(WeightRole::kO)), upload_matrix, "attention output");
    STRATA_CUDA_LOAD(L.q_norm, vec_of(lat(WeightRole::kQNorm)), upload_f32, "q_norm");
    if (L.own_kv) STRATA_CUDA_LOAD(L.k_norm, vec_of(lat(WeightRole::kKNorm)), upload_f32, "k_norm");
    STRATA_CUDA_LOAD(L.in_norm, vec_of(lat(WeightRole::kInputNorm)), upload_f32, "input norm");
    STRATA_CUDA_LOAD(L.attn_out_norm, vec_of(lat(WeightRole::kPostAttnNorm)), upload_f32, "post-attention norm");
    STRATA_CUDA_LOAD(L.post_norm, vec_of(lat(WeightRole::kPreFfnNorm)), upload_f32, "pre-feedforward norm");
    STRATA_CUDA_LOAD(L.ffn_out_norm, vec_of(lat(WeightRole::kPostFfnNorm)), upload_f32, "post-feedforward norm");
    // The MLP width (doubled on KV-shared layers by use_double_wide_mlp) is the manifest's.
    L.inter = lat(WeightRole::kGate).shape[0];
    {
      auto gt = f32_of(lat(WeightRole::kGate));
      if (!gt.ok()) return gt.error();
      auto up = f32_of(lat(WeightRole::kUp));
      if (!up.ok()) return up.error();
      gt->insert(gt->end(), up->begin(), up->end());
      STRATA_CUDA_LOAD(L.gate_up, Result<std::vector<float>>(std::move(*gt)), upload_matrix, "gate_up");
    }
    STRATA_CUDA_LOAD(L.down, f32_of(lat(WeightRole::kDown)), upload_matrix, "MLP down");
    if (g4.moe) {
      STRATA_CUDA_LOAD(L.router, f32_of(lat(WeightRole::kRouter)), upload_matrix, "router");
      auto rs = vec_of(lat(WeightRole::kRouterScale));
      if (!rs.ok()) return rs.error();
      const float root = float(1.0 / std::sqrt(double(H)));
      for (float& s : *rs) s *= root;
      STRATA_CUDA_LOAD(L.router_scale, rs, upload_f32, "router scale");
      STRATA_CUDA_LOAD(L.per_expert_scale, vec_of(lat(WeightRole::kExpertScale)), upload_f32, "per-expert scale");
      // The fused tensors are already [E, 2I, H] (gate rows, then up rows) and [E, H, I]: the
      // layouts launch_grouped_gemm takes.
      STRATA_CUDA_LOAD(L.experts_gate_up, f32_of(lat(WeightRole::kFusedExpertsGateUp)), upload_matrix, "experts gate_up");
      STRATA_CUDA_LOAD(L.experts_down, f32_of(lat(WeightRole::kFusedExpertsDown)), upload_matrix, "experts down");
      STRATA_CUDA_LOAD(L.moe_mlp_norm, vec_of(lat(WeightRole::kMoePostMlpNorm)), upload_f32, "post-feedforward norm 1");
      STRATA_CUDA_LOAD(L.moe_pre_norm, vec_of(lat(WeightRole::kMoePreNorm)), upload_f32, "pre-feedforward norm 2");
      STRATA_CUDA_LOAD(L.moe_out_norm, vec_of(lat(WeightRole::kMoePostNorm)), upload_f32, "post-feedforward norm 2");
    }
    if (Dp > 0) {
      STRATA_CUDA_LOAD(L.ple_gate, f32_of(lat(WeightRole::kPleGate)), upload_matrix, "per-layer input gate");
      STRATA_CUDA_LOAD(L.ple_proj, f32_of(lat(WeightRole::kPleProj)), upload_matrix, "per-layer projection");
      STRATA_CUDA_LOAD(L.ple_norm, vec_of(lat(WeightRole::kPleNorm)), upload_f32, "per-layer input norm");
    }
    // layer_scalar is a buffer: checkpoints written before it existed leave it at 1.
    if (w.has(lat(WeightRole::kLayerScalar).name)) {
      auto s = vec_of(lat(WeightRole::kLayerScalar));
      if (!s.ok()) return s.error();
      L.layer_scalar = (*s)[0];
    }
  }
  m->weight_bytes_ = int64_t(A.used());
  void* ws = nullptr;
  STRATA_RETURN_IF_ERROR(take_scratch(A, d, options, &B, &ws));
  const int64_t T = options.max_tokens;
#define TAKE(field, type, n)                                    \
  do {                                                          \
    auto r_ = A.take_array<type>(size_t(n), #field);            \
    if (!r_.ok()) return r_.error();                            \
    B.field = *r_;                                              \
  } while (0)
  if (Dp > 0) {
    TAKE(ple, float, T * nL * Dp);
    TAKE(ple_tok, float, T * nL * Dp);
    TAKE(ple_gate, float, T * Dp);
    TAKE(ple_act, uint16_t, T * Dp);
  }
  TAKE(xb, uint16_t, T * H);
  if (g4.moe) {
    const int64_t E = config.n_experts, K = T * g4.top_k, mI = config.moe_intermediate;
    TAKE(moe_logits, float, T * E);
    TAKE(moe_ids, int32_t, K);
    TAKE(moe_w, float, K);
    TAKE(moe_offsets, int32_t, E + 1);
    TAKE(moe_sorted, int32_t, K);
    TAKE(moe_slot_row, int32_t, K);
    TAKE(moe_gate_up, uint16_t, K * 2 * mI);
    TAKE(moe_act, uint16_t, K * mI);
    TAKE(moe_y, float, K * H);
    TAKE(moe_in, uint16_t, T * H);
    TAKE(moe_out, float, T * H);
  }
#undef TAKE
  auto gm = Gemm::create(ws, kGemmWorkspace);
  if (!gm.ok()) return gm.error();
  m->gemm_ = std::move(*gm);
  std::vector<WeightSplit::Input> split_inputs = {{B.h, T, H}, {B.rows_h, options.max_logit_rows, H}, {B.act, T, d.I}, {B.xb, T, H},
                                                   {B.moe_in, T, H}};
  if (m->codec_) split_inputs.push_back({B.attn, T, d.nh * d.hd});  // the codec attention's lo part
  STRATA_RETURN_IF_ERROR(B.split->attach(*m->gemm_, T, 2 * d.I, split_inputs));
  if (m->codec_) m->codec_->set_out_lo(B.split->input_lo(B.attn));
  return m;
}

// The MoE block of layer L over the n tokens: experts of pre_feedforward_layernorm_2(x) into
// moe_out (see moe.h for the steps), routed on rms_norm(x) * router_scale.
void CudaDecoder::launch_gemma4_moe(const Layer& L, int64_t n, cudaStream_t st) {
  const Dims d = dims_of(cfg_);
  Buffers& B = *buf_;
  const int32_t E = cfg_.n_experts, top_k = cfg_.n_experts_per_tok;  // top_k_experts (set by load_gemma4)
  const int64_t H = d.H, mI = cfg_.moe_intermediate;
  launch_add_rms_norm({B.x, nullptr, nullptr, L.router_scale, nullptr, B.moe_in, int32_t(n), int32_t(H), cfg_.rms_eps, 0}, st);
  const WeightSplit* split = B.split.get();
  split_norm_lo(split, B.x, L.router_scale, nullptr, B.moe_in, n, H, cfg_.rms_eps, false, st);
  gemm_->run(st, B.moe_in, L.router, B.moe_logits, GemmOut::kF32, n, E, H);
  launch_moe_route({B.moe_logits, B.moe_ids, B.moe_w, int32_t(n), E, top_k, 1, L.per_expert_scale}, st);
  launch_moe_group({B.moe_ids, int32_t(n) * top_k, E, B.moe_offsets, B.moe_sorted, B.moe_slot_row}, st);
  launch_add_rms_norm({B.x, nullptr, nullptr, L.moe_pre_norm, nullptr, B.moe_in, int32_t(n), int32_t(H), cfg_.rms_eps, 0}, st);
  split_norm_lo(split, B.x, L.moe_pre_norm, nullptr, B.moe_in, n, H, cfg_.rms_eps, false, st);
  // An expert takes a token at most once: a group holds at most n rows.
  grouped_gemm(split_grouped(split, {B.moe_in, B.moe_sorted, top_k, L.experts_gate_up, B.moe_offsets, B.moe_gate_up, 0, E,
                                            int32_t(n), 2 * mI, H}),
                      st);
  launch_gated_act({B.moe_gate_up, B.moe_act, int32_t(n) * top_k, int32_t(mI), Act::kGeluTanh}, st);
  grouped_gemm(split_grouped(split, {B.moe_act, nullptr, 1, L.experts_down, B.moe_offsets, B.moe_y, 1, E, int32_t(n), H, mI}), st);
  launch_moe_combine({B.moe_y, B.moe_ids, B.moe_w, B.moe_slot_row, B.moe_out, int32_t(n), top_k, int32_t(H)}, st);
}

void CudaDecoder::launch_gemma4_step(const StepShape& shape) {
  const Dims d = dims_of(cfg_);
  Buffers& B = *buf_;
  const int64_t n = shape.n_tokens, n_rows = shape.n_rows, H = d.H, nL = d.L, Dp = ple_dim_;
  const float eps = cfg_.rms_eps;
  cudaStream_t st = stream_;
  const int32_t* tokens = B.dev<int32_t>(B.off_tokens);
  const WeightSplit* split = B.split.get();
  launch_embed({B.embed, tokens, B.x, int32_t(n), int32_t(H), embed_scale_}, st);
  split_embed_lo(split, B.embed, tokens, B.x, n, H, embed_scale_, st);
  if (Dp > 0) {
    launch_embed({B.ple_embed, tokens, B.ple_tok, int32_t(n), int32_t(nL * Dp), ple_embed_scale_}, st);
    split_embed_lo(split, B.ple_embed, tokens, B.ple_tok, n, nL * Dp, ple_embed_scale_, st);
    launch_to_bf16(B.x, B.xb, n * H, st);
    split_norm_lo(split, B.x, nullptr, nullptr, B.xb, n, H, eps, false, st);
    gemm_->run(st, B.xb, B.ple_model_proj, B.ple, GemmOut::kF32, n, nL * Dp, H);
    launch_ple_combine({B.ple, B.ple_tok, B.ple_proj_norm, int32_t(n * nL), int32_t(Dp), float(1.0 / std::sqrt(double(H))), eps}, st);
  }
  if (codec_) {
    codec_->begin_step(B.dev<int32_t>(B.off_positions), B.dev<int32_t>(B.off_q_start), int32_t(n), int32_t(shape.n_seqs), st,
                       quant_kv_ ? B.dev<int32_t>(B.off_quant) : nullptr, opt_.block_size);
  }
  if (!layers_.empty()) {
    launch_add_rms_norm({B.x, nullptr, nullptr, layers_[0].in_norm, nullptr, B.h, int32_t(n), int32_t(H), eps, 0}, st);
    split_norm_lo(split, B.x, layers_[0].in_norm, nullptr, B.h, n, H, eps, false, st);
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    const int64_t hd = L.head_dim, kvh = L.own_kv ? L.n_kv_heads : 0;
    const int64_t qkv_rows = (L.n_heads + 2 * kvh) * hd;
    gemm_->run(st, B.h, L.qkv, B.qkv, GemmOut::kF32, n, qkv_rows, H);
    if (L.own_kv) {
      launch_head_rms_norm({B.qkv, nullptr, int32_t(n), int32_t(qkv_rows), int32_t((L.n_heads + kvh) * hd), int32_t(kvh), int32_t(hd), eps},
                           st);
    }
    QkvPostArgs qa = qkv_post_args(l);
    qa.n = int32_t(n);
    qa.n_heads = L.n_heads;
    qa.n_kv_heads = int32_t(kvh);  // 0: a KV-shared layer makes q only
    qa.head_dim = int32_t(hd);
    qa.k_pool = kv_->k(L.kv_layer);
    qa.v_pool = kv_->v(L.kv_layer);
    PagedAttentionArgs pa = attention_args(shape, l);
    pa.k_pool = kv_->k(L.kv_layer);
    pa.v_pool = kv_->v(L.kv_layer);
    pa.n_heads = L.n_heads;
    pa.n_kv_heads = L.n_kv_heads;
    pa.head_dim = int32_t(hd);
    if (codec_) {  // KV codec rows (or f32 rows): the source layer's parts, written by it only
      codec_->run_layer(int32_t(l), qa, pa, qa.slot_mapping, kv_->part(2 * L.kv_layer), kv_->part(2 * L.kv_layer + 1),
                        shape.codec_splits, st, quant_kv_ ? quant_kv_->part(2 * L.kv_layer) : nullptr,
                        quant_kv_ ? quant_kv_->part(2 * L.kv_layer + 1) : nullptr);
    } else {
      launch_qkv_post(qa, st);
      launch_paged_attention(pa, st);
      launch_attention_combine(pa, st);
    }
    gemm_->run(st, B.attn, L.o, B.branch, GemmOut::kF32, n, H, L.n_heads * hd);
    launch_sandwich_add_norm({B.x, B.branch, nullptr, L.attn_out_norm, L.post_norm, B.h, int32_t(n), int32_t(H), eps, 0}, st);
    split_norm_lo(split, B.x, L.post_norm, nullptr, B.h, n, H, eps, false, st);
    gemm_->run(st, B.h, L.gate_up, B.gate_up, GemmOut::kBF16, n, 2 * L.inter, H);
    launch_gated_act({B.gate_up, B.act, int32_t(n), int32_t(L.inter), Act::kGeluTanh}, st);
    split_act_lo(split, B.act, n, L.inter, int32_t(Act::kGeluTanh), st);
    gemm_->run(st, B.act, L.down, B.branch, GemmOut::kF32, n, H, L.inter);
    if (L.router != nullptr) {
      launch_gemma4_moe(L, n, st);
      launch_norm_sum({B.branch, L.moe_mlp_norm, B.moe_out, L.moe_out_norm, B.branch, int32_t(n), int32_t(H), eps}, st);
    }
    const float* next_norm = l + 1 < layers_.size() ? layers_[l + 1].in_norm : nullptr;
    if (Dp > 0) {
      // x += post_ffn_norm(m), and x itself in bf16 for the per-layer input gate.
      launch_scaled_residual({B.x, B.branch, L.ffn_out_norm, 1.0f, nullptr, B.xb, int32_t(n), int32_t(H), eps}, st);
      split_norm_lo(split, B.x, nullptr, nullptr, B.xb, n, H, eps, false, st);
      gemm_->run(st, B.xb, L.ple_gate, B.ple_gate, GemmOut::kF32, n, Dp, H);
      launch_ple_gate({B.ple_gate, B.ple + int64_t(l) * Dp, B.ple_act, int32_t(n), int32_t(Dp), int32_t(nL * Dp), int32_t(Act::kGeluTanh)},
                      st);
      gemm_->run(st, B.ple_act, L.ple_proj, B.branch, GemmOut::kF32, n, H, Dp);
      launch_scaled_residual({B.x, B.branch, L.ple_norm, L.layer_scalar, next_norm, next_norm ? B.h : nullptr, int32_t(n), int32_t(H), eps},
                             st);
      if (next_norm) split_norm_lo(split, B.x, next_norm, nullptr, B.h, n, H, eps, false, st);
    } else {
      launch_scaled_residual({B.x, B.branch, L.ffn_out_norm, L.layer_scalar, next_norm, next_norm ? B.h : nullptr, int32_t(n), int32_t(H),
                              eps},
                             st);
      if (next_norm) split_norm_lo(split, B.x, next_norm, nullptr, B.h, n, H, eps, false, st);
    }
  }
  if (n_rows == 0) return;
  launch_add_rms_norm({B.x, nullptr, nullptr, B.final_norm, B.dev<int32_t>(B.off_row_map), B.rows_h, int32_t(n_rows), int32_t(H), eps, 0},
                      st);
  split_norm_lo(split, B.x, B.final_norm, B.dev<int32_t>(B.off_row_map), B.rows_h, n_rows, H, eps, false, st);
  gemm_->run(st, B.rows_h, B.lm_head, B.logits, GemmOut::kF32, n_rows, d.V, H);
  if (final_softcap_ > 0.0f) launch_softcap(B.logits, n_rows * d.V, final_softcap_, st);
  launch_argmax({B.logits, B.argmax, int32_t(n_rows), int32_t(d.V)}, st);
}

}  // namespace strata::cuda
