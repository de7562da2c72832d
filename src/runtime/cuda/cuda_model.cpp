#include "runtime/cuda/cuda_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/family_kernels.h"
#include "backend/cuda/fp8.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/token_feed.h"
#include "core/log.h"
#include "kv/kv_plan.h"
#include "model/decoder.h"
#include "model/quant.h"
#include "model/registry.h"
#include "model/rope.h"
#include "model/safetensors.h"
#include "model/weight_loader.h"
#include "model/weight_manifest.h"
#include "runtime/cuda/cuda_family.h"
#include "runtime/cuda/cuda_hybrid.h"
#include "runtime/cuda/cuda_model_parts.h"
#include "tensor/dtype.h"

namespace strata::cuda {

using namespace model_parts;

void CudaDecoder::set_max_splits(int32_t n) { max_splits_ = std::clamp(n, 1, kMaxSplits); }

void CudaDecoder::clear_cuda_graphs() {
  STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (auto& [size, exec] : decode_graphs_) cudaGraphExecDestroy(exec);
  decode_graphs_.clear();
  decode_seen_.clear();
}

CudaDecoder::CudaDecoder() = default;

CudaDecoder::~CudaDecoder() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (auto& [size, exec] : decode_graphs_) cudaGraphExecDestroy(exec);
  if (buf_) {
    if (buf_->meta_host != nullptr) cudaFreeHost(buf_->meta_host);
    if (buf_->meta_copied != nullptr) cudaEventDestroy(buf_->meta_copied);
  }
  gemm_.reset();
  if (convert_ids_ != nullptr) cudaFree(convert_ids_);
  for (auto& h : convert_host_) {
    if (h.ids != nullptr) cudaFreeHost(h.ids);
    if (h.copied != nullptr) cudaEventDestroy(h.copied);
  }
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

int32_t CudaDecoder::n_kv_blocks() const { return kv_->n_blocks(); }

int32_t CudaDecoder::n_kv_window_blocks() const { return kv_->n_window_blocks(); }

int32_t CudaDecoder::n_kv_quant_blocks() const { return quant_kv_ ? quant_kv_->n_blocks() : 0; }

Status CudaDecoder::convert_kv_blocks(std::span<const int32_t> src, std::span<const int32_t> dst) {
  if (!quant_kv_) return make_error(ErrorCode::kInvalidArgument, "convert_kv_blocks: the decoder keeps no codec pool");
  if (src.size() != dst.size()) return make_error(ErrorCode::kInvalidArgument, "convert_kv_blocks: src and dst differ in length");
  if (src.empty()) return Status();
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] < 0 || src[i] >= kv_->n_blocks() || dst[i] < 0 || dst[i] >= quant_kv_->n_blocks()) {
      return make_error(ErrorCode::kOutOfRange, "convert_kv_blocks: block pair (" + std::to_string(src[i]) + ", " +
                                                    std::to_string(dst[i]) + ") outside the pools");
    }
  }
  const int64_t n = int64_t(src.size());
  if (n > convert_cap_) {
    // Kernels queued earlier may still read the old arrays.
    STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    if (convert_ids_ != nullptr) cudaFree(convert_ids_);
    for (auto& h : convert_host_) {
      if (h.ids != nullptr) cudaFreeHost(h.ids);
      h.ids = nullptr;
    }
    convert_ids_ = nullptr;
    convert_cap_ = 0;
    const int64_t cap = std::max<int64_t>(n, 256);
    STRATA_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&convert_ids_), size_t(2 * cap) * sizeof(int32_t)));
    for (auto& h : convert_host_) {
      STRATA_CUDA_RETURN_IF_ERROR(cudaMallocHost(reinterpret_cast<void**>(&h.ids), size_t(2 * cap) * sizeof(int32_t)));
      if (h.copied == nullptr) STRATA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&h.copied, cudaEventDisableTiming));
      h.pending = false;
    }
    convert_cap_ = cap;
  }
  // Pinned staging, two in turn: the copy is queued behind the step in flight (overlapped
  // steps), so the host waits only for the copy of two calls ago, long done.
  ConvertStaging& h = convert_host_[convert_turn_];
  convert_turn_ ^= 1;
  if (h.pending) STRATA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(h.copied));
  std::copy(src.begin(), src.end(), h.ids);
  std::copy(dst.begin(), dst.end(), h.ids + convert_cap_);
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(convert_ids_, h.ids, size_t(2 * convert_cap_) * sizeof(int32_t),
                                              cudaMemcpyHostToDevice, stream_));
  STRATA_CUDA_RETURN_IF_ERROR(cudaEventRecord(h.copied, stream_));
  h.pending = true;
  std::vector<const uint8_t*> exact_parts;
  std::vector<uint8_t*> codec_parts;
  for (int p = 0; p < 2 * kv_->layout().n_layers; ++p) {
    exact_parts.push_back(kv_->part(p));
    codec_parts.push_back(quant_kv_->part(p));
  }
  codec_->convert_all_blocks(exact_parts, codec_parts, convert_ids_, convert_ids_ + convert_cap_, int32_t(n), opt_.block_size, stream_);
  return cudaGetLastError() == cudaSuccess ? Status() : make_error(ErrorCode::kInternal, "convert_kv_blocks: a launch failed");
}

