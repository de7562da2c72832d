// CudaDecoder for the gated-DeltaNet hybrids: loader, state slots, step (see cuda_hybrid.h).
#include "runtime/cuda/cuda_hybrid.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <tuple>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/delta_rule.h"
#include "backend/cuda/hybrid_kernels.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/moe.h"
#include "core/check.h"
#include "model/decoder.h"
#include "model/qwen3_next.h"
#include "model/rope.h"
#include "model/weight_loader.h"
#include "runtime/cuda/cuda_family.h"
#include "runtime/cuda/cuda_model_parts.h"
#include "runtime/cuda/weight_split.h"

namespace strata::cuda {

using namespace model_parts;

bool is_hybrid_type(const std::string& t) { return t == "qwen3_next" || t == "qwen3_5_text" || t == "qwen3_5_moe_text"; }

int32_t step_token_slack(const ModelConfig& cfg) { return is_hybrid_type(cfg.model_type) ? kDeltaChunk - 1 : 0; }

CudaDecoder::Hybrid::~Hybrid() {
  if (meta_host != nullptr) cudaFreeHost(meta_host);
  if (meta_copied != nullptr) cudaEventDestroy(meta_copied);
}

namespace {

// Chunked-form piece of a span, as backend/cpu/delta_net.cpp's gated_delta_rule cuts it: rows
// [0, head) recurrent (the rest of a block entered mid-way), [head, chunked_end) chunked,
// [chunked_end, n) recurrent (a short tail).
constexpr int32_t kChunkedMinTokens = 16;
void delta_pieces(int32_t pos0, int32_t n, int32_t* head, int32_t* chunked_end) {
  const int32_t off = pos0 % kDeltaChunk;
  *head = off == 0 ? 0 : std::min(n, kDeltaChunk - off);
  const int32_t tail = (n - *head) % kDeltaChunk;
  *chunked_end = tail >= kChunkedMinTokens ? n : n - tail;
}

bool layer_is_sparse(const ModelConfig& c, int64_t l) {
  auto f = hybrid_family(c.model_type);
  return f.ok() && hybrid_layer_sparse(c, *f, l);
}

// The step scratch's dimensions: the FFN buffers sized for the widest of the dense MLP and the
// shared expert, the MoE buffers when any layer is sparse.
Dims scratch_dims(const ModelConfig& c) {
  Dims d = dims_of(c);
  bool sparse = false;
  bool dense = false;
  for (int64_t l = 0; l < c.n_layers; ++l) (layer_is_sparse(c, l) ? sparse : dense) = true;
  d.I = std::max<int64_t>({dense ? c.intermediate : 0, sparse ? c.shared_expert_intermediate : 0, 1});
  d.n_sparse = sparse ? 1 : 0;
  d.E = sparse ? c.n_experts : 0;
  d.top_k = sparse ? c.n_experts_per_tok : 0;
  d.mI = sparse ? c.moe_intermediate : 0;
  d.L = 0;  // arena_bytes then counts no plain layers: the hybrid layers are counted here
  return d;
}

}  // namespace

Result<size_t> hybrid_arena_bytes(const ModelConfig& config, const CudaModelOptions& o) {
  ModelConfig c = config;
  STRATA_RETURN_IF_ERROR(resolve_hybrid_layer_types(&c));
  auto dn = parse_delta_net_dims(c, "config.json");
  if (!dn.ok()) return dn.error();
  const size_t H = size_t(c.hidden), T = size_t(o.max_tokens), nh = size_t(c.n_heads), nkv = size_t(c.n_kv_heads),
               hd = size_t(c.head_dim);
  const size_t kd = size_t(dn->key_dim()), vd = size_t(dn->value_dim()), nv = size_t(dn->n_v_heads),
               cd = size_t(dn->conv_dim()), K = size_t(dn->conv_kernel), P = 2 * kd + 2 * vd + 2 * nv;
  const size_t E = size_t(std::max(c.n_experts, 0)), mI = size_t(std::max(c.moe_intermediate, 0)),
               sI = size_t(std::max(c.shared_expert_intermediate, 0)), I = size_t(std::max(c.intermediate, 0));
  const size_t slots = size_t(o.max_seqs) + 1;
  size_t b = arena_bytes(scratch_dims(c), o, c.tie_embeddings, 1);
  auto add = [&](size_t bytes) { b += align256(bytes); };
  size_t n_linear = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    add(4 * H);
    add(4 * H);
    if (c.layer_types[size_t(l)] == "linear_attention") {
      ++n_linear;
      add(2 * P * H);
      add(4 * cd * K);
      add(4 * nv);
      add(4 * nv);
      add(4 * size_t(dn->d_v));
      add(2 * H * vd);
      add(4 * slots * (K - 1) * cd);
      add(4 * slots * nv * size_t(dn->d_k) * size_t(dn->d_v));
    } else {
      add(2 * (nh + 2 * nkv) * hd * H);
      add(2 * nh * hd * H);
      add(2 * H * nh * hd);
      add(4 * hd);
      add(4 * hd);
    }
    if (layer_is_sparse(c, l)) {
      add(2 * E * H);
      add(2 * E * 2 * mI * H);
      add(2 * E * H * mI);
      add(2 * 2 * sI * H);
      add(2 * H * sI);
      add(4 * H);
    } else {
      add(2 * 2 * I * H);
      add(2 * H * I);
    }
  }
  add(8 * 2 * n_linear);
  add(8 * 2 * n_linear);
  add(4 * T * P);
  add(4 * T * cd);
  add(4 * T * nv);
  add(4 * T * nv);
  add(4 * T * vd);
  add(2 * T * vd);
  add(4 * T * nh * hd);
  add(4 * T * H);
  add(4 * size_t(o.max_seqs) * 14);
  if (scratch_dims(c).n_sparse > 0) {
    const size_t K = T * size_t(c.n_experts_per_tok);
    add(4 * K * 2 * mI);
    add(2 * K * mI);
  }
  return b;
}

