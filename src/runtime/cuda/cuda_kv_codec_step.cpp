#include "runtime/cuda/cuda_kv_codec_step.h"

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "core/check.h"
#include "model/gemma4_config.h"
#include "model/qwen3_next.h"
#include "runtime/cuda/cuda_hybrid.h"

namespace strata::cuda {

namespace {

constexpr int32_t kMaxCodecSplits = 32;
// Split blocks (KV head x split x query row) a decode step aims for: a few waves of the
// device's multiprocessors (measured at batch 64 x 8k, Llama-8B shape: 1024 beat 2048 and 4096
// for every codec, bench_kv_codec_decode).
int64_t g_target_blocks = 1024;
bool g_fused_convert = true;  // KvCodecStep::set_fused_convert
constexpr int32_t kSignWords = 256;  // turbo3 sign words per layer (kv_turbo_sign_words)

size_t align256(size_t b) { return (b + 255) & ~size_t(255); }

// kAuto stores bf16 rows on the GPU, or f32 rows (kv_key_format's kAuto) with auto_f32.
KvCodecSpec gpu_spec(KvCodecSpec s, bool auto_f32) {
  if (s.codec == KvCodec::kAuto && !auto_f32) s.codec = KvCodec::kBf16;
  return s;
}

int64_t partial_rows_for(int32_t max_tokens, int32_t max_seqs) {
  return std::max<int64_t>(max_tokens, int64_t(max_seqs) * kMaxCodecSplits);
}

}  // namespace

KvCodecStep::~KvCodecStep() {
  if (mem_ != nullptr) cudaFree(mem_);
  if (convert_mem_ != nullptr) cudaFree(convert_mem_);
}

bool KvCodecStep::any_codec(const std::vector<KvCodecSpec>& specs, bool auto_f32) {
  return std::any_of(specs.begin(), specs.end(),
                     [&](const KvCodecSpec& s) { return gpu_spec(s, auto_f32).codec != KvCodec::kBf16; });
}

int64_t KvCodecStep::scratch_bytes(int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, int32_t max_tokens, int32_t max_seqs,
                                   bool quant) {
  const size_t T = size_t(max_tokens), P = size_t(partial_rows_for(max_tokens, max_seqs)) * (quant ? 2 : 1);
  return int64_t(2 * align256(T * size_t(n_kv_heads) * size_t(head_dim) * 2) + align256(T * 8) + (quant ? 3 : 2) * align256(T * 4) +
                 align256(P * size_t(n_heads) * size_t(head_dim) * 4) + align256(P * size_t(n_heads) * 2 * 4));
}

Result<std::vector<KvCodecStep::LayerGeometry>> KvCodecStep::geometry(const ModelConfig& cfg) {
  std::vector<LayerGeometry> g(size_t(std::max(cfg.n_layers, 0)));
  if (cfg.model_type == "gemma4_text") {
    auto g4 = parse_gemma4_text_config(cfg);
    if (!g4.ok()) return g4.error();
    for (size_t l = 0; l < g.size() && l < g4->layers.size(); ++l) {
      const Gemma4LayerGeometry& x = g4->layers[l];
      g[l] = {x.n_heads, x.n_kv_heads, x.head_dim, x.sliding ? cfg.sliding_window : 0, x.kv_source >= 0 ? x.kv_source : int32_t(l),
              int32_t(l)};
    }
    return g;
  }
  if (is_hybrid_type(cfg.model_type)) {
    // The pool holds the full-attention layers only (cuda_hybrid.h): pool layer p is the p-th,
    // with the gated attention's heads (q_proj's query halves) and head dim.
    ModelConfig c = cfg;
    if (c.layer_types.empty() && c.text_json) STRATA_RETURN_IF_ERROR(resolve_hybrid_layer_types(&c));
    if (int64_t(c.layer_types.size()) != int64_t(c.n_layers)) {
      return make_error(ErrorCode::kInvalidArgument, "KV codecs on the GPU: " + c.model_type + " config lists " +
                                                         std::to_string(c.layer_types.size()) + " layer_types for " +
                                                         std::to_string(c.n_layers) + " layers");
    }
    g.clear();
    for (int l = 0; l < c.n_layers; ++l) {
      if (c.layer_types[size_t(l)] != "full_attention") continue;
      g.push_back({c.n_heads, c.n_kv_heads, c.head_dim, 0, int32_t(g.size()), int32_t(l)});
    }
    return g;
  }
  for (int l = 0; l < cfg.n_layers; ++l) {
    const bool attention = cfg.layer_types.empty() || cfg.layer_types[size_t(l)] == "full_attention" ||
                           cfg.layer_types[size_t(l)] == "sliding_attention";
    if (!attention) {
      return make_error(ErrorCode::kUnsupported, "KV codecs on the GPU: model type '" + cfg.model_type + "' layer " + std::to_string(l) +
                                                     " ('" + cfg.layer_types[size_t(l)] + "') keeps bf16 KV only");
    }
    g[size_t(l)] = {cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.is_sliding(l) ? cfg.sliding_window : 0, int32_t(l), int32_t(l)};
  }
  return g;
}

Status KvCodecStep::supported(const ModelConfig& cfg, const std::vector<KvCodecSpec>& specs, bool auto_f32,
                              const std::vector<KvCodecSpec>& quant_specs) {
  auto refuse = [](const std::string& m) { return make_error(ErrorCode::kUnsupported, "KV codecs on the GPU: " + m); };
  auto geom = geometry(cfg);
  if (!geom.ok()) return geom.error();
  if (int64_t(specs.size()) != int64_t(cfg.n_layers)) {
    return refuse(std::to_string(specs.size()) + " layer codecs for " + std::to_string(cfg.n_layers) + " layers");
  }
  for (size_t p = 0; p < geom->size(); ++p) {
    const LayerGeometry& g = (*geom)[p];
    const int32_t l = g.model_layer;  // errors and specs name model layers
    if (g.n_kv_heads <= 0 || g.n_heads % g.n_kv_heads != 0) {
      return refuse("layer " + std::to_string(l) + ": num_attention_heads must be a multiple of num_key_value_heads");
    }
    const int32_t group = g.n_heads / g.n_kv_heads;
    if (group != 1 && group != 2 && group != 4 && group != 8) {
      return refuse("layer " + std::to_string(l) + ": GQA group " + std::to_string(group) + " (1, 2, 4 or 8)");
    }
    // A layer reading another layer's rows reads them in that layer's format.
    const KvCodecSpec spec = gpu_spec(specs[size_t((*geom)[size_t(g.kv_layer)].model_layer)], auto_f32);
    const std::string what = std::string(kv_codec_name(spec.codec)) + " of layer " + std::to_string(l) + " (head dim " +
                             std::to_string(g.head_dim) + "): ";
    const KvRowFormat kf = kv_key_format(spec, g.head_dim), vf = kv_value_format(spec, g.head_dim);
    if (const char* p = kv_format_problem(kf); *p != '\0') return refuse(what + p);
    if (const char* p = kv_format_problem(vf); *p != '\0') return refuse(what + p);
    if (const char* p = kv_codec_gpu_problem(kv_row_layout(kf), kv_row_layout(vf)); *p != '\0') return refuse(what + p);
  }
  if (quant_specs.empty()) return Status();
  // Delayed quantization: exact rows in the first pool, codec rows in the second, per layer.
  if (int64_t(quant_specs.size()) != int64_t(cfg.n_layers)) {
    return refuse(std::to_string(quant_specs.size()) + " delayed-quantization layer codecs for " + std::to_string(cfg.n_layers) +
                  " layers");
  }
  for (size_t p = 0; p < geom->size(); ++p) {
    const LayerGeometry& g = (*geom)[p];
    const size_t l = size_t(g.model_layer);
    const std::string layer = "layer " + std::to_string(l);
    const KvRowKind exact = kv_key_format(gpu_spec(specs[l], auto_f32), g.head_dim).kind;
    if (exact != KvRowKind::kBf16 && exact != KvRowKind::kF32) {
      return refuse(layer + ": delayed quantization keeps exact rows (bf16 or auto) in the first pool, not " +
                    kv_codec_name(specs[l].codec));
    }
    if (g.window > 0) continue;  // its few blocks stay exact (the decoder pages windows apart)
    const LayerGeometry& src = (*geom)[size_t(g.kv_layer)];
    if (g.kv_layer != int32_t(p)) {
      // A layer reading another layer's rows reads its converted blocks too (Gemma 4's shared
      // KV): the same window, and the source's codec.
      if (src.window != g.window || src.kv_layer != g.kv_layer) {
        return refuse(layer + ": delayed quantization of a layer reading layer " + std::to_string(src.model_layer) +
                      "'s KV, whose window differs");
      }
      continue;
    }
    const KvCodecSpec q = gpu_spec(quant_specs[l], auto_f32);
    const std::string what = std::string(kv_codec_name(q.codec)) + " (delayed quantization) of " + layer + " (head dim " +
                             std::to_string(g.head_dim) + "): ";
    const KvRowFormat kf = kv_key_format(q, g.head_dim), vf = kv_value_format(q, g.head_dim);
    if (kf.kind == KvRowKind::kF32 || vf.kind == KvRowKind::kF32) return refuse(what + "f32 rows are not a codec");
    if (const char* p = kv_format_problem(kf); *p != '\0') return refuse(what + p);
    if (const char* p = kv_format_problem(vf); *p != '\0') return refuse(what + p);
    if (const char* p = kv_codec_gpu_problem(kv_row_layout(kf), kv_row_layout(vf)); *p != '\0') return refuse(what + p);
  }
  return Status();
}

Result<std::unique_ptr<KvCodecStep>> KvCodecStep::create(const ModelConfig& cfg, const std::vector<KvCodecSpec>& specs,
                                                         int32_t max_tokens, int32_t max_seqs, bool auto_f32,
                                                         const std::vector<KvCodecSpec>& quant_specs) {
  STRATA_RETURN_IF_ERROR(supported(cfg, specs, auto_f32, quant_specs));
  const bool quant = !quant_specs.empty();
  auto geom = geometry(cfg);
  if (!geom.ok()) return geom.error();
  std::unique_ptr<KvCodecStep> s(new KvCodecStep());
  s->geom_ = std::move(*geom);
  int32_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  for (size_t l = 0; l < s->geom_.size(); ++l) {
    const LayerGeometry& g = s->geom_[l];
    const KvCodecSpec spec = gpu_spec(specs[size_t(s->geom_[size_t(g.kv_layer)].model_layer)], auto_f32);
    s->k_.push_back(kv_row_layout(kv_key_format(spec, g.head_dim)));
    s->v_.push_back(kv_row_layout(kv_value_format(spec, g.head_dim)));
    if (quant) {
      // Sliding-window layers keep exact rows only: their codec-pool rows are the exact ones,
      // never written or read.
      // A layer reading another layer's rows reads them in that layer's codec.
      const KvCodecSpec q =
          g.window > 0 ? spec : gpu_spec(quant_specs[size_t(s->geom_[size_t(g.kv_layer)].model_layer)], auto_f32);
      s->qk_.push_back(kv_row_layout(kv_key_format(q, g.head_dim)));
      s->qv_.push_back(kv_row_layout(kv_value_format(q, g.head_dim)));
    }
    n_heads = std::max(n_heads, g.n_heads);
    n_kv_heads = std::max(n_kv_heads, g.n_kv_heads);
    head_dim = std::max(head_dim, g.head_dim);
  }
  s->n_heads_ = n_heads;
  s->n_kv_heads_ = n_kv_heads;
  s->head_dim_ = head_dim;
  s->max_tokens_ = max_tokens;
  s->partial_rows_ = partial_rows_for(max_tokens, max_seqs);
  const int64_t bytes = scratch_bytes(n_heads, n_kv_heads, head_dim, max_tokens, max_seqs, quant);
  const cudaError_t err = cudaMalloc(&s->mem_, size_t(bytes));
  if (err != cudaSuccess) {
    cudaGetLastError();
    s->mem_ = nullptr;
    return make_error(ErrorCode::kResourceExhausted, "KV codec step scratch (" + std::to_string(bytes) + " bytes): " + cudaGetErrorString(err));
  }
  char* p = static_cast<char*>(s->mem_);
  auto take = [&](size_t b) {
    char* at = p;
    p += align256(b);
    return at;
  };
  const size_t T = size_t(max_tokens), P = size_t(s->partial_rows_) * (quant ? 2 : 1);
  s->k_stage_ = reinterpret_cast<uint16_t*>(take(T * size_t(n_kv_heads) * size_t(head_dim) * 2));
  s->v_stage_ = reinterpret_cast<uint16_t*>(take(T * size_t(n_kv_heads) * size_t(head_dim) * 2));
  s->stage_slots_ = reinterpret_cast<int64_t*>(take(T * 8));
  s->context_lens_ = reinterpret_cast<int32_t*>(take(T * 4));
  s->query_seq_ = reinterpret_cast<int32_t*>(take(T * 4));
  if (quant) s->quant_lens_ = reinterpret_cast<int32_t*>(take(T * 4));
  s->partial_out_ = reinterpret_cast<float*>(take(P * size_t(n_heads) * size_t(head_dim) * 4));
  s->partial_ml_ = reinterpret_cast<float*>(take(P * size_t(n_heads) * 2 * 4));
  std::vector<int64_t> ids(T);
  for (size_t t = 0; t < T; ++t) ids[t] = int64_t(t);
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(s->stage_slots_, ids.data(), T * 8, cudaMemcpyHostToDevice));
  if (quant) {
    // One-launch conversion: every layer converted, with the same codec rows, exact rows and
    // KV heads.
    bool uniform = true;
    for (size_t l = 0; l < s->geom_.size(); ++l) uniform = uniform && s->geom_[l].window == 0 && s->geom_[l].kv_layer == int32_t(l);
    for (size_t l = 1; l < s->qk_.size(); ++l) {
      auto same = [](const KvRowLayout& x, const KvRowLayout& y) {
        return x.kind == y.kind && x.dim == y.dim && x.group == y.group && x.bytes == y.bytes;
      };
      uniform = uniform && same(s->qk_[l], s->qk_[0]) && same(s->qv_[l], s->qv_[0]) && s->k_[l].kind == s->k_[0].kind &&
                s->geom_[l].n_kv_heads == s->geom_[0].n_kv_heads;
    }
    const size_t L = s->qk_.size();
    const bool turbo = s->qv_[0].kind == KvRowKindGpu::kTurbo3 || s->qk_[0].kind == KvRowKindGpu::kTurbo3;
    if (uniform && L > 0 && (!turbo || int64_t(s->geom_[0].n_kv_heads) * s->qv_[0].dim <= 32 * kSignWords)) {
      const size_t ptr_bytes = align256(4 * L * sizeof(void*));
      const size_t sign_bytes = turbo ? L * kSignWords * sizeof(uint32_t) : 0;
      STRATA_CUDA_RETURN_IF_ERROR(cudaMalloc(&s->convert_mem_, ptr_bytes + sign_bytes));
      if (turbo) {
        std::vector<uint32_t> words(L * kSignWords);
        for (size_t l = 0; l < L; ++l) {
          kv_turbo_sign_words(s->geom_[l].model_layer, s->geom_[l].n_kv_heads, s->qv_[l].dim, words.data() + l * kSignWords);
        }
        uint32_t* d = reinterpret_cast<uint32_t*>(static_cast<char*>(s->convert_mem_) + ptr_bytes);
        STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(d, words.data(), sign_bytes, cudaMemcpyHostToDevice));
        s->turbo_signs_ = d;
      }
      s->uniform_convert_ = true;
    }
  }
  return s;
}