Status CudaDecoder::init_common(const CudaModelOptions& options) {
  opt_ = options;
  const Dims d = dims_of(cfg_);
  if (d.hd % 8 != 0 || d.hd > 256) {
    return make_error(ErrorCode::kUnsupported, "head_dim " + std::to_string(d.hd) + " (the CUDA attention needs a multiple of 8, at most 256)");
  }
  if (d.nkv <= 0 || d.nh % d.nkv != 0) return make_error(ErrorCode::kInvalidArgument, "num_attention_heads must be a multiple of num_key_value_heads");
  if (d.nh / d.nkv > attention_max_rows()) return make_error(ErrorCode::kUnsupported, "GQA group larger than " + std::to_string(attention_max_rows()));
  if (opt_.max_tokens <= 0 || opt_.max_seqs <= 0 || opt_.max_blocks_per_seq <= 0 || opt_.max_logit_rows <= 0 || opt_.block_size <= 0) {
    return make_error(ErrorCode::kInvalidArgument, "CUDA model options must be positive");
  }
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  buf_ = std::make_unique<Buffers>();
  KvPoolLayout kl;
  kl.n_layers = kv_layers_ > 0 ? kv_layers_ : int32_t(d.L);
  kl.n_kv_heads = int32_t(d.nkv);
  kl.head_dim = int32_t(d.hd);
  kl.block_size = opt_.block_size;
  // Split weights (f32/f16 checkpoints): with no codecs asked for, every layer's rows are f32
  // and so is the attention (the bf16 KV cache alone exceeds the goldens' bound for Gemma 3/4).
  std::vector<KvCodecSpec> specs = opt_.kv_codecs;
  const ModelConfig& attn_cfg = attn_cfg_.n_layers > 0 ? attn_cfg_ : cfg_;
  bool auto_f32 = auto_f32_kv_ && opt_.auto_kv_f32 && kv_layers_ == 0;
  if (auto_f32 && specs.empty()) {
    specs.assign(size_t(std::max(cfg_.n_layers, 0)), KvCodecSpec{});
    if (const Status s = KvCodecStep::supported(attn_cfg, specs, true); !s.ok()) {
      log::info("CUDA {}: KV cache bf16 (f32 rows not taken: {})", cfg_.model_type, s.error().message);
      specs.clear();
      auto_f32 = false;
    } else {
      log::info("CUDA {}: split weights, KV cache kept as f32 rows with f32 attention (KvRowKind::kF32)", cfg_.model_type);
    }
  }
  kv_f32_rows_ = auto_f32 && std::any_of(specs.begin(), specs.end(), [](const KvCodecSpec& x) { return x.codec == KvCodec::kAuto; });
  const bool quant = opt_.kv_quant_start > 0;
  if (quant) {
    // Delayed quantization: the exact rows (f32 or bf16) here, the codecs in a second pool.
    if (!opt_.kv_codecs.empty() || int64_t(opt_.kv_quant_codecs.size()) != int64_t(cfg_.n_layers)) {
      return make_error(ErrorCode::kInvalidArgument, "--kv-quant-start: the codec pool needs one codec per layer and exact rows in the first pool");
    }
    if (!auto_f32) specs.assign(size_t(cfg_.n_layers), KvCodecSpec{KvCodec::kBf16, 0});
    auto c = KvCodecStep::create(attn_cfg, specs, opt_.max_tokens, opt_.max_seqs, auto_f32, opt_.kv_quant_codecs);
    if (!c.ok()) return c.error();
    codec_ = std::move(*c);
    kl.row_bytes = codec_->row_bytes();
  } else if (KvCodecStep::any_codec(specs, auto_f32)) {
    auto c = KvCodecStep::create(attn_cfg, specs, opt_.max_tokens, opt_.max_seqs, auto_f32);
    if (!c.ok()) return c.error();
    codec_ = std::move(*c);
    kl.row_bytes = codec_->row_bytes();
  }
  // Window paging needs both kinds of layer (a model of sliding layers only keeps one pool).
  if (opt_.kv_window_paging && kv_layers_ == 0 && cfg_.sliding_window > 0) {
    for (int l = 0; l < cfg_.n_layers; ++l) kl.window_layers.push_back(cfg_.is_sliding(l) ? 1 : 0);
    if (kl.window_paged() && !kl.block_parts().empty()) {
      max_window_ = cfg_.sliding_window;
    } else {
      kl.window_layers.clear();
    }
  }
  // The pools' blocks: the one KV plan over this pool's row bytes.
  const int64_t bs = opt_.block_size;
  KvPoolShape shape;
  shape.full_bytes_per_token = kl.bytes_per_block() / bs;
  shape.window_bytes_per_token = kl.window_bytes_per_block() / bs;
  shape.window = max_window_;
  KvPoolLayout ql = kl;
  if (quant) {
    // Sliding-window layers keep their few blocks exact, in the window pool: the codec pool is
    // the full-attention layers' (its window parts one block that is never read).
    bool sliding = false;
    for (int l = 0; l < cfg_.n_layers; ++l) sliding = sliding || cfg_.is_sliding(l);
    if (sliding && !kl.window_paged()) {
      return make_error(ErrorCode::kUnsupported, "--kv-quant-start " + std::to_string(opt_.kv_quant_start) +
                                                     ": the sliding-window layers of " + cfg_.model_type +
                                                     " do not page apart here, and only full-attention layers convert");
    }
    ql.row_bytes = codec_->quant_row_bytes();
    ql.window_blocks = ql.window_paged() ? 1 : 0;
    shape.quant_bytes_per_token = ql.bytes_per_block() / bs;
  }
  KvLimits limits;
  limits.kv_cache_bytes = opt_.kv_cache_bytes;
  limits.kv_window_blocks = opt_.kv_window_blocks;
  limits.block_size = opt_.block_size;
  limits.max_num_seqs = opt_.max_seqs;
  limits.max_batch_tokens = opt_.max_tokens;
  auto plan = plan_kv_pools(shape, limits, opt_.max_blocks_per_seq * opt_.block_size, opt_.kv_quant_start);
  if (!plan.ok()) return plan.error();
  kl.window_blocks = plan->n_window_blocks;
  if (quant) {
    auto qkv = KvBlockPool::create(ql, int64_t(plan->n_quant_blocks) * ql.bytes_per_block() + ql.window_bytes_per_block());
    if (!qkv.ok()) return qkv.error();
    quant_kv_ = std::move(*qkv);
  }
  auto kv = KvBlockPool::create(kl, int64_t(plan->n_blocks) * kl.bytes_per_block() +
                                        int64_t(plan->n_window_blocks) * kl.window_bytes_per_block());
  if (!kv.ok()) return kv.error();
  kv_ = std::move(*kv);
  return Status();
}

Status CudaDecoder::take_weight_arena(size_t bytes) {
  auto arena = DeviceArena::create(bytes, "model weights and scratch");
  if (!arena.ok()) return arena.error();
  arena_ = std::move(*arena);
  return Status();
}

namespace {

using WeightSink = CudaDecoder::WeightSink;
using Fp8Matrix = CudaDecoder::Fp8Matrix;

// The layer matrices the FP8 kernels take (the GEMMs of Layer::qkv, o, gate_up, down).
bool fp8_role(const std::vector<const WeightEntry*>& parts) {
  const WeightRole r = parts.front()->role;
  return r == WeightRole::kQ || r == WeightRole::kO || r == WeightRole::kGate || r == WeightRole::kDown;
}

// The rows and columns of a group of 2-D entries concatenated by rows (false: not such a group,
// or a part other than the last whose rows are not whole 128-row blocks, so the parts' block
// scales would not stack).
bool fp8_group_shape(const std::vector<const WeightEntry*>& parts, int64_t* rows, int64_t* cols) {
  *rows = 0;
  *cols = parts.front()->shape.size() == 2 ? parts.front()->shape[1] : 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto& sh = parts[i]->shape;
    if (sh.size() != 2 || sh[1] != *cols) return false;
    if (i + 1 < parts.size() && sh[0] % kFp8Block != 0) return false;
    *rows += sh[0];
  }
  return *cols > 0 && *cols % 16 == 0;
}

class CheckpointSink : public WeightSink {
 public:
  CheckpointSink(WeightLoader w, DeviceArena& arena, WeightSplit& split, std::vector<Fp8Matrix>* fp8 = nullptr)
      : w_(std::move(w)), arena_(arena), split_(split), fp8_(fp8) {}
  Result<uint16_t*> matrix(const std::vector<const WeightEntry*>& parts) override {
    if (fp8_ != nullptr && fp8_role(parts)) {
      auto p = fp8_matrix(parts);
      if (!p.ok()) return p.error();
      if (*p != nullptr) return *p;
    }
    std::vector<float> v;
    for (const WeightEntry* e : parts) {
      auto t = (e->absolute ? w_.with_prefix("") : w_).f32(e->name, e->shape);
      if (!t.ok()) return t.error();
      v.insert(v.end(), t->begin(), t->end());
    }
    return split_.upload(arena_, v, parts.front()->name);
  }
  Result<float*> vector(const std::vector<const WeightEntry*>& parts) override {
    std::vector<float> v;
    for (const WeightEntry* e : parts) {
      auto t = w_.vector(e->name, e->shape[0]);
      if (!t.ok()) return t.error();
      v.insert(v.end(), t->begin(), t->end());
    }
    return upload_f32(arena_, v, parts.front()->name);
  }

 private:
  // A fine-grained FP8 group uploaded as its codes and block scales; null when a part is not
  // stored that way (modules_to_not_convert, other dtypes): the caller dequantizes the group.
  Result<uint16_t*> fp8_matrix(const std::vector<const WeightEntry*>& parts) {
    int64_t rows = 0, cols = 0;
    if (!fp8_group_shape(parts, &rows, &cols)) return nullptr;
    const SafetensorsArchive& a = *w_.archive();
    std::vector<std::pair<const TensorInfo*, const TensorInfo*>> ts;
    for (const WeightEntry* e : parts) {
      const std::string name = (e->absolute ? std::string() : w_.prefix()) + e->name;
      const TensorInfo* t = a.find(name);
      const std::string sname = fp8_block_scale_name(name);
      if (t == nullptr || t->dtype != DType::kF8E4M3 || sname.empty()) return nullptr;
      const TensorInfo* sc = a.find(sname);
      if (sc == nullptr) return make_error(ErrorCode::kInvalidArgument, t->file + ": FP8 tensor '" + name + "' has no '" + sname + "'");
      if (t->shape != e->shape) {
        return make_error(ErrorCode::kInvalidArgument, t->file + ": tensor '" + name + "' has shape " + t->shape_string() +
                                                           ", the config gives [" + std::to_string(e->shape[0]) + ", " +
                                                           std::to_string(e->shape[1]) + "]");
      }
      const std::vector<int64_t> want = {fp8_blocks(e->shape[0]), fp8_blocks(e->shape[1])};
      if (sc->shape != want || (sc->dtype != DType::kF32 && sc->dtype != DType::kBF16)) {
        return make_error(ErrorCode::kInvalidArgument, sc->file + ": tensor '" + sname + "' has shape " + sc->shape_string() +
                                                           " dtype " + dtype_name(sc->dtype) + ", 128x128 block scales need [" +
                                                           std::to_string(want[0]) + ", " + std::to_string(want[1]) + "] F32");
      }
      ts.emplace_back(t, sc);
    }
    auto codes = arena_.take_array<uint8_t>(size_t(rows * cols), parts.front()->name);
    if (!codes.ok()) return codes.error();
    std::vector<float> scales;
    int64_t off = 0;
    for (const auto& [t, sc] : ts) {
      STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(*codes + off, t->data, t->n_bytes, cudaMemcpyHostToDevice));
      off += int64_t(t->n_bytes);
      std::vector<float> s(size_t(sc->numel()));
      STRATA_RETURN_IF_ERROR(convert_to_f32(*sc, sc->data, sc->numel(), s.data()));
      scales.insert(scales.end(), s.begin(), s.end());
    }
    auto dev_scales = upload_f32(arena_, scales, parts.front()->name + " scales");
    if (!dev_scales.ok()) return dev_scales.error();
    uint16_t* w = reinterpret_cast<uint16_t*>(*codes);
    fp8_->push_back({w, *dev_scales, rows, cols});
    return w;
  }

  WeightLoader w_;
  DeviceArena& arena_;
  WeightSplit& split_;
  std::vector<Fp8Matrix>* fp8_;
};