Result<std::unique_ptr<CudaDecoder>> CudaDecoder::load_hybrid(const ModelConfig& config,
                                                              std::shared_ptr<const SafetensorsArchive> archive,
                                                              const CudaModelOptions& options, uint64_t seed, float scale) {
  ModelConfig cfg = config;
  STRATA_RETURN_IF_ERROR(resolve_hybrid_layer_types(&cfg));
  auto dnr = parse_delta_net_dims(cfg, "config.json");
  if (!dnr.ok()) return dnr.error();
  const DeltaNetDims dn = *dnr;
  if (dn.d_k > 128) return make_error(ErrorCode::kUnsupported, "linear_key_head_dim " + std::to_string(dn.d_k) + " (the CUDA chunked delta rule takes at most 128)");
  if (dn.d_v > 1024) return make_error(ErrorCode::kUnsupported, "linear_value_head_dim " + std::to_string(dn.d_v) + " (at most 1024)");
  if (dn.conv_kernel > 8) return make_error(ErrorCode::kUnsupported, "linear_conv_kernel_dim " + std::to_string(dn.conv_kernel) + " (at most 8)");
  auto flags = family_flags(cfg);
  if (!flags.ok()) return flags.error();
  auto act = activation_from_name(cfg.hidden_act);
  if (!act.ok()) return act.error();
  auto family = hybrid_family(cfg.model_type);
  if (!family.ok()) return family.error();

  std::unique_ptr<CudaDecoder> m(new CudaDecoder());
  m->cfg_ = cfg;
  m->qk_norm_ = true;
  m->one_plus_w_ = true;
  m->act_ = *act == cpu::Activation::kSilu ? int32_t(Act::kSilu) : int32_t(Act::kGeluTanh);
  m->moe_ = flags->moe;
  m->fused_ok_ = false;
  m->hybrid_ = std::make_unique<Hybrid>();
  Hybrid& Hy = *m->hybrid_;
  Hy.dn = dn;
  Hy.proj_rows = 2 * dn.key_dim() + 2 * dn.value_dim() + 2 * dn.n_v_heads;
  Hy.shared_inter = cfg.shared_expert_intermediate;
  // Qwen3.5-MoE always renormalizes the top-k weights; Qwen3-Next follows the config.
  Hy.renormalize = cfg.model_type == "qwen3_5_moe_text" || cfg.norm_topk_prob;
  for (const auto& t : cfg.layer_types) {
    if (t == "full_attention") {
      ++Hy.n_attn_layers;
    } else if (t != "linear_attention") {
      return make_error(ErrorCode::kUnsupported, "layer type '" + t + "' (" + cfg.model_type + " has linear_attention and full_attention layers)");
    }
  }
  if (int64_t(cfg.layer_types.size()) != cfg.n_layers) return make_error(ErrorCode::kInvalidArgument, "config layer_types must list num_hidden_layers entries");
  if (Hy.n_attn_layers == 0) return make_error(ErrorCode::kUnsupported, cfg.model_type + " without a full_attention layer (the engine pages attention KV)");
  m->kv_layers_ = Hy.n_attn_layers;
  STRATA_RETURN_IF_ERROR(m->init_common(options));
  const Dims d = dims_of(m->cfg_);
  m->attn_scale_ = float(1.0 / std::sqrt(double(d.hd)));
  auto bytes = hybrid_arena_bytes(m->cfg_, options);
  if (!bytes.ok()) return bytes.error();
  STRATA_RETURN_IF_ERROR(m->take_weight_arena(*bytes));
  DeviceArena& A = *m->arena_;
  Buffers& B = *m->buf_;
  // A checkpoint's tensors go up from the host, regrouped as the kernels read them; a dummy's
  // are drawn on the device from the manifest's inits (regrouping random rows changes nothing).
  std::unique_ptr<WeightLoader> wl;
  if (archive) wl = std::make_unique<WeightLoader>(archive, m->cfg_.weight_prefix, m->cfg_.quant);
  const WeightLoader* w = wl.get();
  auto manifest = hybrid_manifest(m->cfg_, *family, w);
  if (!manifest.ok()) return manifest.error();
  const WeightManifest& man = *manifest;
  auto at = [&man](WeightRole role, int32_t layer = -1) -> const WeightEntry& {
    const WeightEntry* e = man.find(role, layer);
    STRATA_CHECK(e != nullptr, "the hybrid manifest lists every tensor its GPU loader reads");
    return *e;
  };
  auto host = [&](const WeightEntry& e) { return (e.absolute ? w->with_prefix("") : *w).f32(e.name, e.shape); };
  // f32 / f16 checkpoints: matrices go up as bf16 hi + lo pairs (weight_split.h).
  if (archive) B.split = WeightSplit::for_checkpoint(*archive, options, m->cfg_.model_type);
  uint64_t draw = seed;
  // A bf16 matrix of n elements: `build` assembles it from the checkpoint, or it is drawn.
  auto matrix = [&](uint16_t** dst, int64_t n, const std::function<Result<std::vector<float>>()>& build, const char* what) -> Status {
    if (w == nullptr) {
      auto p = A.take_array<uint16_t>(size_t(n), what);
      if (!p.ok()) return p.error();
      launch_fill_random_bf16(*p, n, ++draw, scale, m->stream_);
      *dst = *p;
      return Status();
    }
    auto v = build();
    if (!v.ok()) return v.error();
    auto p = B.split->upload(A, *v, what);
    if (!p.ok()) return p.error();
    *dst = *p;
    return Status();
  };
  auto entry_matrix = [&](uint16_t** dst, const WeightEntry& e, const char* what) {
    return matrix(dst, e.numel(), [&] { return host(e); }, what);
  };
  // An f32 vector (or conv kernel) as its entry holds it, or its dummy init.
  auto vector = [&](float** dst, const WeightEntry& e, const char* what) -> Status {
    std::vector<float> v;
    if (w != nullptr) {
      auto t = e.shape.size() == 1 ? w->vector(e.name, e.shape[0]) : w->f32(e.name, e.shape);
      if (!t.ok()) return t.error();
      v = std::move(*t);
    } else if (e.init == WeightInit::kUniform) {
      std::mt19937_64 rng(++draw);
      std::uniform_real_distribution<float> u(e.value, e.value_hi);
      v.resize(size_t(e.numel()));
      for (float& x : v) x = u(rng);
    } else {
      v.assign(size_t(e.numel()), e.value);
    }
    auto p = upload_f32(A, v, what);
    if (!p.ok()) return p.error();
    *dst = *p;
    return Status();
  };
  // Rows [row0, row0 + n) of several entries' host tensors, concatenated in order.
  using Pick = std::tuple<const std::vector<float>*, int64_t, int64_t>;
  auto gather = [H = d.H](const std::vector<Pick>& picks) {
    std::vector<float> rows;
    for (const auto& [t, row0, n] : picks) rows.insert(rows.end(), t->begin() + row0 * H, t->begin() + (row0 + n) * H);
    return rows;
  };
  const int64_t H = d.H, nh = d.nh, nkv = d.nkv, hd = d.hd;
  const int64_t vd = dn.value_dim(), nv = dn.n_v_heads, cd = dn.conv_dim(), P = Hy.proj_rows;

  STRATA_RETURN_IF_ERROR(entry_matrix(&B.embed, at(WeightRole::kEmbed), "embedding"));
  if (man.tied_embeddings) {
    B.lm_head = B.embed;
  } else {
    STRATA_RETURN_IF_ERROR(entry_matrix(&B.lm_head, at(WeightRole::kLmHead), "LM head"));
  }
  STRATA_RETURN_IF_ERROR(vector(&B.final_norm, at(WeightRole::kFinalNorm), "final norm"));
  {
    const RopeConfig& rc = m->cfg_.rope_for("full_attention");
    if (rc.type == "dynamic") return make_error(ErrorCode::kUnsupported, "dynamic RoPE has no CUDA forward yet");
    auto tab = compute_rope(rc, int32_t(hd), m->cfg_.max_position);
    if (!tab.ok()) return tab.error();
    float* f = nullptr;
    STRATA_CUDA_LOAD(f, Result<std::vector<float>>(tab->inv_freq), upload_f32, "RoPE table");
    B.rope_inv_freq.push_back(f);
    B.rope_rot_dim.push_back(tab->rot_dim);
    B.rope_attn_factor.push_back(tab->attn_factor);
  }
  const int32_t n_slots = options.max_seqs;
  Hy.n_slots = n_slots;
  m->layers_.resize(size_t(d.L));
  Hy.layers.resize(size_t(d.L));
  int32_t attn_index = 0;
  for (int32_t l = 0; l < int32_t(d.L); ++l) {
    Layer& L = m->layers_[size_t(l)];
    Hybrid::HLayer& X = Hy.layers[size_t(l)];
    auto lat = [&](WeightRole role) -> const WeightEntry& { return at(role, l); };
    STRATA_RETURN_IF_ERROR(vector(&L.in_norm, lat(WeightRole::kInputNorm), "input norm"));
    STRATA_RETURN_IF_ERROR(vector(&L.post_norm, lat(WeightRole::kPostAttnNorm), "post-attention norm"));
    X.linear = m->cfg_.layer_types[size_t(l)] == "linear_attention";
    if (X.linear) {
      const bool grouped = man.find(WeightRole::kDeltaQkvz, l) != nullptr;
      STRATA_RETURN_IF_ERROR(matrix(&X.in_proj, P * H, [&]() -> Result<std::vector<float>> {
        std::vector<Pick> picks;  // q | k | v | z | b | a, each [*, H]
        if (grouped) {
          auto qkvz = host(lat(WeightRole::kDeltaQkvz));
          if (!qkvz.ok()) return qkvz.error();
          auto ba = host(lat(WeightRole::kDeltaBa));
          if (!ba.ok()) return ba.error();
          // Per key head g: [q_g (d_k) | k_g (d_k) | v_g (r d_v) | z_g (r d_v)] and [b_g (r) | a_g (r)].
          const int64_t r = nv / dn.n_k_heads, gq = 2 * dn.d_k + 2 * r * dn.d_v;
          const int64_t offsets[4] = {0, dn.d_k, 2 * dn.d_k, 2 * dn.d_k + r * dn.d_v};
          const int64_t widths[4] = {dn.d_k, dn.d_k, r * dn.d_v, r * dn.d_v};
          for (int kind = 0; kind < 4; ++kind)
            for (int64_t g = 0; g < dn.n_k_heads; ++g) picks.emplace_back(&*qkvz, g * gq + offsets[kind], widths[kind]);
          for (int kind = 0; kind < 2; ++kind)
            for (int64_t g = 0; g < dn.n_k_heads; ++g) picks.emplace_back(&*ba, g * 2 * r + kind * r, r);
          return gather(picks);
        }
        std::vector<std::vector<float>> parts;
        for (WeightRole role : {WeightRole::kDeltaQkv, WeightRole::kDeltaZ, WeightRole::kDeltaB, WeightRole::kDeltaA}) {
          auto t = host(lat(role));
          if (!t.ok()) return t.error();
          parts.push_back(std::move(*t));
        }
        for (const auto& t : parts) picks.emplace_back(&t, 0, int64_t(t.size()) / H);
        return gather(picks);
      }, "DeltaNet input projection"));
      const WeightEntry& bias = lat(WeightRole::kDeltaConvBias);
      if (w != nullptr && w->has(bias.name)) {
        return make_error(ErrorCode::kUnsupported, "tensor '" + w->prefix() + bias.name + "': a DeltaNet conv bias is not supported");
      }
      STRATA_RETURN_IF_ERROR(vector(&X.conv_w, lat(WeightRole::kDeltaConv), "conv1d"));
      STRATA_RETURN_IF_ERROR(vector(&X.a_log, lat(WeightRole::kDeltaALog), "A_log"));
      STRATA_RETURN_IF_ERROR(vector(&X.dt_bias, lat(WeightRole::kDeltaDtBias), "dt_bias"));
      STRATA_RETURN_IF_ERROR(vector(&X.norm_w, lat(WeightRole::kDeltaNorm), "DeltaNet norm"));
      STRATA_RETURN_IF_ERROR(entry_matrix(&X.out_proj, lat(WeightRole::kDeltaOut), "DeltaNet output projection"));
      X.state = int32_t(Hy.conv.size());
      const StateLayerSpec ss = dn.state_spec();
      auto conv = A.take_array<float>(size_t(ss.conv_floats) * size_t(n_slots + 1), "DeltaNet conv state");
      if (!conv.ok()) return conv.error();
      auto rec = A.take_array<float>(size_t(ss.recurrent_floats) * size_t(n_slots + 1), "DeltaNet recurrent state");
      if (!rec.ok()) return rec.error();
      STRATA_CUDA_RETURN_IF_ERROR(cudaMemset(*conv, 0, size_t(ss.conv_floats) * size_t(n_slots + 1) * 4));
      STRATA_CUDA_RETURN_IF_ERROR(cudaMemset(*rec, 0, size_t(ss.recurrent_floats) * size_t(n_slots + 1) * 4));
      Hy.conv.push_back(*conv);
      Hy.rec.push_back(*rec);
    } else {
      // q_proj rows per head: [query (head_dim) | gate (head_dim)]; the queries join k and v.
      std::vector<float> gate;
      STRATA_RETURN_IF_ERROR(matrix(&L.qkv, (nh + 2 * nkv) * hd * H, [&]() -> Result<std::vector<float>> {
        auto q = host(lat(WeightRole::kQGate));
        if (!q.ok()) return q.error();
        auto k = host(lat(WeightRole::kK));
        if (!k.ok()) return k.error();
        auto v = host(lat(WeightRole::kV));
        if (!v.ok()) return v.error();
        std::vector<Pick> qkv, g;
        for (int64_t h = 0; h < nh; ++h) {
          qkv.emplace_back(&*q, 2 * h * hd, hd);
          g.emplace_back(&*q, (2 * h + 1) * hd, hd);
        }
        qkv.emplace_back(&*k, 0, nkv * hd);
        qkv.emplace_back(&*v, 0, nkv * hd);
        gate = gather(g);
        return gather(qkv);
      }, "qkv"));
      STRATA_RETURN_IF_ERROR(matrix(&X.gate, nh * hd * H, [&]() -> Result<std::vector<float>> { return std::move(gate); }, "attention gate"));
      STRATA_RETURN_IF_ERROR(entry_matrix(&L.o, lat(WeightRole::kO), "attention output"));
      STRATA_RETURN_IF_ERROR(vector(&L.q_norm, lat(WeightRole::kQNorm), "q_norm"));
      STRATA_RETURN_IF_ERROR(vector(&L.k_norm, lat(WeightRole::kKNorm), "k_norm"));
      L.kv_layer = attn_index++;
      L.rope = 0;
    }
    if (man.find(WeightRole::kRouter, l) != nullptr) {
      const int64_t E = m->cfg_.n_experts, mI = m->cfg_.moe_intermediate, sI = Hy.shared_inter;
      STRATA_RETURN_IF_ERROR(entry_matrix(&L.router, lat(WeightRole::kRouter), "router"));
      if (man.find(WeightRole::kFusedExpertsGateUp, l) != nullptr) {
        // Fused: [E, 2 mI, H] with gate rows first, and [E, H, mI], as launch_grouped_gemm takes them.
        STRATA_RETURN_IF_ERROR(entry_matrix(&L.experts_gate_up, lat(WeightRole::kFusedExpertsGateUp), "experts gate_up"));
        STRATA_RETURN_IF_ERROR(entry_matrix(&L.experts_down, lat(WeightRole::kFusedExpertsDown), "experts down"));
      } else {
        // One tensor per expert, concatenated in the kExpertsGateUp / kExpertsDown groups' order.
        auto concat = [&](WeightFuse fuse) -> Result<std::vector<float>> {
          std::vector<float> v;
          for (const WeightEntry* e : man.of_layer(l)) {
            if (e->fuse != fuse) continue;
            auto t = host(*e);
            if (!t.ok()) return t.error();
            v.insert(v.end(), t->begin(), t->end());
          }
          return v;
        };
        STRATA_RETURN_IF_ERROR(matrix(&L.experts_gate_up, E * 2 * mI * H, [&] { return concat(WeightFuse::kExpertsGateUp); }, "experts gate_up"));
        STRATA_RETURN_IF_ERROR(matrix(&L.experts_down, E * H * mI, [&] { return concat(WeightFuse::kExpertsDown); }, "experts down"));
      }
      STRATA_RETURN_IF_ERROR(matrix(&X.shared_gate_up, 2 * sI * H, [&]() -> Result<std::vector<float>> {
        auto g = host(lat(WeightRole::kSharedGate));
        if (!g.ok()) return g.error();
        auto u = host(lat(WeightRole::kSharedUp));
        if (!u.ok()) return u.error();
        g->insert(g->end(), u->begin(), u->end());
        return std::move(*g);
      }, "shared expert gate_up"));
      STRATA_RETURN_IF_ERROR(entry_matrix(&X.shared_down, lat(WeightRole::kSharedDown), "shared expert down"));
      {
        // The shared expert's gate is an f32 row the add kernel reads; a dummy's is random.
        const WeightEntry& e = lat(WeightRole::kSharedExpertGate);
        std::vector<float> v;
        if (w != nullptr) {
          auto t = host(e);
          if (!t.ok()) return t.error();
          v = std::move(*t);
        } else {
          std::mt19937_64 rng(++draw);
          std::uniform_real_distribution<float> u(-scale, scale);
          v.resize(size_t(e.numel()));
          for (float& x : v) x = u(rng);
        }
        STRATA_CUDA_LOAD(X.shared_gate, Result<std::vector<float>>(std::move(v)), upload_f32, "shared expert gate");
      }
    } else {
      const int64_t I = m->cfg_.intermediate;
      STRATA_RETURN_IF_ERROR(matrix(&L.gate_up, 2 * I * H, [&]() -> Result<std::vector<float>> {
        auto g = host(lat(WeightRole::kGate));
        if (!g.ok()) return g.error();
        auto u = host(lat(WeightRole::kUp));
        if (!u.ok()) return u.error();
        g->insert(g->end(), u->begin(), u->end());
        return std::move(*g);
      }, "gate_up"));
      STRATA_RETURN_IF_ERROR(entry_matrix(&L.down, lat(WeightRole::kDown), "MLP down"));
    }
  }
  m->weight_bytes_ = int64_t(A.used());
  void* ws = nullptr;
  STRATA_RETURN_IF_ERROR(take_scratch(A, scratch_dims(m->cfg_), options, &B, &ws));
  const int64_t T = options.max_tokens, M = options.max_seqs;
#define TAKE(field, type, n)                                    \
  do {                                                          \
    auto r_ = A.take_array<type>(size_t(n), #field);            \
    if (!r_.ok()) return r_.error();                            \
    Hy.field = *r_;                                             \
  } while (0)
  TAKE(proj, float, T * P);
  TAKE(mixed, float, T * cd);
  TAKE(g, float, T * nv);
  TAKE(beta, float, T * nv);
  TAKE(core, float, T * vd);
  TAKE(core_h, uint16_t, T * vd);
  TAKE(gate_f, float, T * nh * hd);
  TAKE(shared_out, float, T * H);
  if (scratch_dims(m->cfg_).n_sparse > 0) {
    const int64_t K = T * m->cfg_.n_experts_per_tok, mI = m->cfg_.moe_intermediate;
    TAKE(moe_gu_f, float, K * 2 * mI);
    TAKE(moe_act_lo, uint16_t, K * mI);
  }
  const size_t n_pools = 2 * Hy.conv.size();
  TAKE(pools_dev, float*, std::max<size_t>(n_pools, 1));
  TAKE(floats_dev, int64_t, std::max<size_t>(n_pools, 1));
  Hy.meta_ints = 14 * M;
  TAKE(meta_dev, int32_t, Hy.meta_ints);
#undef TAKE
  {
    std::vector<float*> ptrs(Hy.conv.begin(), Hy.conv.end());
    ptrs.insert(ptrs.end(), Hy.rec.begin(), Hy.rec.end());
    const StateLayerSpec ss = dn.state_spec();
    std::vector<int64_t> floats(Hy.conv.size(), ss.conv_floats);
    floats.resize(n_pools, ss.recurrent_floats);
    if (n_pools > 0) {
      STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(Hy.pools_dev, ptrs.data(), n_pools * sizeof(float*), cudaMemcpyHostToDevice));
      STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(Hy.floats_dev, floats.data(), n_pools * sizeof(int64_t), cudaMemcpyHostToDevice));
    }
  }
  void* mh = nullptr;
  STRATA_CUDA_RETURN_IF_ERROR(cudaMallocHost(&mh, size_t(Hy.meta_ints) * 4));
  Hy.meta_host = static_cast<int32_t*>(mh);
  std::fill(Hy.meta_host, Hy.meta_host + Hy.meta_ints, 0);
  STRATA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&Hy.meta_copied, cudaEventDisableTiming));
  auto gm = Gemm::create(ws, kGemmWorkspace);
  if (!gm.ok()) return gm.error();
  m->gemm_ = std::move(*gm);
  const Dims sd = scratch_dims(m->cfg_);
  if (B.split) STRATA_RETURN_IF_ERROR(B.split->attach(*m->gemm_, T, 2 * sd.I,
                                         {{B.h, T, H}, {B.rows_h, options.max_logit_rows, H}, {B.act, T, sd.I}, {Hy.core_h, T, vd},
                                          {B.attn, T, nh * hd}}));
  // Split weights: the codecs encode the f32 K/V (as the CPU's), the attention writes its lo part
  // (the sigmoid gate then rewrites it from the gated bf16 value, as on the bf16 path).
  if (m->codec_ && B.split) m->codec_->set_out_lo(B.split->input_lo(B.attn));
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(m->stream_));
  return m;
}

