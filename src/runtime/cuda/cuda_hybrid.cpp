// CudaDecoder for the gated-DeltaNet hybrids: loader, state slots, step (see cuda_hybrid.h).
#include "runtime/cuda/cuda_hybrid.h"

#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/delta_rule.h"
#include "backend/cuda/hybrid_kernels.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/moe.h"
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
  if (c.model_type == "qwen3_5_moe_text") return true;
  if (c.model_type != "qwen3_next" || c.n_experts <= 0) return false;
  return std::find(c.mlp_only_layers.begin(), c.mlp_only_layers.end(), int32_t(l)) == c.mlp_only_layers.end() &&
         (l + 1) % std::max(1, c.decoder_sparse_step) == 0;
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
                                                              const CudaModelOptions& options) {
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
  const bool fused_proj = cfg.model_type == "qwen3_next";

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
  const WeightLoader w(archive, m->cfg_.weight_prefix, m->cfg_.quant);
  // f32 / f16 checkpoints: matrices go up as bf16 hi + lo pairs (weight_split.h).
  B.split = WeightSplit::for_checkpoint(*archive, options, m->cfg_.model_type);
  auto upload_matrix = [&B](DeviceArena& a, const std::vector<float>& v, const std::string& what) {
    return B.split->upload(a, v, what);
  };
  const int64_t H = d.H, V = d.V, nh = d.nh, nkv = d.nkv, hd = d.hd;
  const int64_t kd = dn.key_dim(), vd = dn.value_dim(), nv = dn.n_v_heads, cd = dn.conv_dim(), P = Hy.proj_rows;

#define GET(var, expr)                 \
  auto var##_r = (expr);               \
  if (!var##_r.ok()) return var##_r.error(); \
  std::vector<float>& var = *var##_r

  STRATA_CUDA_LOAD(B.embed, w.f32("embed_tokens.weight", {V, H}), upload_matrix, "embedding");
  if (m->cfg_.lm_head_name.empty()) {
    B.lm_head = B.embed;
  } else {
    STRATA_CUDA_LOAD(B.lm_head, w.with_prefix("").f32(m->cfg_.lm_head_name, {V, H}), upload_matrix, "lm_head");
  }
  STRATA_CUDA_LOAD(B.final_norm, w.vector("norm.weight", H), upload_f32, "final norm");
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
  for (int64_t l = 0; l < d.L; ++l) {
    Layer& L = m->layers_[size_t(l)];
    Hybrid::HLayer& X = Hy.layers[size_t(l)];
    const std::string p = "layers." + std::to_string(l) + ".";
    STRATA_CUDA_LOAD(L.in_norm, w.vector(p + "input_layernorm.weight", H), upload_f32, "input norm");
    STRATA_CUDA_LOAD(L.post_norm, w.vector(p + "post_attention_layernorm.weight", H), upload_f32, "post-attention norm");
    X.linear = m->cfg_.layer_types[size_t(l)] == "linear_attention";
    if (X.linear) {
      const std::string a = p + "linear_attn.";
      std::vector<float> rows;  // q | k | v | z | b | a, each [*, H]
      rows.reserve(size_t(P * H));
      auto append = [&](const std::vector<float>& t, int64_t row0, int64_t n) {
        rows.insert(rows.end(), t.begin() + row0 * H, t.begin() + (row0 + n) * H);
      };
      if (fused_proj) {
        // Per key head g: [q_g (d_k) | k_g (d_k) | v_g (r d_v) | z_g (r d_v)] and [b_g (r) | a_g (r)].
        const int64_t r = nv / dn.n_k_heads, gq = 2 * dn.d_k + 2 * r * dn.d_v;
        GET(qkvz, w.f32(a + "in_proj_qkvz.weight", {dn.n_k_heads * gq, H}));
        GET(ba, w.f32(a + "in_proj_ba.weight", {2 * nv, H}));
        const int64_t offsets[4] = {0, dn.d_k, 2 * dn.d_k, 2 * dn.d_k + r * dn.d_v};
        const int64_t widths[4] = {dn.d_k, dn.d_k, r * dn.d_v, r * dn.d_v};
        for (int kind = 0; kind < 4; ++kind)
          for (int64_t g = 0; g < dn.n_k_heads; ++g) append(qkvz, g * gq + offsets[kind], widths[kind]);
        for (int kind = 0; kind < 2; ++kind)
          for (int64_t g = 0; g < dn.n_k_heads; ++g) append(ba, g * 2 * r + kind * r, r);
      } else {
        GET(qkv, w.f32(a + "in_proj_qkv.weight", {2 * kd + vd, H}));
        GET(z, w.f32(a + "in_proj_z.weight", {vd, H}));
        GET(bw, w.f32(a + "in_proj_b.weight", {nv, H}));
        GET(aw, w.f32(a + "in_proj_a.weight", {nv, H}));
        append(qkv, 0, 2 * kd + vd);
        append(z, 0, vd);
        append(bw, 0, nv);
        append(aw, 0, nv);
      }
      STRATA_CUDA_LOAD(X.in_proj, Result<std::vector<float>>(std::move(rows)), upload_matrix, "in_proj");
      if (w.has(a + "conv1d.bias")) {
        return make_error(ErrorCode::kUnsupported, "tensor '" + w.prefix() + a + "conv1d.bias': a DeltaNet conv bias is not supported");
      }
      STRATA_CUDA_LOAD(X.conv_w, w.f32(a + "conv1d.weight", {cd, 1, dn.conv_kernel}), upload_f32, "conv1d");
      STRATA_CUDA_LOAD(X.a_log, w.vector(a + "A_log", nv), upload_f32, "A_log");
      STRATA_CUDA_LOAD(X.dt_bias, w.vector(a + "dt_bias", nv), upload_f32, "dt_bias");
      STRATA_CUDA_LOAD(X.norm_w, w.vector(a + "norm.weight", dn.d_v), upload_f32, "DeltaNet norm");
      STRATA_CUDA_LOAD(X.out_proj, w.f32(a + "out_proj.weight", {H, vd}), upload_matrix, "out_proj");
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
      const std::string a = p + "self_attn.";
      GET(q, w.f32(a + "q_proj.weight", {2 * nh * hd, H}));
      std::vector<float> qkv, gate;
      qkv.reserve(size_t((nh + 2 * nkv) * hd * H));
      gate.reserve(size_t(nh * hd * H));
      // Per head: [query (head_dim) | gate (head_dim)] rows.
      for (int64_t h = 0; h < nh; ++h) {
        qkv.insert(qkv.end(), q.begin() + (2 * h) * hd * H, q.begin() + (2 * h + 1) * hd * H);
        gate.insert(gate.end(), q.begin() + (2 * h + 1) * hd * H, q.begin() + (2 * h + 2) * hd * H);
      }
      for (const char* name : {"k_proj", "v_proj"}) {
        GET(t, w.f32(a + name + ".weight", {nkv * hd, H}));
        qkv.insert(qkv.end(), t.begin(), t.end());
      }
      STRATA_CUDA_LOAD(L.qkv, Result<std::vector<float>>(std::move(qkv)), upload_matrix, "qkv");
      STRATA_CUDA_LOAD(X.gate, Result<std::vector<float>>(std::move(gate)), upload_matrix, "attention gate");
      STRATA_CUDA_LOAD(L.o, w.f32(a + "o_proj.weight", {H, nh * hd}), upload_matrix, "o_proj");
      STRATA_CUDA_LOAD(L.q_norm, w.vector(a + "q_norm.weight", hd), upload_f32, "q_norm");
      STRATA_CUDA_LOAD(L.k_norm, w.vector(a + "k_norm.weight", hd), upload_f32, "k_norm");
      L.kv_layer = attn_index++;
      L.rope = 0;
    }
    if (layer_is_sparse(m->cfg_, l)) {
      const int64_t E = m->cfg_.n_experts, mI = m->cfg_.moe_intermediate, sI = Hy.shared_inter;
      STRATA_CUDA_LOAD(L.router, w.f32(p + "mlp.gate.weight", {E, H}), upload_matrix, "router");
      if (w.has(p + "mlp.experts.gate_up_proj")) {
        // Fused: [E, 2 mI, H] with gate rows first, and [E, H, mI], as launch_grouped_gemm takes them.
        STRATA_CUDA_LOAD(L.experts_gate_up, w.f32(p + "mlp.experts.gate_up_proj", {E, 2 * mI, H}), upload_matrix, "experts gate_up");
        STRATA_CUDA_LOAD(L.experts_down, w.f32(p + "mlp.experts.down_proj", {E, H, mI}), upload_matrix, "experts down_proj");
      } else {
        std::vector<float> gu, dw;
        for (int64_t e = 0; e < E; ++e) {
          const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
          for (const char* name : {"gate_proj", "up_proj"}) {
            GET(t, w.f32(x + name + ".weight", {mI, H}));
            gu.insert(gu.end(), t.begin(), t.end());
          }
          GET(t, w.f32(x + "down_proj.weight", {H, mI}));
          dw.insert(dw.end(), t.begin(), t.end());
        }
        STRATA_CUDA_LOAD(L.experts_gate_up, Result<std::vector<float>>(std::move(gu)), upload_matrix, "experts gate_up");
        STRATA_CUDA_LOAD(L.experts_down, Result<std::vector<float>>(std::move(dw)), upload_matrix, "experts down_proj");
      }
      const std::string s = p + "mlp.shared_expert.";
      GET(sg, w.f32(s + "gate_proj.weight", {sI, H}));
      GET(su, w.f32(s + "up_proj.weight", {sI, H}));
      sg.insert(sg.end(), su.begin(), su.end());
      STRATA_CUDA_LOAD(X.shared_gate_up, Result<std::vector<float>>(std::move(sg)), upload_matrix, "shared expert gate_up");
      STRATA_CUDA_LOAD(X.shared_down, w.f32(s + "down_proj.weight", {H, sI}), upload_matrix, "shared expert down_proj");
      STRATA_CUDA_LOAD(X.shared_gate, w.f32(p + "mlp.shared_expert_gate.weight", {1, H}), upload_f32, "shared expert gate");
    } else {
      const int64_t I = m->cfg_.intermediate;
      if (I <= 0) return make_error(ErrorCode::kInvalidArgument, "intermediate_size must be positive");
      GET(g, w.f32(p + "mlp.gate_proj.weight", {I, H}));
      GET(u, w.f32(p + "mlp.up_proj.weight", {I, H}));
      g.insert(g.end(), u.begin(), u.end());
      STRATA_CUDA_LOAD(L.gate_up, Result<std::vector<float>>(std::move(g)), upload_matrix, "gate_up");
      STRATA_CUDA_LOAD(L.down, w.f32(p + "mlp.down_proj.weight", {H, I}), upload_matrix, "down_proj");
    }
  }
#undef GET
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
  STRATA_RETURN_IF_ERROR(B.split->attach(*m->gemm_, T, 2 * sd.I,
                                         {{B.h, T, H}, {B.rows_h, options.max_logit_rows, H}, {B.act, T, sd.I}, {Hy.core_h, T, vd},
                                          {B.attn, T, nh * hd}}));
  // Split weights: the codecs encode the f32 K/V (as the CPU's), the attention writes its lo part
  // (the sigmoid gate then rewrites it from the gated bf16 value, as on the bf16 path).
  if (m->codec_) m->codec_->set_out_lo(B.split->input_lo(B.attn));
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
  if (codec_) codec_->begin_step(B.dev<int32_t>(B.off_positions), B.dev<int32_t>(B.off_q_start), int32_t(n), int32_t(shape.n_seqs), st);
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
                          shape.codec_splits, st);
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