// --load-format dummy: matrices uniform in [-scale, scale] (one draw per group), vectors their
// entries' constants (norms at their unit, biases 0).
// With fp8: the layer matrices are drawn so into a bf16 staging buffer, then quantized to FP8
// blocks in the arena (fp8.h).
class RandomSink : public WeightSink {
 public:
  RandomSink(DeviceArena& arena, uint64_t seed, float scale, cudaStream_t stream, std::vector<Fp8Matrix>* fp8 = nullptr)
      : arena_(arena), seed_(seed), scale_(scale), stream_(stream), fp8_(fp8) {}
  ~RandomSink() override {
    if (staging_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaFree(staging_);
    }
  }
  Result<uint16_t*> matrix(const std::vector<const WeightEntry*>& parts) override {
    int64_t rows = 0, cols = 0;
    if (fp8_ != nullptr && fp8_role(parts) && fp8_group_shape(parts, &rows, &cols)) {
      if (rows * cols > staging_elems_) {
        if (staging_ != nullptr) {
          STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
          STRATA_CUDA_RETURN_IF_ERROR(cudaFree(staging_));
          staging_ = nullptr;
        }
        STRATA_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&staging_), size_t(rows * cols) * 2));
        staging_elems_ = rows * cols;
      }
      auto codes = arena_.take_array<uint8_t>(size_t(rows * cols), parts.front()->name);
      if (!codes.ok()) return codes.error();
      auto scales = arena_.take_array<float>(size_t(fp8_blocks(rows) * fp8_blocks(cols)), parts.front()->name + " scales");
      if (!scales.ok()) return scales.error();
      launch_fill_random_bf16(staging_, rows * cols, ++seed_, scale_, stream_);
      launch_quantize_fp8_blocks(staging_, *codes, *scales, rows, cols, stream_);
      uint16_t* w = reinterpret_cast<uint16_t*>(*codes);
      fp8_->push_back({w, *scales, rows, cols});
      return w;
    }
    int64_t n = 0;
    for (const WeightEntry* e : parts) n += e->numel();
    auto p = arena_.take_array<uint16_t>(size_t(n), parts.front()->name);
    if (!p.ok()) return p.error();
    launch_fill_random_bf16(*p, n, ++seed_, scale_, stream_);
    return *p;
  }
  Result<float*> vector(const std::vector<const WeightEntry*>& parts) override {
    int64_t n = 0;
    for (const WeightEntry* e : parts) n += e->numel();
    auto p = arena_.take_array<float>(size_t(n), parts.front()->name);
    if (!p.ok()) return p.error();
    int64_t off = 0;
    for (const WeightEntry* e : parts) {
      if (e->init != WeightInit::kConstant) return make_error(ErrorCode::kUnsupported, e->name + ": no random vector init on the GPU");
      launch_fill_f32(*p + off, e->numel(), e->value, stream_);
      off += e->numel();
    }
    return *p;
  }

 private:
  DeviceArena& arena_;
  uint64_t seed_;
  float scale_;
  cudaStream_t stream_;
  std::vector<Fp8Matrix>* fp8_;
  uint16_t* staging_ = nullptr;
  int64_t staging_elems_ = 0;
};

// The entries of `layer` grouped as a backend fuses them (WeightFuse), in manifest order.
std::vector<std::vector<const WeightEntry*>> fused_groups(const WeightManifest& m, int32_t layer) {
  std::vector<std::vector<const WeightEntry*>> groups;
  std::vector<WeightFuse> kinds;
  for (const WeightEntry* e : m.of_layer(layer)) {
    auto it = std::find(kinds.begin(), kinds.end(), e->fuse);
    if (e->fuse == WeightFuse::kNone || it == kinds.end()) {
      groups.push_back({e});
      kinds.push_back(e->fuse);
    } else {
      groups[size_t(it - kinds.begin())].push_back(e);
    }
  }
  return groups;
}

}  // namespace

void CudaDecoder::adopt_family(const FamilyFlags& flags, cpu::Activation act, const CudaModelOptions& options) {
  qk_norm_ = flags.qk_norm;
  qkv_bias_ = flags.qkv_bias;
  o_bias_ = flags.o_bias;
  act_ = act == cpu::Activation::kSilu ? int32_t(Act::kSilu) : int32_t(Act::kGeluTanh);
  one_plus_w_ = flags.one_plus_w;
  sandwich_ = flags.sandwich;
  embed_scale_ = flags.embed_scale;
  attn_softcap_ = options.attn_softcap ? flags.attn_softcap : 0.0f;
  final_softcap_ = flags.final_softcap;
  moe_ = flags.moe;
  fused_ok_ = !one_plus_w_ && !sandwich_ && embed_scale_ == 1.0f && attn_softcap_ == 0.0f && final_softcap_ == 0.0f && !moe_;
  attn_scale_ = flags.attn_scale > 0.0f ? flags.attn_scale : float(1.0 / std::sqrt(double(cfg_.head_dim)));
}

Status CudaDecoder::attach_fp8() {
  if (fp8_mats_.empty()) return Status();
  int64_t max_k = 0, max_n = 0;
  for (const Fp8Matrix& f : fp8_mats_) {
    max_k = std::max(max_k, f.k);
    max_n = std::max(max_n, f.n);
  }
  STRATA_RETURN_IF_ERROR(gemm_->enable_fp8(opt_.max_tokens, max_k, max_n));
  for (const Fp8Matrix& f : fp8_mats_) STRATA_RETURN_IF_ERROR(gemm_->add_fp8(f.w, f.scales, f.n, f.k));
  log::info("CUDA {}: {} layer matrices in FP8 (128x128 block scales): FP8 GEMV for decode rows, block-scaled FP8 GEMMs "
            "with per-token activation scales for larger steps",
            cfg_.model_type, fp8_mats_.size());
  return Status();
}

Status CudaDecoder::upload_rope(const RopeConfig& rc) {
  auto tab = compute_rope(rc, int32_t(cfg_.head_dim), cfg_.max_position);
  if (!tab.ok()) return tab.error();
  auto f = upload_f32(*arena_, tab->inv_freq, "RoPE table");
  if (!f.ok()) return f.error();
  buf_->rope_inv_freq.push_back(*f);
  buf_->rope_rot_dim.push_back(tab->rot_dim);
  buf_->rope_attn_factor.push_back(tab->attn_factor);
  return Status();
}