std::vector<int32_t> KvCodecStep::row_bytes() const {
  std::vector<int32_t> b;
  for (size_t l = 0; l < k_.size(); ++l) {
    b.push_back(k_[l].bytes);
    b.push_back(v_[l].bytes);
  }
  return b;
}

int32_t KvCodecStep::splits_for(int64_t n_tokens, bool deterministic) const {
  if (deterministic || n_tokens <= 0) return 1;
  const int64_t blocks = n_tokens * n_kv_heads_;
  int64_t splits = std::clamp<int64_t>((g_target_blocks + blocks - 1) / blocks, 1, kMaxCodecSplits);
  splits = std::min<int64_t>(splits, std::max<int64_t>(1, partial_rows_ / n_tokens));
  return int32_t(splits);
}

void KvCodecStep::set_fused_convert(bool on) { g_fused_convert = on; }
bool KvCodecStep::fused_convert() { return g_fused_convert; }

void KvCodecStep::set_target_blocks(int64_t blocks) { g_target_blocks = std::max<int64_t>(1, blocks); }
int64_t KvCodecStep::target_blocks() { return g_target_blocks; }

void KvCodecStep::begin_step(const int32_t* positions, const int32_t* seq_q_start, int32_t n_tokens, int32_t n_seqs,
                             cudaStream_t stream, const int32_t* n_quant_blocks, int32_t block_size) {
  KvCodecQueryRowsArgs a{positions, seq_q_start, context_lens_, query_seq_, n_tokens, n_seqs};
  if (has_quant()) {
    a.n_quant_blocks = n_quant_blocks;
    a.block_size = block_size;
    a.quant_lens = quant_lens_;
  }
  launch_kv_codec_query_rows(a, stream);
}