Status CudaDecoder::fill_hybrid_meta(const StepBatch& batch) {
  Hybrid& h = *hybrid_;
  const int64_t M = opt_.max_seqs;
  if (h.meta_pending) STRATA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(h.meta_copied));
  int32_t* slot = h.meta_host + Hybrid::kSlot * M;
  int32_t* reset = h.meta_host + Hybrid::kReset * M;
  auto list = [&](int k, int field) { return h.meta_host + (Hybrid::kLists + 4 * k + field) * M; };  // start, end, slot, pos0
  std::vector<uint8_t> taken(size_t(h.n_slots), 0);
  int32_t row = 0;
  h.max_rows = 0;
  h.any_chunked = false;
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const SeqSpan& sp = batch.seqs[s];
    int32_t sl = h.n_slots;  // scratch slot: a span without tokens touches no one's state
    if (sp.n_tokens > 0) {
      if (sp.state_slot < 0 || sp.state_slot >= h.n_slots) {
        return make_error(ErrorCode::kInvalidArgument, "sequence " + std::to_string(s) + ": state slot " + std::to_string(sp.state_slot) +
                                                           " outside [0, " + std::to_string(h.n_slots) + ")");
      }
      if (taken[size_t(sp.state_slot)]++ != 0) {
        return make_error(ErrorCode::kInvalidArgument, "state slot " + std::to_string(sp.state_slot) + " used by two sequences of one step");
      }
      sl = sp.state_slot;
    }
    slot[s] = sl;
    reset[s] = sp.n_tokens > 0 && sp.pos0 == 0 ? 1 : 0;
    int32_t head = 0, chunked_end = 0;
    delta_pieces(sp.pos0, sp.n_tokens, &head, &chunked_end);
    const int32_t bounds[4] = {0, head, chunked_end, sp.n_tokens};
    for (int k = 0; k < 3; ++k) {
      list(k, 0)[s] = row + bounds[k];
      list(k, 1)[s] = row + bounds[k + 1];
      list(k, 2)[s] = sl;
      list(k, 3)[s] = sp.pos0 + bounds[k];
    }
    h.any_chunked = h.any_chunked || chunked_end > head;
    h.max_rows = std::max(h.max_rows, sp.n_tokens);
    row += sp.n_tokens;
  }
  h.n_seqs = int32_t(batch.seqs.size());
  return Status();
}