Status CudaDecoder::place_weights(const WeightManifest& manifest, WeightSink& sink) {
  Buffers& B = *buf_;
  auto mat = [&](uint16_t** dst, const std::vector<const WeightEntry*>& parts) -> Status {
    auto p = sink.matrix(parts);
    if (!p.ok()) return p.error();
    *dst = *p;
    return Status();
  };
  auto vec = [&](float** dst, const std::vector<const WeightEntry*>& parts) -> Status {
    auto p = sink.vector(parts);
    if (!p.ok()) return p.error();
    *dst = *p;
    return Status();
  };
  STRATA_RETURN_IF_ERROR(mat(&B.embed, {manifest.find(WeightRole::kEmbed)}));
  if (manifest.tied_embeddings) {
    B.lm_head = B.embed;
  } else {
    STRATA_RETURN_IF_ERROR(mat(&B.lm_head, {manifest.find(WeightRole::kLmHead)}));
  }
  STRATA_RETURN_IF_ERROR(vec(&B.final_norm, {manifest.find(WeightRole::kFinalNorm)}));
  layers_.resize(size_t(cfg_.n_layers));
  for (int32_t l = 0; l < cfg_.n_layers; ++l) {
    Layer& L = layers_[size_t(l)];
    for (const auto& g : fused_groups(manifest, l)) {
      Status st;
      switch (g.front()->role) {
        case WeightRole::kQ: st = mat(&L.qkv, g); break;
        case WeightRole::kO: st = mat(&L.o, g); break;
        case WeightRole::kGate: st = mat(&L.gate_up, g); break;
        case WeightRole::kDown: st = mat(&L.down, g); break;
        case WeightRole::kRouter: st = mat(&L.router, g); break;
        case WeightRole::kExpertGate: st = mat(&L.experts_gate_up, g); break;
        case WeightRole::kExpertDown: st = mat(&L.experts_down, g); break;
        case WeightRole::kInputNorm: st = vec(&L.in_norm, g); break;
        // Plain layers: the FFN's input norm; sandwich layers: the attention output's.
        case WeightRole::kPostAttnNorm: st = vec(sandwich_ ? &L.attn_out_norm : &L.post_norm, g); break;
        case WeightRole::kPreFfnNorm: st = vec(&L.post_norm, g); break;
        case WeightRole::kPostFfnNorm: st = vec(&L.ffn_out_norm, g); break;
        case WeightRole::kQBias: st = vec(&L.qkv_bias, g); break;
        case WeightRole::kOBias: st = vec(&L.o_bias, g); break;
        case WeightRole::kQNorm: st = vec(&L.q_norm, g); break;
        case WeightRole::kKNorm: st = vec(&L.k_norm, g); break;
        default: return make_error(ErrorCode::kUnsupported, g.front()->name + " has no place in the CUDA decoder");
      }
      if (!st.ok()) return st;
    }
  }
  return Status();
}

Result<std::unique_ptr<CudaDecoder>> CudaDecoder::load(const std::string& dir, const CudaModelOptions& given) {
  auto cfg = load_model_config(dir);
  if (!cfg.ok()) return cfg.error();
  auto flags = family_flags(*cfg);
  if (!flags.ok()) return flags.error();
  auto archive = SafetensorsArchive::open_dir(dir);
  if (!archive.ok()) return archive.error();
  STRATA_RETURN_IF_ERROR(resolve_weight_names(&*cfg, **archive));
  if (flags->gemma4) return load_gemma4(*cfg, *archive, given);
  if (flags->hybrid) return load_hybrid(*cfg, *archive, given);
  auto spec = family_decoder_spec(*cfg);
  if (!spec.ok()) return spec.error();
  auto manifest = decoder_manifest(*cfg, *spec);
  if (!manifest.ok()) return manifest.error();
  // Fine-grained FP8 keeps its codes on the device; its f32 block scales do not make it a
  // checkpoint wider than bf16 (no hi + lo split).
  const QuantConfig* q = cfg->quant.get();
  const bool fp8 = q != nullptr && q->format == QuantFormat::kFp8Block && q->block_rows == kFp8Block &&
                   q->block_cols == kFp8Block && given.fp8_weights == CudaModelOptions::Fp8Weights::kAuto &&
                   !given.deterministic;
  CudaModelOptions options = given;
  if (fp8 && options.split_weights == CudaModelOptions::SplitWeights::kAuto) {
    options.split_weights = CudaModelOptions::SplitWeights::kOff;
  }

  std::unique_ptr<CudaDecoder> m(new CudaDecoder());
  m->cfg_ = *cfg;
  m->adopt_family(*flags, spec->act, options);
  m->auto_f32_kv_ = WeightSplit::splits(**archive, options);
  STRATA_RETURN_IF_ERROR(m->init_common(options));
  const Dims d = dims_of(m->cfg_);
  std::vector<int32_t> rope_index;
  const auto types = rope_types(m->cfg_, &rope_index);
  STRATA_RETURN_IF_ERROR(m->take_weight_arena(arena_bytes(d, options, manifest->tied_embeddings, int(types.size()))));
  DeviceArena& A = *m->arena_;
  Buffers& B = *m->buf_;
  // f32 / f16 checkpoints: matrices go up as bf16 hi + lo pairs (weight_split.h).
  B.split = WeightSplit::for_checkpoint(**archive, options, m->cfg_.model_type);
  if (B.split->on()) m->fused_ok_ = false;
  CheckpointSink sink(WeightLoader(*archive, m->cfg_.weight_prefix, m->cfg_.quant), A, *B.split,
                      fp8 ? &m->fp8_mats_ : nullptr);
  STRATA_RETURN_IF_ERROR(m->place_weights(*manifest, sink));
  for (const auto& t : types) {
    if (t != "full_attention" && t != "sliding_attention") {
      return make_error(ErrorCode::kUnsupported, "layer type '" + t + "' has no CUDA forward");
    }
    const RopeConfig& rc = m->cfg_.rope_for(t);
    if (rc.type == "dynamic") return make_error(ErrorCode::kUnsupported, "dynamic RoPE has no CUDA forward yet");
    STRATA_RETURN_IF_ERROR(m->upload_rope(rc));
  }
  for (int64_t l = 0; l < d.L; ++l) {
    Layer& L = m->layers_[size_t(l)];
    L.rope = rope_index[size_t(l)];
    L.window = m->cfg_.is_sliding(int(l)) ? m->cfg_.sliding_window : 0;
  }
  m->weight_bytes_ = int64_t(A.used());
  void* ws = nullptr;
  STRATA_RETURN_IF_ERROR(take_scratch(A, d, options, &B, &ws));
  auto g = Gemm::create(ws, kGemmWorkspace);
  if (!g.ok()) return g.error();
  m->gemm_ = std::move(*g);
  STRATA_RETURN_IF_ERROR(m->attach_fp8());
  std::vector<WeightSplit::Input> split_inputs = {{B.h, options.max_tokens, d.H}, {B.rows_h, options.max_logit_rows, d.H},
                                                   {B.act, options.max_tokens, d.I}};
  // The codec attention writes its output's lo part too (o_proj then reads hi + lo).
  if (m->codec_) split_inputs.push_back({B.attn, options.max_tokens, d.nh * d.hd});
  STRATA_RETURN_IF_ERROR(B.split->attach(*m->gemm_, options.max_tokens, 2 * d.I, split_inputs));
  if (m->codec_) m->codec_->set_out_lo(B.split->input_lo(B.attn));
  return m;
}

Result<std::unique_ptr<CudaDecoder>> CudaDecoder::random(const ModelConfig& cfg, const CudaModelOptions& options,
                                                         uint64_t seed, float scale) {
  auto flags = family_flags(cfg);
  if (!flags.ok()) return flags.error();
  if (flags->hybrid) return load_hybrid(cfg, nullptr, options, seed, scale);
  if (flags->gemma4) {
    return make_error(ErrorCode::kUnsupported, "random weights for " + cfg.model_type + " are not supported on the GPU");
  }
  auto spec = family_decoder_spec(cfg);
  if (!spec.ok()) return spec.error();
  ModelConfig named = cfg;
  named.lm_head_name.clear();  // dummies name their tensors as the manifest does
  auto manifest = decoder_manifest(named, *spec);
  if (!manifest.ok()) return manifest.error();
  std::unique_ptr<CudaDecoder> m(new CudaDecoder());
  m->cfg_ = cfg;
  m->adopt_family(*flags, spec->act, options);
  STRATA_RETURN_IF_ERROR(m->init_common(options));
  const Dims d = dims_of(cfg);
  std::vector<int32_t> rope_index;
  const auto types = rope_types(cfg, &rope_index);
  STRATA_RETURN_IF_ERROR(m->take_weight_arena(arena_bytes(d, options, manifest->tied_embeddings, int(types.size()))));
  DeviceArena& A = *m->arena_;
  Buffers& B = *m->buf_;
  if (options.random_fp8 && options.deterministic) {
    return make_error(ErrorCode::kInvalidArgument, "--quantization fp8: random FP8 weights with --deterministic are not supported (its batch-invariant GEMMs are bf16)");
  }
  {
    RandomSink sink(A, seed, scale, m->stream_, options.random_fp8 ? &m->fp8_mats_ : nullptr);
    STRATA_RETURN_IF_ERROR(m->place_weights(*manifest, sink));
  }
  for (const auto& t : types) STRATA_RETURN_IF_ERROR(m->upload_rope(cfg.rope_for(t)));
  for (int64_t l = 0; l < d.L; ++l) {
    Layer& L = m->layers_[size_t(l)];
    L.rope = rope_index[size_t(l)];
    L.window = cfg.is_sliding(int(l)) ? cfg.sliding_window : 0;
  }
  m->weight_bytes_ = int64_t(A.used());
  void* ws = nullptr;
  STRATA_RETURN_IF_ERROR(take_scratch(A, d, options, &B, &ws));
  auto g = Gemm::create(ws, kGemmWorkspace);
  if (!g.ok()) return g.error();
  m->gemm_ = std::move(*g);
  STRATA_RETURN_IF_ERROR(m->attach_fp8());
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(m->stream_));
  return m;
}