void KvCodecStep::run_layer(int32_t layer, QkvPostArgs post, const PagedAttentionArgs& attn, const int64_t* slot_mapping,
                            uint8_t* k_pool, uint8_t* v_pool, int32_t n_splits, cudaStream_t stream,
                            const uint8_t* qk_pool, const uint8_t* qv_pool) {
  const int32_t n = post.n;
  const LayerGeometry& g = geom_[size_t(layer)];
  const KvRowLayout& kf = k_[size_t(layer)];
  const KvRowLayout& vf = v_[size_t(layer)];
  const bool f32 = kf.kind == KvRowKindGpu::kF32;
  // Split inputs (f32 checkpoints): the codecs encode the post's f32 K/V, as the CPU's do.
  const bool f32_in = f32 || out_lo_ != nullptr;
  const bool writes = post.n_kv_heads > 0;  // 0: the rows are g.kv_layer's, written there
  // k and v of token t land in staging row t (bf16, after bias, k norm and RoPE); f32 rows take
  // the post's f32 output, written back over the QKV rows (q too: the f32 query).
  post.k_pool = k_stage_;
  post.v_pool = v_stage_;
  post.slot_mapping = stage_slots_;
  float* qkv = const_cast<float*>(post.qkv);
  const int64_t row_len = int64_t(post.n_heads + 2 * post.n_kv_heads) * post.head_dim;
  if (f32_in) post.f32_out = qkv;
  launch_qkv_post(post, stream);
  if (writes) {
    // The rotation seed is the model layer's, as the CPU's rows (pool layer = model layer but
    // for the hybrids).
    KvCodecWriteArgs kw{k_stage_, slot_mapping, k_pool, kf, n, g.n_kv_heads, g.model_layer};
    KvCodecWriteArgs vw{v_stage_, slot_mapping, v_pool, vf, n, g.n_kv_heads, g.model_layer};
    if (f32_in) {
      kw.x_f32 = qkv + int64_t(post.n_heads) * post.head_dim;
      vw.x_f32 = qkv + int64_t(post.n_heads + post.n_kv_heads) * post.head_dim;
      kw.x_stride = vw.x_stride = row_len;
    }
    launch_kv_codec_write(kw, stream);
    launch_kv_codec_write(vw, stream);
  }
  PagedAttentionArgs rows = attn;
  rows.n_tokens = n;  // the query rows
  attend(layer, rows, f32 ? qkv : nullptr, row_len, k_pool, v_pool, n_splits, stream, qk_pool, qv_pool);
}