void CudaDecoder::launch_hybrid_ffn(size_t l, int64_t n, cudaStream_t st) {
  const Dims d = dims_of(cfg_);
  Buffers& B = *buf_;
  const Hybrid& Hy = *hybrid_;
  const Layer& L = layers_[l];
  const Hybrid::HLayer& X = Hy.layers[l];
  const WeightSplit* split = B.split.get();
  if (L.router == nullptr) {
    const int64_t I = cfg_.intermediate;
    gemm_->run(st, B.h, L.gate_up, B.gate_up, GemmOut::kBF16, n, 2 * I, d.H);
    launch_gated_act({B.gate_up, B.act, int32_t(n), int32_t(I), Act(act_)}, st);
    split_act_lo(split, B.act, n, I, act_, st);
    gemm_->run(st, B.act, L.down, B.branch, GemmOut::kF32, n, d.H, I);
    return;
  }
  const int32_t k = cfg_.n_experts_per_tok, E = cfg_.n_experts;
  const int64_t mI = cfg_.moe_intermediate, sI = Hy.shared_inter;
  gemm_->run(st, B.h, L.router, B.moe_logits, GemmOut::kF32, n, E, d.H);
  launch_moe_route({B.moe_logits, B.moe_ids, B.moe_w, int32_t(n), E, k, Hy.renormalize ? 1 : 0, nullptr}, st);
  launch_moe_group({B.moe_ids, int32_t(n) * k, E, B.moe_offsets, B.moe_sorted, B.moe_slot_row}, st);
  // An expert takes a token at most once: a group holds at most n rows.
  if (split != nullptr && split->on()) {
    // The experts' activation in f32, then as hi + lo for the down GEMM.
    grouped_gemm(split_grouped(split, {B.h, B.moe_sorted, k, L.experts_gate_up, B.moe_offsets, Hy.moe_gu_f, 1, E, int32_t(n), 2 * mI, d.H}),
                        st);
    launch_gated_act_split({Hy.moe_gu_f, B.moe_act, Hy.moe_act_lo, int32_t(n) * k, int32_t(mI), act_}, st);
    GroupedGemmArgs down = split_grouped(split, {B.moe_act, nullptr, 1, L.experts_down, B.moe_offsets, B.moe_y, 1, E, int32_t(n), d.H, mI});
    down.x_lo = Hy.moe_act_lo;
    grouped_gemm(down, st);
  } else {
    grouped_gemm({B.h, B.moe_sorted, k, L.experts_gate_up, B.moe_offsets, B.moe_gate_up, 0, E, int32_t(n), 2 * mI, d.H}, st);
    launch_gated_act({B.moe_gate_up, B.moe_act, int32_t(n) * k, int32_t(mI), Act(act_)}, st);
    grouped_gemm({B.moe_act, nullptr, 1, L.experts_down, B.moe_offsets, B.moe_y, 1, E, int32_t(n), d.H, mI}, st);
  }
  launch_moe_combine({B.moe_y, B.moe_ids, B.moe_w, B.moe_slot_row, B.branch, int32_t(n), k, int32_t(d.H)}, st);
  gemm_->run(st, B.h, X.shared_gate_up, B.gate_up, GemmOut::kBF16, n, 2 * sI, d.H);
  launch_gated_act({B.gate_up, B.act, int32_t(n), int32_t(sI), Act(act_)}, st);
  split_act_lo(split, B.act, n, sI, act_, st);
  gemm_->run(st, B.act, X.shared_down, Hy.shared_out, GemmOut::kF32, n, d.H, sI);
  SharedExpertAddArgs sa{B.branch, Hy.shared_out, B.h, X.shared_gate, int32_t(n), int32_t(d.H)};
  sa.h_lo = split != nullptr && split->on() ? split->input_lo(B.h) : nullptr;
  launch_shared_expert_add(sa, st);
}