Status CudaDecoder::enqueue(const StepBatch& batch) {
  const Dims d = dims_of(cfg_);
  Buffers& B = *buf_;
  const int64_t n = batch.n_tokens();
  const int64_t n_seqs = int64_t(batch.seqs.size());
  const int64_t n_rows = batch.n_logit_rows();
  if (n == 0) {
    n_logit_rows_ = 0;
    return Status();
  }
  if (n > opt_.max_tokens) return make_error(ErrorCode::kOutOfRange, "step has " + std::to_string(n) + " tokens, more than max_tokens " + std::to_string(opt_.max_tokens));
  if (n_seqs > opt_.max_seqs) return make_error(ErrorCode::kOutOfRange, "step has " + std::to_string(n_seqs) + " sequences, more than max_seqs " + std::to_string(opt_.max_seqs));
  if (n_rows > opt_.max_logit_rows) return make_error(ErrorCode::kOutOfRange, "step asks for " + std::to_string(n_rows) + " logit rows, more than " + std::to_string(opt_.max_logit_rows));

  // The previous step's metadata copy must have left the pinned buffer before it is rewritten.
  if (B.meta_pending) STRATA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(B.meta_copied));
  int32_t* tokens = B.host<int32_t>(B.off_tokens);
  int32_t* positions = B.host<int32_t>(B.off_positions);
  int64_t* slots = B.host<int64_t>(B.off_slots);
  int32_t* tables = B.host<int32_t>(B.off_tables);
  int32_t* q_start = B.host<int32_t>(B.off_q_start);
  int32_t* pos0 = B.host<int32_t>(B.off_pos0);
  int32_t* tile_seq = B.host<int32_t>(B.off_tile_seq);
  int32_t* tile_q0 = B.host<int32_t>(B.off_tile_q0);
  int32_t* row_map = B.host<int32_t>(B.off_row_map);
  // Split-KV when the query tiles alone would leave most multiprocessors idle (decode). The
  // count depends on the batch shape only (not on the context), so a decode step of a given
  // batch size always launches the same grids and can be replayed from a graph; splits past
  // the context are empty and the combine skips them.
  int32_t n_splits = 1;
  // Deterministic: every step unsplit, so a token's key order never depends on its batch.
  if (opt_.deterministic && !gemm_->batch_invariant()) gemm_->set_batch_invariant(kInvariantGemmRows);
  if (n <= opt_.max_seqs && !opt_.deterministic) {
    const int32_t cc_tpt = attention_tokens_per_tile(int32_t(d.nh), int32_t(d.nkv), int32_t(d.hd), 2);
    int64_t cc_tiles = 0;
    for (const SeqSpan& sp : batch.seqs) cc_tiles += (sp.n_tokens + cc_tpt - 1) / cc_tpt;
    const int64_t blocks = cc_tiles * d.nkv;
    if (blocks < 264) n_splits = int32_t(std::clamp<int64_t>((264 + blocks - 1) / blocks, 1, max_splits_));
  }
  const int32_t tpt = attention_tokens_per_tile(int32_t(d.nh), int32_t(d.nkv), int32_t(d.hd), n_splits);
  const int32_t bs = opt_.block_size;
  int64_t t = 0, n_tiles = 0, r = 0;
  bool decode_shape = true;  // every sequence one token with its logit row
  for (int64_t s = 0; s < n_seqs; ++s) {
    const SeqSpan& sp = batch.seqs[size_t(s)];
    const int64_t end = int64_t(sp.pos0) + sp.n_tokens;
    const int64_t need = (end + bs - 1) / bs;
    if (sp.pos0 < 0 || sp.n_tokens < 0) return make_error(ErrorCode::kInvalidArgument, "sequence " + std::to_string(s) + " has a negative position or length");
    if (int64_t(sp.block_table.size()) < need) {
      return make_error(ErrorCode::kInvalidArgument, "sequence " + std::to_string(s) + ": block table of " + std::to_string(sp.block_table.size()) +
                                                         " blocks does not cover " + std::to_string(end) + " positions");
    }
    if (need > opt_.max_blocks_per_seq) return make_error(ErrorCode::kOutOfRange, "sequence " + std::to_string(s) + " needs " + std::to_string(need) + " blocks, more than max_blocks_per_seq");
    // Delayed quantization: entries [0, n_quant_blocks) are codec-pool ids, behind the tokens written.
    const int64_t n_quant = sp.n_quant_blocks;
    if (n_quant < 0 || (n_quant > 0 && !quant_kv_) || n_quant * bs > sp.pos0) {
      return make_error(ErrorCode::kInvalidArgument, "sequence " + std::to_string(s) + ": n_quant_blocks " + std::to_string(n_quant) +
                                                         (quant_kv_ ? " reaches its first new position " + std::to_string(sp.pos0)
                                                                    : std::string(" without a codec pool")));
    }
    if (quant_kv_) B.host<int32_t>(B.off_quant)[s] = int32_t(n_quant);
    for (int64_t b = 0; b < need; ++b) {
      const int32_t id = sp.block_table[size_t(b)];
      const int32_t pool_blocks = b < n_quant ? quant_kv_->n_blocks() : kv_->n_blocks();
      if (id < 0 || id >= pool_blocks) {
        return make_error(ErrorCode::kOutOfRange, "block id " + std::to_string(id) + " outside the " + (b < n_quant ? "codec" : "KV") +
                                                      " pool of " + std::to_string(pool_blocks));
      }
      tables[s * opt_.max_blocks_per_seq + b] = id;
    }
    if (max_window_ > 0) STRATA_RETURN_IF_ERROR(fill_window_table(sp, s, need));
    q_start[s] = int32_t(t);
    pos0[s] = sp.pos0;
    for (int32_t i = 0; i < sp.n_tokens; ++i, ++t) {
      const int32_t id = batch.tokens[size_t(t)];
      if (id < 0 || id >= d.V) return make_error(ErrorCode::kOutOfRange, "token id " + std::to_string(id) + " outside the vocabulary of " + std::to_string(d.V));
      const int32_t pos = sp.pos0 + i;
      tokens[t] = id;
      positions[t] = pos;
      slots[t] = int64_t(sp.block_table[size_t(pos / bs)]) * bs + pos % bs;
      if (max_window_ > 0) B.host<int64_t>(B.off_window_slots)[t] = int64_t(sp.window_block_table[size_t(pos / bs)]) * bs + pos % bs;
    }
    for (int32_t q0 = 0; q0 < sp.n_tokens; q0 += tpt) {
      tile_seq[n_tiles] = int32_t(s);
      tile_q0[n_tiles] = q0;
      ++n_tiles;
    }
    decode_shape = decode_shape && sp.n_tokens == 1 && (sp.logits_all || sp.logits_last);
    if (sp.logits_all) {
      for (int32_t i = 0; i < sp.n_tokens; ++i) row_map[r++] = q_start[s] + i;
    } else if (sp.logits_last && sp.n_tokens > 0) {
      row_map[r++] = q_start[s] + sp.n_tokens - 1;
    }
  }
  if (t != n) return make_error(ErrorCode::kInvalidArgument, "spans cover " + std::to_string(t) + " tokens of " + std::to_string(n));
  q_start[n_seqs] = int32_t(t);
  if (hybrid_) STRATA_RETURN_IF_ERROR(fill_hybrid_meta(batch));
  n_logit_rows_ = n_rows;
  StepShape shape;
  shape.n_tokens = n;
  shape.n_tiles = n_tiles;
  shape.n_rows = n_rows;
  shape.tokens_per_tile = tpt;
  shape.n_splits = n_splits;
  shape.decode = decode_shape;
  shape.n_seqs = n_seqs;
  if (codec_) shape.codec_splits = codec_->splits_for(n, opt_.deterministic);

  if (opt_.cuda_graphs && decode_shape) {
    auto it = decode_graphs_.find(n_seqs);
    if (it == decode_graphs_.end() && decode_seen_[n_seqs]++ >= 1) {
      // Capture this batch size: the metadata copy from the pinned block and every launch.
      cudaGraph_t graph = nullptr;
      STRATA_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      launch_step(shape, false);
      STRATA_CUDA_RETURN_IF_ERROR(cudaStreamEndCapture(stream_, &graph));
      cudaGraphExec_t exec = nullptr;
      const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
      cudaGraphDestroy(graph);
      STRATA_CUDA_RETURN_IF_ERROR(err);
      it = decode_graphs_.emplace(n_seqs, exec).first;
    }
    if (it != decode_graphs_.end()) {
      // The graph records meta_copied right after its copy node (launch_step).
      STRATA_CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
      B.meta_pending = true;
      return Status();
    }
  }
  launch_step(shape, true);
  B.meta_pending = true;
  return Status();
}

