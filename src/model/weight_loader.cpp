#include "model/weight_loader.h"

#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "model/quant.h"

namespace strata {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

bool is_float_dtype(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }

}  // namespace

Status convert_to_f32(const TensorInfo& t, const void* src, int64_t n, float* out) {
  switch (t.dtype) {
    case DType::kF32:
      std::memcpy(out, src, size_t(n) * sizeof(float));
      return Status();
    case DType::kBF16: {
      const auto* p = static_cast<const bf16_t*>(src);
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(p[i]);
      return Status();
    }
    case DType::kF16: {
      const auto* p = static_cast<const f16_t*>(src);
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(p[i]);
      return Status();
    }
    default:
      return make_error(ErrorCode::kUnsupported, t.file + ": tensor '" + t.name + "' has dtype " + dtype_name(t.dtype) +
                                                     " (supported: F32, BF16, F16)");
  }
}

Result<WeightMatrix> pack_checkpoint_matrix(const TensorInfo& t, const void* src, int64_t rows, int64_t cols) {
  if (!is_float_dtype(t.dtype)) {
    return make_error(ErrorCode::kUnsupported, t.file + ": tensor '" + t.name + "' has dtype " + dtype_name(t.dtype) +
                                                   " (supported: F32, BF16, F16)");
  }
  return cpu::pack_weight(t.dtype, src, rows, cols, /*alias_ok=*/true);
}

Result<const TensorInfo*> WeightLoader::tensor(const std::string& name, const std::vector<int64_t>& shape) const {
  const std::string full = prefix_ + name;
  // A quantized matrix a family reads whole (to slice it): its f32 dequantization, kept by the archive.
  if (shape.size() == 2 && quant_ != nullptr && weight_is_quantized(*quant_, *archive_, full)) {
    if (const TensorInfo* d = archive_->find_derived(full)) return d;
    auto f = std::make_shared<std::vector<float>>();
    auto q = dequantize_weight(*quant_, *archive_, full, shape[0], shape[1], f.get());
    if (!q.ok()) return q.error();
    TensorInfo info;
    info.name = full;
    info.dtype = DType::kF32;
    info.shape = shape;
    info.data = f->data();
    info.n_bytes = f->size() * sizeof(float);
    info.file = "(" + full + " dequantized)";
    return archive_->add_derived(std::move(info), f);
  }
  const TensorInfo* t = archive_->find(full);
  if (t == nullptr) return make_error(ErrorCode::kNotFound, "tensor '" + full + "' is missing from the checkpoint");
  if (t->shape != shape) {
    return make_error(ErrorCode::kInvalidArgument, t->file + ": tensor '" + full + "' has shape " + t->shape_string() +
                                                       ", the config expects " + shape_str(shape));
  }
  return t;
}

Result<bool> WeightLoader::dequantized(const std::string& name, int64_t rows, int64_t cols, std::vector<float>* out) const {
  if (quant_ == nullptr || !quant_->quantized()) return false;
  return dequantize_weight(*quant_, *archive_, prefix_ + name, rows, cols, out);
}

Result<WeightMatrix> WeightLoader::kept_quantized(const std::string& name, int64_t rows, int64_t cols) const {
  if (!quantized_in_memory_ || quant_ == nullptr || !quant_->quantized()) return WeightMatrix();
  return quantized_weight(*quant_, *archive_, prefix_ + name, rows, cols);
}

Result<WeightMatrix> WeightLoader::matrix(const std::string& name, int64_t rows, int64_t cols) const {
  auto kq = kept_quantized(name, rows, cols);
  if (!kq.ok() || !kq->empty()) return kq;
  std::vector<float> f;
  auto q = dequantized(name, rows, cols, &f);
  if (!q.ok()) return q.error();
  if (*q) return cpu::pack_weight(DType::kF32, f.data(), rows, cols);
  auto t = tensor(name, {rows, cols});
  if (!t.ok()) return t.error();
  return pack_checkpoint_matrix(**t, (*t)->data, rows, cols);
}

Result<std::vector<float>> WeightLoader::vector(const std::string& name, int64_t n) const { return f32(name, {n}); }

Result<std::vector<float>> WeightLoader::f32(const std::string& name, const std::vector<int64_t>& shape) const {
  if (shape.size() == 2) {  // a quantized matrix: dequantized here, not kept by the archive
    std::vector<float> f;
    auto q = dequantized(name, shape[0], shape[1], &f);
    if (!q.ok()) return q.error();
    if (*q) return f;
  }
  auto t = tensor(name, shape);
  if (!t.ok()) return t.error();
  std::vector<float> v(size_t((*t)->numel()));
  STRATA_RETURN_IF_ERROR(convert_to_f32(**t, (*t)->data, (*t)->numel(), v.data()));
  return v;
}

Result<EmbeddingTable> WeightLoader::embedding(const std::string& name, int64_t rows, int64_t cols) const {
  auto kq = kept_quantized(name, rows, cols);
  if (!kq.ok()) return kq.error();
  if (!kq->empty()) {
    EmbeddingTable e;
    e.dtype = DType::kF32;  // the rows gather reads, dequantized
    e.rows = rows;
    e.cols = cols;
    e.packed = std::make_shared<const WeightMatrix>(std::move(*kq));
    return e;
  }
  auto f = std::make_shared<std::vector<float>>();
  auto q = dequantized(name, rows, cols, f.get());
  if (!q.ok()) return q.error();
  if (*q) {
    EmbeddingTable e;
    e.dtype = DType::kF32;
    e.data = f->data();
    e.rows = rows;
    e.cols = cols;
    e.storage = f;
    return e;
  }
  auto t = tensor(name, {rows, cols});
  if (!t.ok()) return t.error();
  if (!is_float_dtype((*t)->dtype)) {
    return make_error(ErrorCode::kUnsupported, (*t)->file + ": tensor '" + (*t)->name + "' has dtype " +
                                                   dtype_name((*t)->dtype) + " (supported: F32, BF16, F16)");
  }
  EmbeddingTable e;
  e.dtype = (*t)->dtype;
  e.data = (*t)->data;
  e.rows = rows;
  e.cols = cols;
  return e;
}

Status load_gated_mlp(const WeightLoader& w, const std::string& p, int64_t hidden, int64_t inter, bool bias,
                      GatedMlpWeights* m) {
  if (inter <= 0) return make_error(ErrorCode::kInvalidArgument, "intermediate size for " + w.prefix() + p + " must be positive");
  STRATA_RETURN_IF_ERROR(take(w.matrix(p + "gate_proj.weight", inter, hidden), &m->gate));
  STRATA_RETURN_IF_ERROR(take(w.matrix(p + "up_proj.weight", inter, hidden), &m->up));
  STRATA_RETURN_IF_ERROR(take(w.matrix(p + "down_proj.weight", hidden, inter), &m->down));
  if (bias) {
    STRATA_RETURN_IF_ERROR(take(w.vector(p + "gate_proj.bias", inter), &m->gate_bias));
    STRATA_RETURN_IF_ERROR(take(w.vector(p + "up_proj.bias", inter), &m->up_bias));
    STRATA_RETURN_IF_ERROR(take(w.vector(p + "down_proj.bias", hidden), &m->down_bias));
  }
  return Status();
}

}  // namespace strata