void CudaDecoder::launch_hybrid_step(const StepShape& shape, bool record_copy) {
  const Dims d = dims_of(cfg_);
  Buffers& B = *buf_;
  Hybrid& Hy = *hybrid_;
  const DeltaNetDims& dn = Hy.dn;
  const int64_t n = shape.n_tokens, n_rows = shape.n_rows, H = d.H, M = opt_.max_seqs;
  const int64_t kd = dn.key_dim(), vd = dn.value_dim(), nv = dn.n_v_heads, cd = dn.conv_dim(), P = Hy.proj_rows;
  const float eps = cfg_.rms_eps;
  cudaStream_t st = stream_;
  STRATA_CUDA_CHECK(cudaMemcpyAsync(Hy.meta_dev, Hy.meta_host, size_t(Hy.meta_ints) * 4, cudaMemcpyHostToDevice, st));
  // As launch_step's copy: an event node inside a decode graph, so the next step's packing
  // waits for this copy only.
  STRATA_CUDA_CHECK(record_copy ? cudaEventRecord(Hy.meta_copied, st)
                                : cudaEventRecordWithFlags(Hy.meta_copied, st, cudaEventRecordExternal));
  Hy.meta_pending = true;
  const int32_t* slot = Hy.meta_dev + Hybrid::kSlot * M;
  auto list = [&](int k, int field) { return Hy.meta_dev + (Hybrid::kLists + 4 * k + field) * M; };
  launch_state_reset({Hy.pools_dev, Hy.floats_dev, slot, Hy.meta_dev + Hybrid::kReset * M, int32_t(2 * Hy.conv.size()), Hy.n_seqs}, st);
  const WeightSplit* split = B.split.get();
  auto lo_of = [&](const uint16_t* hi) { return split != nullptr && split->on() ? split->input_lo(hi) : nullptr; };
  launch_embed({B.embed, B.dev<int32_t>(B.off_tokens), B.x, int32_t(n), int32_t(H), 1.0f}, st);
  split_embed_lo(split, B.embed, B.dev<int32_t>(B.off_tokens), B.x, n, H, 1.0f, st);
  if (codec_) {
    codec_->begin_step(B.dev<int32_t>(B.off_positions), B.dev<int32_t>(B.off_q_start), int32_t(n), int32_t(shape.n_seqs), st,
                       quant_kv_ ? B.dev<int32_t>(B.off_quant) : nullptr, opt_.block_size);
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    const Hybrid::HLayer& X = Hy.layers[l];
    launch_add_rms_norm({B.x, l == 0 ? nullptr : B.branch, nullptr, L.in_norm, nullptr, B.h, int32_t(n), int32_t(H), eps, 1}, st);
    split_norm_lo(split, B.x, L.in_norm, nullptr, B.h, n, H, eps, true, st);
    if (X.linear) {
      gemm_->run(st, B.h, X.in_proj, Hy.proj, GemmOut::kF32, n, P, H);
      DeltaConvArgs c{};
      c.x = Hy.proj;
      c.x_stride = P;
      c.y = Hy.mixed;
      c.state = Hy.conv[size_t(X.state)];
      c.weight = X.conv_w;
      c.bias = nullptr;
      c.seq_start = B.dev<int32_t>(B.off_q_start);
      c.seq_slot = slot;
      c.n_seqs = Hy.n_seqs;
      c.max_seq_rows = std::max(Hy.max_rows, 1);
      c.channels = int32_t(cd);
      c.kernel = dn.conv_kernel;
      c.x_bf16 = 0;
      c.silu = 1;
      launch_delta_conv1d(c, st);
      // q and k heads are the first 2 n_k heads of each conv row (eps inside the root, as FLA).
      launch_l2_norm_heads({Hy.mixed, int32_t(n), int32_t(cd), 2 * dn.n_k_heads, dn.d_k, 1e-6f}, st);
      launch_delta_gates({Hy.proj + cd + vd + nv, Hy.proj + cd + vd, int32_t(P), X.a_log, X.dt_bias, Hy.g, Hy.beta, int32_t(n), int32_t(nv)}, st);
      DeltaRuleArgs r{};
      r.q = Hy.mixed;
      r.k = Hy.mixed + kd;
      r.v = Hy.mixed + 2 * kd;
      r.qkv_stride = cd;
      r.g = Hy.g;
      r.beta = Hy.beta;
      r.state = Hy.rec[size_t(X.state)];
      r.out = Hy.core;
      r.n_seqs = Hy.n_seqs;
      r.n_k_heads = dn.n_k_heads;
      r.n_v_heads = dn.n_v_heads;
      r.d_k = dn.d_k;
      r.d_v = dn.d_v;
      r.scale = float(1.0 / std::sqrt(double(dn.d_k)));
      // Recurrent heads, chunked middles, recurrent tails: the pieces of a span in row order.
      for (int k = 0; k < 3; ++k) {
        r.seq_start = list(k, 0);
        r.seq_end = list(k, 1);
        r.seq_slot = list(k, 2);
        r.seq_pos0 = list(k, 3);
        if (k == 1) {
          if (Hy.any_chunked) STRATA_CUDA_CHECK(launch_gated_delta_rule_chunked(r, st));
        } else {
          launch_gated_delta_rule_recurrent(r, st);
        }
      }
      GatedRmsNormArgs gn{Hy.core, Hy.proj + cd, int32_t(P), X.norm_w, Hy.core_h, int32_t(n), int32_t(nv), dn.d_v, eps};
      gn.out_lo = lo_of(Hy.core_h);
      launch_gated_rms_norm(gn, st);
      gemm_->run(st, Hy.core_h, X.out_proj, B.branch, GemmOut::kF32, n, H, vd);
    } else {
      gemm_->run(st, B.h, L.qkv, B.qkv, GemmOut::kF32, n, d.qkv_rows, H);
      gemm_->run(st, B.h, X.gate, Hy.gate_f, GemmOut::kF32, n, d.nh * d.hd, H);
      QkvPostArgs qa = qkv_post_args(l);
      qa.n = int32_t(n);
      const PagedAttentionArgs pa = attention_args(shape, l);
      if (codec_) {
        // Codec rows: the codec step's pool layer is the attention layer's (its turbo seed the
        // model layer's).
        codec_->run_layer(L.kv_layer, qa, pa, qa.slot_mapping, kv_->part(2 * L.kv_layer), kv_->part(2 * L.kv_layer + 1),
                          shape.codec_splits, st, quant_kv_ ? quant_kv_->part(2 * L.kv_layer) : nullptr,
                          quant_kv_ ? quant_kv_->part(2 * L.kv_layer + 1) : nullptr);
      } else {
        launch_qkv_post(qa, st);
        launch_paged_attention(pa, st);
        launch_attention_combine(pa, st);
      }
      launch_sigmoid_gate(B.attn, Hy.gate_f, n * d.nh * d.hd, lo_of(B.attn), st);
      gemm_->run(st, B.attn, L.o, B.branch, GemmOut::kF32, n, H, d.nh * d.hd);
    }
    launch_add_rms_norm({B.x, B.branch, nullptr, L.post_norm, nullptr, B.h, int32_t(n), int32_t(H), eps, 1}, st);
    split_norm_lo(split, B.x, L.post_norm, nullptr, B.h, n, H, eps, true, st);
    launch_hybrid_ffn(l, n, st);
  }
  if (n_rows == 0) return;
  launch_add_rms_norm({B.x, B.branch, nullptr, B.final_norm, nullptr, B.h, int32_t(n), int32_t(H), eps, 1}, st);
  launch_add_rms_norm({B.x, nullptr, nullptr, B.final_norm, B.dev<int32_t>(B.off_row_map), B.rows_h, int32_t(n_rows), int32_t(H), eps, 1},
                      st);
  split_norm_lo(split, B.x, B.final_norm, B.dev<int32_t>(B.off_row_map), B.rows_h, n_rows, H, eps, true, st);
  gemm_->run(st, B.rows_h, B.lm_head, B.logits, GemmOut::kF32, n_rows, d.V, H);
  launch_argmax({B.logits, B.argmax, int32_t(n_rows), int32_t(d.V)}, st);
}