// Decode of at most kGemvMaxRows sequences, one token each, every token a logit row: per layer
// five launches (QKV GEMV on the norm-scaled input, attention with the QKV post and the split
// combine inside, o_proj GEMV adding into the residual stream and leaving the next norm's
// input, gate/up GEMV with the gated activation, down GEMV like o_proj), then the lm_head GEMV
// and argmax. The unfused kernels of launch_step are the reference (tests/gpu).
void CudaDecoder::launch_fused_decode(const StepShape& shape) {
  const Dims d = dims_of(cfg_);
  Buffers& B = *buf_;
  const int64_t n = shape.n_tokens;
  cudaStream_t st = stream_;
  const LaunchTuning tune = launch_tuning();
  const float* first_norm = layers_.empty() ? B.final_norm : layers_[0].in_norm;
  EmbedArgs ea{B.embed, B.dev<int32_t>(B.off_tokens), B.x, int32_t(n), int32_t(d.H), 1.0f};
  ea.norm_w = first_norm;
  ea.norm_out = B.h;
  ea.ss_out = B.ss_embed;
  launch_embed(ea, st);
  const int32_t parts = int32_t(gemv_blocks(d.H));
  auto gemv = [&](const uint16_t* x, const uint16_t* w, void* y, int64_t rows, int64_t k, GemvIn in, const float* in_ss,
                  int32_t in_parts, GemvOut out) {
    GemvArgs g{};
    g.x = x;
    g.w = w;
    g.y = y;
    g.m = n;
    g.n = rows;
    g.k = k;
    g.in = in;
    g.out = out;
    g.in_ss = in_ss;
    g.in_ss_parts = in_parts;
    g.in_eps = cfg_.rms_eps;
    g.act = Act(act_);
    g.w_scale = gemm_->fp8_scales(w);
    g.w_scale_ld = fp8_blocks(k);
    return g;
  };
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    const float* in_ss = l == 0 ? B.ss_embed : B.ss_parts;
    const int32_t in_parts = l == 0 ? 1 : parts;
    GemvArgs qkv = gemv(B.h, L.qkv, B.qkv, d.qkv_rows, d.H, GemvIn::kNormScaled, in_ss, in_parts, GemvOut::kF32);
    qkv.warps_per_row = tune.decode_qkv_warps_per_row;
    launch_gemv(qkv, st);
    PagedAttentionArgs pa = attention_args(shape, l);
    pa.post = qkv_post_args(l);
    pa.split_counters = B.split_counters;
    if ((tune.decode_profile_skip & 1) == 0) launch_paged_attention(pa, st);
    GemvArgs o = gemv(B.attn, L.o, B.x, d.H, d.nh * d.hd, GemvIn::kPlain, nullptr, 0, GemvOut::kResidual);
    o.bias = L.o_bias;
    o.norm_w = L.post_norm;
    o.norm_out = B.h;
    o.ss_out = B.ss_parts;
    // The attention before it reads little: o_proj's weights and the first gate/up rows stream
    // into L2 meanwhile.
    const int64_t wb = o.w_scale != nullptr ? 1 : 2;  // bytes of a weight
    o.prefetch_bytes = tune.attn_overlap_prefetch ? d.nh * d.hd * wb : 0;
    o.prefetch_spread = true;
    if (tune.attn_overlap_next_rows > 0 && L.gate_up != nullptr) {
      o.ahead[0] = L.gate_up;
      o.ahead[1] = reinterpret_cast<const char*>(L.gate_up) + d.I * d.H * wb;
      o.ahead_bytes = std::min<int64_t>(tune.attn_overlap_next_rows, d.I) * d.H * wb;
    }
    launch_gemv(o, st);
    launch_gemv(gemv(B.h, L.gate_up, B.act, d.I, d.H, GemvIn::kNormScaled, B.ss_parts, parts, GemvOut::kGatedAct), st);
    GemvArgs dn = gemv(B.act, L.down, B.x, d.H, d.I, GemvIn::kPlain, nullptr, 0, GemvOut::kResidual);
    dn.norm_w = l + 1 < layers_.size() ? layers_[l + 1].in_norm : B.final_norm;
    dn.norm_out = B.h;
    dn.ss_out = B.ss_parts;
    launch_gemv(dn, st);
  }
  if ((tune.decode_profile_skip & 2) != 0) return;
  launch_gemv(gemv(B.h, B.lm_head, B.logits, d.V, d.H, GemvIn::kNormScaled, layers_.empty() ? B.ss_embed : B.ss_parts,
                   layers_.empty() ? 1 : parts, GemvOut::kF32),
              st);
  launch_argmax({B.logits, B.argmax, int32_t(n), int32_t(d.V)}, st);
}

Status CudaDecoder::fill_window_table(const SeqSpan& sp, int64_t s, int64_t need) {
  Buffers& B = *buf_;
  const int32_t bs = opt_.block_size;
  if (int64_t(sp.window_block_table.size()) < need) {
    return make_error(ErrorCode::kInvalidArgument, "sequence " + std::to_string(s) + ": window block table of " +
                                                       std::to_string(sp.window_block_table.size()) + " blocks does not cover " +
                                                       std::to_string(int64_t(sp.pos0) + sp.n_tokens) + " positions");
  }
  // Blocks wholly behind the window of the span's first query may be gone (-1): no key of them
  // is read. Every later one must be a window-pool block.
  const int64_t first_key = int64_t(sp.pos0) - max_window_ + 1;
  int32_t* table = B.host<int32_t>(B.off_window_tables) + s * opt_.max_blocks_per_seq;
  for (int64_t b = 0; b < need; ++b) {
    const int32_t id = sp.window_block_table[size_t(b)];
    const bool gone_ok = (b + 1) * bs <= first_key;
    if ((id < 0 && !(id == -1 && gone_ok)) || id >= kv_->n_window_blocks()) {
      return make_error(ErrorCode::kOutOfRange, "window block id " + std::to_string(id) + " (block " + std::to_string(b) +
                                                    " of sequence " + std::to_string(s) + ") outside the window pool of " +
                                                    std::to_string(kv_->n_window_blocks()));
    }
    table[b] = id;
  }
  return Status();
}

QkvPostArgs CudaDecoder::qkv_post_args(size_t l) const {
  const Dims d = dims_of(cfg_);
  const Buffers& B = *buf_;
  const Layer& L = layers_[l];
  QkvPostArgs qa{};
  qa.qkv = B.qkv;
  qa.bias = L.qkv_bias;
  qa.q_norm = L.q_norm;
  qa.k_norm = L.k_norm;
  qa.positions = B.dev<int32_t>(B.off_positions);
  qa.inv_freq = B.rope_inv_freq[size_t(L.rope)];
  // Sliding-window layers paged apart write their own pool's slots.
  const bool windowed = max_window_ > 0 && L.window > 0;
  qa.slot_mapping = B.dev<int64_t>(windowed ? B.off_window_slots : B.off_slots);
  qa.q_out = B.q;
  const int kvl = L.kv_layer >= 0 ? L.kv_layer : int(l);  // the pool layer (hybrids, Gemma 4)
  qa.k_pool = kv_->k(kvl);
  qa.v_pool = kv_->v(kvl);
  qa.n_heads = int32_t(d.nh);
  qa.n_kv_heads = int32_t(d.nkv);
  qa.head_dim = int32_t(d.hd);
  qa.rot_dim = B.rope_rot_dim[size_t(L.rope)];
  qa.attn_factor = B.rope_attn_factor[size_t(L.rope)];
  qa.norm_eps = cfg_.rms_eps;
  qa.norm_one_plus_w = one_plus_w_ ? 1 : 0;
  return qa;
}

