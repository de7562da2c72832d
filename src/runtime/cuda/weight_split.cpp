#include "runtime/cuda/weight_split.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "core/log.h"
#include "tensor/dtype.h"

namespace strata::cuda {

WeightSplit::~WeightSplit() {
  for (void* p : allocations_) cudaFree(p);
}

bool WeightSplit::wider_than_bf16(const SafetensorsArchive& archive) {
  for (const auto& [name, t] : archive.tensors()) {
    if (t.shape.size() >= 2 && (t.dtype == DType::kF32 || t.dtype == DType::kF16)) return true;
  }
  return false;
}

std::unique_ptr<WeightSplit> WeightSplit::for_checkpoint(const SafetensorsArchive& archive, const CudaModelOptions& options,
                                                         const std::string& model_type) {
  using S = CudaModelOptions::SplitWeights;
  const bool wide = wider_than_bf16(archive);
  const bool on = splits(archive, options);
  if (on) {
    log::info("CUDA {}: {} checkpoint, matrices kept as bf16 hi + lo pairs (two bf16 GEMMs per linear layer, f32 sums){}",
              model_type, wide ? "f32/f16" : "bf16", options.split_weights == S::kOn ? " as asked" : "");
  } else if (wide) {
    log::info("CUDA {}: f32/f16 checkpoint rounded to bf16 (split_weights off)", model_type);
  }
  auto split = std::unique_ptr<WeightSplit>(new WeightSplit(on));
  split->split_inputs_ = options.split_inputs;
  return split;
}

bool WeightSplit::splits(const SafetensorsArchive& archive, const CudaModelOptions& options) {
  using S = CudaModelOptions::SplitWeights;
  return options.split_weights == S::kOn || (options.split_weights == S::kAuto && wider_than_bf16(archive));
}

int64_t WeightSplit::extra_bytes(const SafetensorsArchive& archive, const ModelConfig& cfg, const CudaModelOptions& options) {
  if (!splits(archive, options)) return 0;
  int64_t b = 0;
  // The lo parts of the language model's matrices (a multimodal checkpoint's other towers are
  // never uploaded).
  for (const auto& [name, t] : archive.tensors()) {
    if (t.shape.size() < 2) continue;
    if (name.rfind(cfg.weight_prefix, 0) != 0 && name != cfg.lm_head_name) continue;
    int64_t n = 1;
    for (const int64_t x : t.shape) n *= x;
    b += 2 * n;
  }
  const int64_t T = options.max_tokens, R = options.max_logit_rows, H = cfg.hidden, I = cfg.intermediate;
  const int64_t attn = int64_t(cfg.n_heads) * cfg.head_dim;
  b += 4 * T * 2 * I;                                  // f32 scratch of the bf16-output GEMMs
  if (options.split_inputs) b += 2 * (3 * T * H + R * H + T * I + T * attn);  // activation lo buffers
  // kAuto KV rows become f32 rows (KvCodecStep) when no codecs are asked for.
  if (options.kv_codecs.empty() && KvCodecStep::geometry(cfg).ok()) {
    b += KvCodecStep::scratch_bytes(cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, options.max_tokens, options.max_seqs);
  }
  return b;
}

Result<void*> WeightSplit::alloc(size_t bytes) {
  void* p = nullptr;
  STRATA_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
  allocations_.push_back(p);
  bytes_ += int64_t(bytes);
  return p;
}

Result<uint16_t*> WeightSplit::upload(DeviceArena& arena, const std::vector<float>& v, const std::string& what) {
  std::vector<bf16_t> hi(v.size()), lo;
  for (size_t i = 0; i < v.size(); ++i) hi[i] = f32_to_bf16(v[i]);
  auto p = arena.take_array<uint16_t>(v.size(), what);
  if (!p.ok()) return p.error();
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(*p, hi.data(), hi.size() * 2, cudaMemcpyHostToDevice));
  if (!on_ || v.empty()) return *p;
  lo.resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) lo[i] = f32_to_bf16(v[i] - bf16_to_f32(hi[i]));
  auto q = alloc(lo.size() * 2);
  if (!q.ok()) return q.error();
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(*q, lo.data(), lo.size() * 2, cudaMemcpyHostToDevice));
  weights_[*p] = static_cast<const uint16_t*>(*q);
  return *p;
}

const uint16_t* WeightSplit::lo_of(const uint16_t* hi) const {
  const auto it = weights_.find(hi);
  return it == weights_.end() ? nullptr : it->second;
}

uint16_t* WeightSplit::input_lo(const uint16_t* hi) const {
  const auto it = inputs_.find(hi);
  return it == inputs_.end() ? nullptr : it->second;
}

Status WeightSplit::attach(Gemm& gemm, int64_t max_tokens, int64_t bf16_out_width, const std::vector<Input>& inputs) {
  if (!on_) return Status();
  for (const auto& [hi, lo] : weights_) gemm.add_residual(hi, lo);
  const int64_t elems = max_tokens * bf16_out_width;
  auto s = alloc(size_t(std::max<int64_t>(elems, 1)) * 4);
  if (!s.ok()) return s.error();
  scratch_ = static_cast<float*>(*s);
  gemm.set_residual_scratch(scratch_, elems);
  for (const Input& in : inputs) {
    if (!split_inputs_) break;
    if (in.hi == nullptr || inputs_.count(in.hi) > 0) continue;
    auto lo = alloc(size_t(std::max<int64_t>(in.rows * in.width, 1)) * 2);
    if (!lo.ok()) return lo.error();
    // Zeros until the first hook writes it: a GEMM reading it early adds nothing.
    STRATA_CUDA_RETURN_IF_ERROR(cudaMemset(*lo, 0, size_t(std::max<int64_t>(in.rows * in.width, 1)) * 2));
    inputs_[in.hi] = static_cast<uint16_t*>(*lo);
    gemm.add_input_residual(in.hi, static_cast<uint16_t*>(*lo));
  }
  return Status();
}

void WeightSplit::norm_lo(const float* x, const float* w, const int32_t* row_map, const uint16_t* hi, int64_t rows,
                          int64_t dim, float eps, bool one_plus_w, cudaStream_t stream) const {
  uint16_t* lo = input_lo(hi);
  if (lo == nullptr) return;
  launch_norm_residual({x, w, row_map, hi, lo, int32_t(rows), int32_t(dim), eps, one_plus_w ? 1 : 0}, stream);
}

void WeightSplit::act_lo(const uint16_t* hi, int64_t n, int64_t inter, int32_t act, cudaStream_t stream) const {
  uint16_t* lo = input_lo(hi);
  if (lo == nullptr || scratch_ == nullptr) return;
  launch_act_residual({scratch_, hi, lo, int32_t(n), int32_t(inter), act}, stream);
}

void WeightSplit::embed_lo(const uint16_t* hi_table, const int32_t* ids, float* out, int64_t n, int64_t hidden, float scale,
                           cudaStream_t stream) const {
  const uint16_t* lo = lo_of(hi_table);
  if (lo == nullptr) return;
  launch_embed_residual({lo, ids, out, int32_t(n), int32_t(hidden), scale}, stream);
}

GroupedGemmArgs WeightSplit::with_residuals(GroupedGemmArgs a) const {
  a.w_lo = lo_of(a.w);
  a.x_lo = input_lo(a.x);
  return a;
}

}  // namespace strata::cuda