int64_t CudaDecoder::state_floats() const {
  if (!hybrid_) return 0;
  const StateLayerSpec ss = hybrid_->dn.state_spec();
  return int64_t(hybrid_->conv.size()) * (ss.conv_floats + ss.recurrent_floats);
}

Status CudaDecoder::save_state(int32_t slot, float* dst) {
  if (!hybrid_) return Status();
  Hybrid& h = *hybrid_;
  if (slot < 0 || slot >= h.n_slots) return make_error(ErrorCode::kOutOfRange, "state slot " + std::to_string(slot) + " outside the pools");
  const StateLayerSpec ss = h.dn.state_spec();
  for (size_t i = 0; i < h.conv.size(); ++i) {
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, h.conv[i] + int64_t(slot) * ss.conv_floats, size_t(ss.conv_floats) * 4, cudaMemcpyDeviceToHost, stream_));
    dst += ss.conv_floats;
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, h.rec[i] + int64_t(slot) * ss.recurrent_floats, size_t(ss.recurrent_floats) * 4,
                                      cudaMemcpyDeviceToHost, stream_));
    dst += ss.recurrent_floats;
  }
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status();
}

Status CudaDecoder::load_state(int32_t slot, const float* src) {
  if (!hybrid_) return Status();
  Hybrid& h = *hybrid_;
  if (slot < 0 || slot >= h.n_slots) return make_error(ErrorCode::kOutOfRange, "state slot " + std::to_string(slot) + " outside the pools");
  const StateLayerSpec ss = h.dn.state_spec();
  for (size_t i = 0; i < h.conv.size(); ++i) {
    STRATA_CUDA_CHECK(cudaMemcpyAsync(h.conv[i] + int64_t(slot) * ss.conv_floats, src, size_t(ss.conv_floats) * 4, cudaMemcpyHostToDevice, stream_));
    src += ss.conv_floats;
    STRATA_CUDA_CHECK(cudaMemcpyAsync(h.rec[i] + int64_t(slot) * ss.recurrent_floats, src, size_t(ss.recurrent_floats) * 4,
                                      cudaMemcpyHostToDevice, stream_));
    src += ss.recurrent_floats;
  }
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status();
}