PagedAttentionArgs CudaDecoder::attention_args(const StepShape& shape, size_t l) const {
  const Dims d = dims_of(cfg_);
  const Buffers& B = *buf_;
  const Layer& L = layers_[l];
  PagedAttentionArgs pa{};
  pa.q = B.q;
  pa.out = B.attn;
  const int kvl = L.kv_layer >= 0 ? L.kv_layer : int(l);
  pa.k_pool = kv_->k(kvl);
  pa.v_pool = kv_->v(kvl);
  pa.block_tables = B.dev<int32_t>(max_window_ > 0 && L.window > 0 ? B.off_window_tables : B.off_tables);
  pa.seq_q_start = B.dev<int32_t>(B.off_q_start);
  pa.seq_pos0 = B.dev<int32_t>(B.off_pos0);
  pa.tile_seq = B.dev<int32_t>(B.off_tile_seq);
  pa.tile_q0 = B.dev<int32_t>(B.off_tile_q0);
  pa.partial_out = B.partial_out;
  pa.partial_ml = B.partial_ml;
  pa.n_tokens = int32_t(shape.n_tokens);
  pa.n_tiles = int32_t(shape.n_tiles);
  pa.tokens_per_tile = shape.tokens_per_tile;
  pa.n_splits = shape.n_splits;
  pa.max_blocks_per_seq = opt_.max_blocks_per_seq;
  pa.block_size = opt_.block_size;
  pa.n_heads = int32_t(d.nh);
  pa.n_kv_heads = int32_t(d.nkv);
  pa.head_dim = int32_t(d.hd);
  pa.window = L.window;
  pa.scale = attn_scale_;
  pa.softcap = attn_softcap_;
  pa.batch_invariant = opt_.deterministic ? 1 : 0;
  return pa;
}

void CudaDecoder::grouped_gemm(GroupedGemmArgs args, cudaStream_t stream) const {
  if (opt_.deterministic) args.path = GroupedGemmPath::kTiled;
  launch_grouped_gemm(args, stream);
}

// The sparse FFN of layer L over the n tokens of h into branch (see moe.h for the steps).
void CudaDecoder::launch_moe_ffn(const Layer& L, int64_t n, cudaStream_t st) {
  const Dims d = dims_of(cfg_);
  Buffers& B = *buf_;
  const int32_t k = int32_t(d.top_k), E = int32_t(d.E);
  gemm_->run(st, B.h, L.router, B.moe_logits, GemmOut::kF32, n, d.E, d.H);
  launch_moe_route({B.moe_logits, B.moe_ids, B.moe_w, int32_t(n), E, k, cfg_.norm_topk_prob ? 1 : 0, nullptr}, st);
  launch_moe_group({B.moe_ids, int32_t(n) * k, E, B.moe_offsets, B.moe_sorted, B.moe_slot_row}, st);
  // An expert takes a token at most once: a group holds at most n rows.
  grouped_gemm(split_grouped(B.split.get(), {B.h, B.moe_sorted, k, L.experts_gate_up, B.moe_offsets, B.moe_gate_up, 0, E,
                                                    int32_t(n), 2 * d.mI, d.H}),
                      st);
  launch_gated_act({B.moe_gate_up, B.moe_act, int32_t(n) * k, int32_t(d.mI), Act(act_)}, st);
  grouped_gemm(split_grouped(B.split.get(), {B.moe_act, nullptr, 1, L.experts_down, B.moe_offsets, B.moe_y, 1, E, int32_t(n), d.H, d.mI}),
                      st);
  launch_moe_combine({B.moe_y, B.moe_ids, B.moe_w, B.moe_slot_row, B.branch, int32_t(n), k, int32_t(d.H)}, st);
}

void CudaDecoder::launch_step(const StepShape& shape, bool record_copy) {
  const Dims d = dims_of(cfg_);
  Buffers& B = *buf_;
  const int64_t n = shape.n_tokens, n_rows = shape.n_rows;
  cudaStream_t st = stream_;
  STRATA_CUDA_CHECK(cudaMemcpyAsync(B.meta_dev, B.meta_host, B.meta_bytes, cudaMemcpyHostToDevice, st));
  // Captured into a decode graph as an event node: the pinned block is free for the next
  // step's packing as soon as it is copied, not when the step ends.
  STRATA_CUDA_CHECK(record_copy ? cudaEventRecord(B.meta_copied, st)
                                : cudaEventRecordWithFlags(B.meta_copied, st, cudaEventRecordExternal));
  if (feed_desc_ != nullptr) {
    launch_feed_tokens({feed_desc_, feed_prev_, B.dev<int32_t>(B.off_tokens), opt_.max_seqs, int32_t(d.V)}, st);
  }
  const bool fused = fused_ok_ && !codec_ && !opt_.deterministic && shape.decode && n <= std::min<int64_t>(launch_tuning().fuse_decode_rows, kGemvMaxRows) &&
                     n_rows == n && shape.n_splits <= 32 && d.H % 8 == 0 && (d.nh * d.hd) % 8 == 0 && d.I % 8 == 0;
  if (fused) {
    launch_fused_decode(shape);
    return;
  }
  if (gemma4_) {
    launch_gemma4_step(shape);
    return;
  }
  if (hybrid_) {
    launch_hybrid_step(shape, record_copy);
    return;
  }
  launch_embed({B.embed, B.dev<int32_t>(B.off_tokens), B.x, int32_t(n), int32_t(d.H), embed_scale_}, st);
  const WeightSplit* split = B.split.get();
  split_embed_lo(split, B.embed, B.dev<int32_t>(B.off_tokens), B.x, n, d.H, embed_scale_, st);
  if (codec_) {
    codec_->begin_step(B.dev<int32_t>(B.off_positions), B.dev<int32_t>(B.off_q_start), int32_t(n), int32_t(shape.n_seqs), st,
                       quant_kv_ ? B.dev<int32_t>(B.off_quant) : nullptr, opt_.block_size);
  }
  const int32_t opw = one_plus_w_ ? 1 : 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    const bool first = l == 0;
    // x += previous layer's MLP output; h = norm_in(x).
    if (!first && sandwich_) {
      launch_sandwich_add_norm({B.x, B.branch, nullptr, layers_[l - 1].ffn_out_norm, L.in_norm, B.h, int32_t(n), int32_t(d.H),
                                cfg_.rms_eps, opw},
                               st);
    } else {
      launch_add_rms_norm({B.x, first ? nullptr : B.branch, nullptr, L.in_norm, nullptr, B.h, int32_t(n), int32_t(d.H),
                           cfg_.rms_eps, opw},
                          st);
    }
    split_norm_lo(split, B.x, L.in_norm, nullptr, B.h, n, d.H, cfg_.rms_eps, one_plus_w_, st);
    gemm_->run(st, B.h, L.qkv, B.qkv, GemmOut::kF32, n, d.qkv_rows, d.H);
    QkvPostArgs qa = qkv_post_args(l);
    qa.n = int32_t(n);
    const PagedAttentionArgs pa = attention_args(shape, l);
    if (codec_) {
      codec_->run_layer(int32_t(l), qa, pa, qa.slot_mapping, kv_->part(int(2 * l)), kv_->part(int(2 * l + 1)),
                        shape.codec_splits, st, quant_kv_ ? quant_kv_->part(int(2 * l)) : nullptr,
                        quant_kv_ ? quant_kv_->part(int(2 * l + 1)) : nullptr);
    } else {
      launch_qkv_post(qa, st);
      launch_paged_attention(pa, st);
      launch_attention_combine(pa, st);
    }
    gemm_->run(st, B.attn, L.o, B.branch, GemmOut::kF32, n, d.H, d.nh * d.hd);
    if (sandwich_) {
      launch_sandwich_add_norm({B.x, B.branch, L.o_bias, L.attn_out_norm, L.post_norm, B.h, int32_t(n), int32_t(d.H),
                                cfg_.rms_eps, opw},
                               st);
    } else {
      launch_add_rms_norm({B.x, B.branch, L.o_bias, L.post_norm, nullptr, B.h, int32_t(n), int32_t(d.H), cfg_.rms_eps, opw}, st);
    }
    split_norm_lo(split, B.x, L.post_norm, nullptr, B.h, n, d.H, cfg_.rms_eps, one_plus_w_, st);
    if (L.router != nullptr) {
      launch_moe_ffn(L, n, st);
    } else {
      gemm_->run(st, B.h, L.gate_up, B.gate_up, GemmOut::kBF16, n, 2 * d.I, d.H);
      launch_gated_act({B.gate_up, B.act, int32_t(n), int32_t(d.I), Act(act_)}, st);
      split_act_lo(split, B.act, n, d.I, act_, st);
      gemm_->run(st, B.act, L.down, B.branch, GemmOut::kF32, n, d.H, d.I);
    }
  }
  if (n_rows == 0) return;
  // x += last MLP output (h is scratch here), then the final norm of the logit rows only.
  if (sandwich_ && !layers_.empty()) {
    launch_sandwich_add_norm({B.x, B.branch, nullptr, layers_.back().ffn_out_norm, buf_->final_norm, B.h, int32_t(n),
                              int32_t(d.H), cfg_.rms_eps, opw},
                             st);
  } else {
    launch_add_rms_norm({B.x, B.branch, nullptr, buf_->final_norm, nullptr, B.h, int32_t(n), int32_t(d.H), cfg_.rms_eps, opw}, st);
  }
  launch_add_rms_norm({B.x, nullptr, nullptr, buf_->final_norm, B.dev<int32_t>(B.off_row_map), B.rows_h, int32_t(n_rows),
                       int32_t(d.H), cfg_.rms_eps, opw},
                      st);
  split_norm_lo(split, B.x, buf_->final_norm, B.dev<int32_t>(B.off_row_map), B.rows_h, n_rows, d.H, cfg_.rms_eps, one_plus_w_, st);
  gemm_->run(st, B.rows_h, B.lm_head, B.logits, GemmOut::kF32, n_rows, d.V, d.H);
  if (final_softcap_ > 0.0f) launch_softcap(B.logits, n_rows * d.V, final_softcap_, st);
  launch_argmax({B.logits, B.argmax, int32_t(n_rows), int32_t(d.V)}, st);
}