void KvCodecStep::attend(int32_t layer, const PagedAttentionArgs& attn, const float* q_f32, int64_t q_stride,
                         const uint8_t* k_pool, const uint8_t* v_pool, int32_t n_splits, cudaStream_t stream,
                         const uint8_t* qk_pool, const uint8_t* qv_pool) {
  const LayerGeometry& g = geom_[size_t(layer)];
  const KvRowLayout& kf = k_[size_t(layer)];
  KvCodecAttentionArgs a{};
  a.q = attn.q;
  a.out = attn.out;
  a.k_pool = k_pool;
  a.v_pool = v_pool;
  a.k_fmt = kf;
  a.v_fmt = v_[size_t(layer)];
  a.seed_layer = geom_[size_t(g.kv_layer)].model_layer;  // the rotation the rows were written with
  a.block_tables = attn.block_tables;
  a.context_lens = context_lens_;
  a.query_seq = query_seq_;
  a.partial_out = partial_out_;
  a.partial_ml = partial_ml_;
  a.n_seqs = attn.n_tokens;
  a.n_splits = n_splits;
  a.max_blocks_per_seq = attn.max_blocks_per_seq;
  a.block_size = attn.block_size;
  a.n_heads = g.n_heads;
  a.n_kv_heads = g.n_kv_heads;
  a.scale = attn.scale;
  a.softcap = attn.softcap;
  a.window = attn.window;
  a.out_lo = out_lo_;
  if (kf.kind == KvRowKindGpu::kF32) {
    a.q_f32 = q_f32;
    a.q_stride = q_stride;
  }
  if (has_quant() && g.window == 0) {
    // Keys [0, quant_lens) from the codec rows into partial splits [0, n_splits), left unmerged;
    // then keys [quant_lens, context_lens) from the exact rows into [n_splits, 2 n_splits) and the
    // merge of both (turbo3 codec values rotated back before they join the exact ones).
    KvCodecAttentionArgs c = a;
    c.k_pool = qk_pool;
    c.v_pool = qv_pool;
    c.k_fmt = qk_[size_t(layer)];
    c.v_fmt = qv_[size_t(layer)];
    c.context_lens = quant_lens_;
    c.q_f32 = nullptr;  // codec rows take the bf16 query
    c.q_stride = 0;
    c.merge = false;
    c.out_lo = nullptr;
    launch_kv_codec_attention(c, stream);
    a.key_begin = quant_lens_;
    a.split_base = n_splits;
    a.rotated_splits = c.v_fmt.kind == KvRowKindGpu::kTurbo3 ? n_splits : 0;
  }
  launch_kv_codec_attention(a, stream);
}