std::vector<KvLayerSpec> CudaDecoder::kv_layout() const {
  std::vector<KvLayerSpec> v(size_t(cfg_.n_layers));
  for (size_t l = 0; l < v.size(); ++l) {
    v[l].n_kv_heads = cfg_.n_kv_heads;
    v[l].head_dim_k = cfg_.head_dim;
    v[l].head_dim_v = cfg_.head_dim;
    v[l].has_kv = !hybrid_ || !hybrid_->layers[l].linear;
    if (l >= layers_.size()) continue;
    const Layer& L = layers_[l];
    // Windows only when the window layers page apart: else they read the full pool's table.
    v[l].window = max_window_ > 0 ? L.window : 0;
    if (gemma4_) {
      v[l].n_kv_heads = L.n_kv_heads;
      v[l].head_dim_k = L.head_dim;
      v[l].head_dim_v = L.head_dim;
      if (!L.own_kv) v[l].shares_with = L.kv_layer;
    }
  }
  return v;
}

std::vector<StateLayerSpec> CudaDecoder::state_layout() const {
  std::vector<StateLayerSpec> v(size_t(cfg_.n_layers));
  if (!hybrid_) return v;
  for (size_t l = 0; l < v.size(); ++l)
    if (hybrid_->layers[l].linear) v[l] = hybrid_->dn.state_spec();
  return v;
}

}  // namespace strata::cuda