Status CudaDecoder::forward(const StepBatch& batch, int32_t* argmax, float* logits) {
  STRATA_RETURN_IF_ERROR(enqueue(batch));
  const int64_t rows = n_logit_rows_;
  if (batch.n_tokens() > 0 && rows > 0) {
    STRATA_CUDA_CHECK(cudaMemcpyAsync(argmax, buf_->argmax, size_t(rows) * 4, cudaMemcpyDeviceToHost, stream_));
    if (logits != nullptr) {
      STRATA_CUDA_CHECK(cudaMemcpyAsync(logits, buf_->logits, size_t(rows * cfg_.vocab_size) * 4, cudaMemcpyDeviceToHost, stream_));
    }
  }
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status();
}

Status CudaDecoder::forward_rows(const StepBatch& batch, int32_t* argmax, const int32_t* rows, int64_t n, float* logits) {
  STRATA_RETURN_IF_ERROR(enqueue(batch));
  return fetch_rows(argmax, rows, n, logits);
}

const float* CudaDecoder::device_logits() const { return buf_->logits; }

const int32_t* CudaDecoder::device_argmax() const { return buf_->argmax; }

void CudaDecoder::set_token_feed(int32_t* desc, const int32_t* prev) {
  feed_desc_ = desc;
  feed_prev_ = prev;
  clear_cuda_graphs();  // graphs captured without the feed would skip it
}

Status CudaDecoder::fetch_rows(int32_t* argmax, const int32_t* rows, int64_t n, float* logits) {
  const int64_t n_rows = n_logit_rows_;
  const size_t row_bytes = size_t(cfg_.vocab_size) * 4;
  if (n_rows > 0) {
    STRATA_CUDA_CHECK(cudaMemcpyAsync(argmax, buf_->argmax, size_t(n_rows) * 4, cudaMemcpyDeviceToHost, stream_));
    // Runs of consecutive rows go in one copy each (a prompt-logprobs span is one run).
    for (int64_t i = 0; i < n;) {
      int64_t j = i + 1;
      while (j < n && rows[j] == rows[j - 1] + 1) ++j;
      if (rows[i] < 0 || rows[j - 1] >= n_rows) return make_error(ErrorCode::kOutOfRange, "logit row outside the step's rows");
      STRATA_CUDA_CHECK(cudaMemcpyAsync(logits + size_t(i) * size_t(cfg_.vocab_size), buf_->logits + size_t(rows[i]) * size_t(cfg_.vocab_size),
                                        size_t(j - i) * row_bytes, cudaMemcpyDeviceToHost, stream_));
      i = j;
    }
  }
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status();
}

int64_t CudaDecoder::kv_block_bytes() const { return kv_->layout().bytes_per_block(); }

Status CudaDecoder::read_kv_block(int32_t block, uint8_t* out) {
  if (block < 0 || block >= kv_->n_blocks()) return make_error(ErrorCode::kOutOfRange, "KV block " + std::to_string(block) + " outside the pool");
  const KvPoolLayout& kl = kv_->layout();
  for (int p : kl.block_parts()) {
    const size_t part = size_t(kl.part_bytes(p));
    STRATA_CUDA_CHECK(cudaMemcpyAsync(out, kv_->part(p) + size_t(block) * part, part, cudaMemcpyDeviceToHost, stream_));
    out += part;
  }
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status();
}

Status CudaDecoder::write_kv_block(int32_t block, const uint8_t* in) {
  if (block < 0 || block >= kv_->n_blocks()) return make_error(ErrorCode::kOutOfRange, "KV block " + std::to_string(block) + " outside the pool");
  const KvPoolLayout& kl = kv_->layout();
  for (int p : kl.block_parts()) {
    const size_t part = size_t(kl.part_bytes(p));
    STRATA_CUDA_CHECK(cudaMemcpyAsync(kv_->part(p) + size_t(block) * part, in, part, cudaMemcpyHostToDevice, stream_));
    in += part;
  }
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status();
}

int64_t CudaDecoder::kv_window_block_bytes() const { return kv_->layout().window_bytes_per_block(); }

std::vector<int64_t> CudaDecoder::kv_window_part_bytes() const {
  const KvPoolLayout& kl = kv_->layout();
  std::vector<int64_t> v;
  for (int p = 0; p < 2 * kl.n_layers; ++p) {
    if (kl.window_part(p)) v.push_back(kl.part_bytes(p));
  }
  return v;
}

Status CudaDecoder::read_window_kv_blocks(std::span<const int32_t> blocks, uint8_t* out) {
  const KvPoolLayout& kl = kv_->layout();
  for (int32_t block : blocks) {
    if (block < 0 || block >= kv_->n_window_blocks()) {
      return make_error(ErrorCode::kOutOfRange, "window KV block " + std::to_string(block) + " outside the pool");
    }
    for (int p = 0; p < 2 * kl.n_layers; ++p) {
      if (!kl.window_part(p)) continue;
      const size_t part = size_t(kl.part_bytes(p));
      STRATA_CUDA_CHECK(cudaMemcpyAsync(out, kv_->part(p) + size_t(block) * part, part, cudaMemcpyDeviceToHost, stream_));
      out += part;
    }
  }
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status();
}

Status CudaDecoder::write_window_kv_blocks(std::span<const int32_t> blocks, const uint8_t* in) {
  const KvPoolLayout& kl = kv_->layout();
  for (int32_t block : blocks) {
    if (block < 0 || block >= kv_->n_window_blocks()) {
      return make_error(ErrorCode::kOutOfRange, "window KV block " + std::to_string(block) + " outside the pool");
    }
    for (int p = 0; p < 2 * kl.n_layers; ++p) {
      if (!kl.window_part(p)) continue;
      const size_t part = size_t(kl.part_bytes(p));
      STRATA_CUDA_CHECK(cudaMemcpyAsync(kv_->part(p) + size_t(block) * part, in, part, cudaMemcpyHostToDevice, stream_));
      in += part;
    }
  }
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status();
}

int64_t CudaDecoder::arena_bytes_for(const ModelConfig& cfg, const CudaModelOptions& options) {
  if (is_hybrid_type(cfg.model_type)) {
    auto b = hybrid_arena_bytes(cfg, options);
    return b.ok() ? int64_t(*b) : 0;  // load() reports the config error
  }
  if (cfg.model_type == "gemma4_text") {
    ModelConfig shaped = cfg;
    auto extra = gemma4_extra_bytes(cfg, options);
    if (!gemma4_shape(&shaped).ok() || !extra.ok()) return 0;  // load() reports the config error
    return int64_t(arena_bytes(dims_of(shaped), options, cfg.tie_embeddings, 0) + *extra);
  }
  std::vector<int32_t> index;
  const auto types = rope_types(cfg, &index);
  return int64_t(arena_bytes(dims_of(cfg), options, cfg.tie_embeddings, int(types.size())));
}

}  // namespace strata::cuda