std::vector<int32_t> KvCodecStep::quant_row_bytes() const {
  std::vector<int32_t> b;
  for (size_t l = 0; l < qk_.size(); ++l) {
    b.push_back(qk_[l].bytes);
    b.push_back(qv_[l].bytes);
  }
  return b;
}

void KvCodecStep::convert_blocks(int32_t layer, const uint8_t* k_pool, const uint8_t* v_pool, uint8_t* qk_pool, uint8_t* qv_pool,
                                 const int32_t* src_blocks, const int32_t* dst_blocks, int32_t n_blocks, int32_t block_size,
                                 cudaStream_t stream) {
  if (!has_quant() || n_blocks <= 0) return;
  const LayerGeometry& g = geom_[size_t(layer)];
  // Sliding-window layers stay exact; a layer reading another layer's rows has none to convert.
  if (g.window > 0 || g.kv_layer != layer) return;
  const bool f32 = k_[size_t(layer)].kind == KvRowKindGpu::kF32;
  for (int side = 0; side < 2; ++side) {
    const uint8_t* src = side == 0 ? k_pool : v_pool;
    KvCodecWriteArgs w{};
    w.pool = side == 0 ? qk_pool : qv_pool;
    w.fmt = side == 0 ? qk_[size_t(layer)] : qv_[size_t(layer)];
    w.n_tokens = n_blocks * block_size;
    w.n_kv_heads = g.n_kv_heads;
    w.seed_layer = g.model_layer;  // as run_layer writes and reads (no shared-KV layers here)
    if (f32) {
      w.x_f32 = reinterpret_cast<const float*>(src);
      w.x_stride = int64_t(g.n_kv_heads) * g.head_dim;
    } else {
      w.x = reinterpret_cast<const uint16_t*>(src);
    }
    w.src_blocks = src_blocks;
    w.dst_blocks = dst_blocks;
    w.block_size = block_size;
    launch_kv_codec_write(w, stream);
  }
}

void KvCodecStep::convert_all_blocks(const std::vector<const uint8_t*>& exact_parts, const std::vector<uint8_t*>& codec_parts,
                                     const int32_t* src_blocks, const int32_t* dst_blocks, int32_t n_blocks, int32_t block_size,
                                     cudaStream_t stream) {
  if (!has_quant() || n_blocks <= 0) return;
  const size_t L = qk_.size();
  STRATA_CHECK(exact_parts.size() == 2 * L && codec_parts.size() == 2 * L);
  if (!uniform_convert_ || !g_fused_convert) {
    for (size_t l = 0; l < L; ++l) {
      convert_blocks(int32_t(l), exact_parts[2 * l], exact_parts[2 * l + 1], codec_parts[2 * l], codec_parts[2 * l + 1], src_blocks,
                     dst_blocks, n_blocks, block_size, stream);
    }
    return;
  }
  std::vector<const uint8_t*> parts(exact_parts);
  parts.insert(parts.end(), codec_parts.begin(), codec_parts.end());
  if (parts != convert_parts_) {
    // Ordered after the kernels queued before (pageable: staged before the call returns).
    STRATA_CUDA_CHECK(cudaMemcpyAsync(convert_mem_, parts.data(), parts.size() * sizeof(void*), cudaMemcpyHostToDevice, stream));
    convert_parts_ = std::move(parts);
  }
  KvCodecConvertArgs a{};
  a.src_parts = static_cast<const uint8_t* const*>(convert_mem_);
  a.dst_parts = static_cast<uint8_t* const*>(convert_mem_) + 2 * L;
  a.k_fmt = qk_[0];
  a.v_fmt = qv_[0];
  a.src_f32 = k_[0].kind == KvRowKindGpu::kF32;
  a.n_layers = int32_t(L);
  a.n_kv_heads = geom_[0].n_kv_heads;
  a.block_size = block_size;
  a.n_blocks = n_blocks;
  a.src_blocks = src_blocks;
  a.dst_blocks = dst_blocks;
  a.turbo_signs = turbo_signs_;
  launch_kv_codec_convert(a, stream);
}

}  // namespace strata::cuda
