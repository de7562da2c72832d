#include "model/quant.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "model/weight_loader.h"

namespace strata {

namespace quant {

namespace {

// The e4m3fn value of every code, built once from fp8_e4m3fn_to_f32.
const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> v{};
    for (int i = 0; i < 256; ++i) v[size_t(i)] = fp8_e4m3fn_to_f32(uint8_t(i));
    return v;
  }();
  return t;
}

// AutoAWQ's pack order (awq/modules/linear/gemm.py, WQLinear_GEMM.from_linear: nibble i of a
// word holds column order_map[i] of its 8): column j lives in nibble kAwqNibble[j].
constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

}  // namespace

void dequant_fp8_block(const uint8_t* w, const float* scale_inv, int64_t rows, int64_t cols, int32_t block_rows,
                       int32_t block_cols, float* out) {
  const auto& lut = fp8_table();
  const int64_t n_bc = (cols + block_cols - 1) / block_cols;
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = scale_inv + (r / block_rows) * n_bc;
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = lut[w[r * cols + c]] * s[c / block_cols];
  }
}

uint32_t mlx_code(const uint32_t* row, int64_t c, int32_t bits) {
  const int64_t per = 32 / bits;
  return (row[c / per] >> ((c % per) * bits)) & ((1u << bits) - 1u);
}

void dequant_mlx(const uint32_t* w, const float* scales, const float* biases, int64_t rows, int64_t cols, int32_t bits,
                 int32_t group, float* out) {
  const int64_t words = cols * bits / 32, groups = cols / group;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t g = r * groups + c / group;
      out[r * cols + c] = scales[g] * float(mlx_code(w + r * words, c, bits)) + biases[g];
    }
  }
}

uint32_t awq_code(const int32_t* packed_row, int64_t o) {
  const uint32_t word = uint32_t(packed_row[o / 8]);
  return (word >> (4 * kAwqNibble[o % 8])) & 0xfu;
}

void dequant_awq(const int32_t* qweight, const int32_t* qzeros, const float* scales, int64_t rows, int64_t cols,
                 int32_t group, float* out) {
  const int64_t words = (rows + 7) / 8;  // words of a packed row
  for (int64_t i = 0; i < cols; ++i) {
    const int64_t g = i / group;
    for (int64_t o = 0; o < rows; ++o) {
      const float q = float(awq_code(qweight + i * words, o)), z = float(awq_code(qzeros + g * words, o));
      out[o * cols + i] = (q - z) * scales[g * rows + o];
    }
  }
}

uint32_t gptq_weight_code(const int32_t* qweight, int64_t n_out, int64_t i, int64_t o, int32_t bits) {
  const int64_t per = 32 / bits;
  const uint32_t word = uint32_t(qweight[(i / per) * n_out + o]);
  return (word >> ((i % per) * bits)) & ((1u << bits) - 1u);
}

uint32_t gptq_zero_code(const int32_t* qzeros_row, int64_t o, int32_t bits) {
  const int64_t per = 32 / bits;
  return (uint32_t(qzeros_row[o / per]) >> ((o % per) * bits)) & ((1u << bits) - 1u);
}

void dequant_gptq(const int32_t* qweight, const int32_t* qzeros, const float* scales, const int32_t* g_idx, int64_t rows,
                  int64_t cols, int32_t bits, int32_t zero_offset, float* out) {
  const int64_t zwords = (rows + 32 / bits - 1) / (32 / bits);  // words of a qzeros row
  for (int64_t i = 0; i < cols; ++i) {
    const int64_t g = g_idx[i];
    for (int64_t o = 0; o < rows; ++o) {
      const float q = float(gptq_weight_code(qweight, rows, i, o, bits));
      const float z = float(gptq_zero_code(qzeros + g * zwords, o, bits)) + float(zero_offset);
      out[o * cols + i] = (q - z) * scales[g * rows + o];
    }
  }
}

}  // namespace quant

namespace {

std::string module_of(const std::string& weight_name) {
  static const std::string kSuffix = ".weight";
  if (weight_name.size() > kSuffix.size() && weight_name.compare(weight_name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0) {
    return weight_name.substr(0, weight_name.size() - kSuffix.size());
  }
  return weight_name;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

Error shape_error(const TensorInfo& t, const std::vector<int64_t>& want, const std::string& why) {
  return make_error(ErrorCode::kInvalidArgument, t.file + ": tensor '" + t.name + "' has shape " + t.shape_string() + ", " +
                                                     why + " expects " + shape_str(want));
}

// The companion tensor `module + suffix`, which `format` requires.
Result<const TensorInfo*> companion(const SafetensorsArchive& a, const std::string& module, const std::string& suffix,
                                    const QuantConfig& q) {
  const TensorInfo* t = a.find(module + suffix);
  if (t == nullptr) {
    return make_error(ErrorCode::kNotFound, "tensor '" + module + suffix + "' is missing from the checkpoint (quantization " +
                                                std::string(quant_format_name(q.format)) + " needs it beside '" + module +
                                                "')");
  }
  return t;
}

Result<std::vector<float>> as_f32(const TensorInfo& t, const std::vector<int64_t>& shape, const std::string& why) {
  if (t.shape != shape) return shape_error(t, shape, why);
  std::vector<float> v(size_t(t.numel()));
  STRATA_RETURN_IF_ERROR(convert_to_f32(t, t.data, t.numel(), v.data()));
  return v;
}

Status want_dtype(const TensorInfo& t, DType d, const QuantConfig& q) {
  if (t.dtype == d) return Status();
  return make_error(ErrorCode::kInvalidArgument, t.file + ": tensor '" + t.name + "' has dtype " + dtype_name(t.dtype) +
                                                     ", quantization " + quant_format_name(q.format) + " stores it as " +
                                                     dtype_name(d));
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A quantized matrix in the one form the CPU kernels take (cpu::QuantWeightSource): row-major
// codes, per-(row, group) scales and biases. quant kNone: the format has no such form for this
// weight (GPTQ act-order), and it is dequantized instead.
struct Unpacked {
  WeightQuant quant = WeightQuant::kNone;
  std::vector<uint8_t> codes;  // [rows, cols]
  std::vector<float> scales;   // [rows, groups]
  std::vector<float> biases;   // [rows, groups]; empty for kFp8
  int32_t group = 0;
};

Status fp8_block(const QuantConfig& q, const SafetensorsArchive& a, const TensorInfo& w, const std::string& module,
                 int64_t rows, int64_t cols, std::vector<float>* out, Unpacked* u) {
  if (w.shape != std::vector<int64_t>{rows, cols}) return shape_error(w, {rows, cols}, "the config");
  auto st = companion(a, module, ".weight_scale_inv", q);
  if (!st.ok()) return st.error();
  auto s = as_f32(**st, {ceil_div(rows, q.block_rows), ceil_div(cols, q.block_cols)},
                  "quantization_config.weight_block_size [" + std::to_string(q.block_rows) + ", " +
                      std::to_string(q.block_cols) + "]");
  if (!s.ok()) return s.error();
  if (u != nullptr) {
    const int64_t groups = ceil_div(cols, q.block_cols);
    u->quant = WeightQuant::kFp8;
    u->group = q.block_cols;
    u->codes.assign(static_cast<const uint8_t*>(w.data), static_cast<const uint8_t*>(w.data) + rows * cols);
    u->scales.resize(size_t(rows * groups));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < groups; ++g) u->scales[size_t(r * groups + g)] = (*s)[size_t((r / q.block_rows) * groups + g)];
    return Status();
  }
  out->resize(size_t(rows * cols));
  quant::dequant_fp8_block(static_cast<const uint8_t*>(w.data), s->data(), rows, cols, q.block_rows, q.block_cols, out->data());
  return Status();
}

Status fp8_compressed(const QuantConfig& q, const SafetensorsArchive& a, const TensorInfo& w, const std::string& module,
                 int64_t rows, int64_t cols, std::vector<float>* out, Unpacked* u) {
  if (w.shape != std::vector<int64_t>{rows, cols}) return shape_error(w, {rows, cols}, "the config");
  auto st = companion(a, module, ".weight_scale", q);
  if (!st.ok()) return st.error();
  const TensorInfo& t = **st;
  // Per tensor: [] or [1]; per channel: [rows, 1] or [rows].
  const int64_t n = t.numel();
  if (n != 1 && n != rows) return shape_error(t, {rows, 1}, "a per-channel scale (or [1] per tensor)");
  std::vector<float> s(static_cast<size_t>(n));
  STRATA_RETURN_IF_ERROR(convert_to_f32(t, t.data, n, s.data()));
  const auto* p = static_cast<const uint8_t*>(w.data);
  if (u != nullptr) {  // one group spanning the row
    u->quant = WeightQuant::kFp8;
    u->group = int32_t(cols);
    u->codes.assign(p, p + rows * cols);
    u->scales.resize(size_t(rows));
    for (int64_t r = 0; r < rows; ++r) u->scales[size_t(r)] = s[size_t(n == 1 ? 0 : r)];
    return Status();
  }
  const auto& lut = quant::fp8_table();
  out->resize(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float sr = s[size_t(n == 1 ? 0 : r)];
    for (int64_t c = 0; c < cols; ++c) (*out)[size_t(r * cols + c)] = lut[p[r * cols + c]] * sr;
  }
  return Status();
}

Status mlx(const QuantConfig& q, const SafetensorsArchive& a, const TensorInfo& w, const std::string& module, int64_t rows,
           int64_t cols, std::vector<float>* out, Unpacked* u) {
  const QuantGroup g = q.group_of(module);
  if (g.bits == 0) {
    return make_error(ErrorCode::kInvalidArgument, w.file + ": tensor '" + w.name + "' is packed (" + dtype_name(w.dtype) +
                                                       ") but config.json quantization." + module + " is false");
  }
  STRATA_RETURN_IF_ERROR(want_dtype(w, DType::kU32, q));
  const std::string why = "quantization (bits " + std::to_string(g.bits) + ", group_size " + std::to_string(g.group_size) + ")";
  if ((cols * g.bits) % 32 != 0 || cols % g.group_size != 0) {
    return make_error(ErrorCode::kInvalidArgument, "tensor '" + w.name + "': " + std::to_string(cols) +
                                                       " input columns do not split into " + why);
  }
  if (w.shape != std::vector<int64_t>{rows, cols * g.bits / 32}) return shape_error(w, {rows, cols * g.bits / 32}, why);
  auto st = companion(a, module, ".scales", q);
  if (!st.ok()) return st.error();
  auto bt = companion(a, module, ".biases", q);
  if (!bt.ok()) return bt.error();
  auto s = as_f32(**st, {rows, cols / g.group_size}, why);
  if (!s.ok()) return s.error();
  auto b = as_f32(**bt, {rows, cols / g.group_size}, why);
  if (!b.ok()) return b.error();
  if (u != nullptr) {  // 2-bit codes ride in the 4-bit layout
    u->quant = g.bits == 8 ? WeightQuant::kAffine8 : WeightQuant::kAffine4;
    u->group = g.group_size;
    u->codes.resize(size_t(rows * cols));
    const auto* wp = static_cast<const uint32_t*>(w.data);
    const int64_t words = cols * g.bits / 32;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) u->codes[size_t(r * cols + c)] = uint8_t(quant::mlx_code(wp + r * words, c, g.bits));
    u->scales = std::move(*s);
    u->biases = std::move(*b);
    return Status();
  }
  out->resize(size_t(rows * cols));
  quant::dequant_mlx(static_cast<const uint32_t*>(w.data), s->data(), b->data(), rows, cols, g.bits, g.group_size, out->data());
  return Status();
}

Status awq(const QuantConfig& q, const SafetensorsArchive& a, const TensorInfo& qw, const std::string& module, int64_t rows,
           int64_t cols, std::vector<float>* out, Unpacked* u) {
  const std::string why = "quantization_config (awq, bits 4, group_size " + std::to_string(q.group_size) + ")";
  if (rows % 8 != 0 || cols % q.group_size != 0) {
    return make_error(ErrorCode::kInvalidArgument, "module '" + module + "' [" + std::to_string(rows) + ", " +
                                                       std::to_string(cols) + "] does not split into " + why);
  }
  STRATA_RETURN_IF_ERROR(want_dtype(qw, DType::kI32, q));
  if (qw.shape != std::vector<int64_t>{cols, rows / 8}) return shape_error(qw, {cols, rows / 8}, why);
  auto zt = companion(a, module, ".qzeros", q);
  if (!zt.ok()) return zt.error();
  STRATA_RETURN_IF_ERROR(want_dtype(**zt, DType::kI32, q));
  const int64_t groups = cols / q.group_size;
  if ((*zt)->shape != std::vector<int64_t>{groups, rows / 8}) return shape_error(**zt, {groups, rows / 8}, why);
  auto st = companion(a, module, ".scales", q);
  if (!st.ok()) return st.error();
  auto s = as_f32(**st, {groups, rows}, why);
  if (!s.ok()) return s.error();
  if (u != nullptr) {  // (q - z) * s = fma(q, s, -s * z)
    const auto* qp = static_cast<const int32_t*>(qw.data);
    const auto* zp = static_cast<const int32_t*>((*zt)->data);
    const int64_t words = rows / 8;
    u->quant = WeightQuant::kAffine4;
    u->group = q.group_size;
    u->codes.resize(size_t(rows * cols));
    u->scales.resize(size_t(rows * groups));
    u->biases.resize(size_t(rows * groups));
    for (int64_t i = 0; i < cols; ++i)
      for (int64_t o = 0; o < rows; ++o) u->codes[size_t(o * cols + i)] = uint8_t(quant::awq_code(qp + i * words, o));
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t o = 0; o < rows; ++o) {
        const float sc = (*s)[size_t(g * rows + o)];
        u->scales[size_t(o * groups + g)] = sc;
        u->biases[size_t(o * groups + g)] = -(sc * float(quant::awq_code(zp + g * words, o)));
      }
    }
    return Status();
  }
  out->resize(size_t(rows * cols));
  quant::dequant_awq(static_cast<const int32_t*>(qw.data), static_cast<const int32_t*>((*zt)->data), s->data(), rows, cols,
                     q.group_size, out->data());
  return Status();
}

Status gptq(const QuantConfig& q, const SafetensorsArchive& a, const TensorInfo& qw, const std::string& module, int64_t rows,
            int64_t cols, std::vector<float>* out, Unpacked* u) {
  const int64_t per = 32 / q.bits;
  const std::string why = "quantization_config (gptq, bits " + std::to_string(q.bits) + ", group_size " +
                          std::to_string(q.group_size) + ")";
  if (rows % per != 0 || cols % per != 0) {
    return make_error(ErrorCode::kInvalidArgument, "module '" + module + "' [" + std::to_string(rows) + ", " +
                                                       std::to_string(cols) + "] does not split into " + why);
  }
  STRATA_RETURN_IF_ERROR(want_dtype(qw, DType::kI32, q));
  if (qw.shape != std::vector<int64_t>{cols / per, rows}) return shape_error(qw, {cols / per, rows}, why);
  const int64_t groups = ceil_div(cols, q.group_size);
  auto zt = companion(a, module, ".qzeros", q);
  if (!zt.ok()) return zt.error();
  STRATA_RETURN_IF_ERROR(want_dtype(**zt, DType::kI32, q));
  if ((*zt)->shape != std::vector<int64_t>{groups, rows / per}) return shape_error(**zt, {groups, rows / per}, why);
  auto st = companion(a, module, ".scales", q);
  if (!st.ok()) return st.error();
  auto s = as_f32(**st, {groups, rows}, why);
  if (!s.ok()) return s.error();
  std::vector<int32_t> g_idx(static_cast<size_t>(cols));
  if (const TensorInfo* gi = a.find(module + ".g_idx")) {
    STRATA_RETURN_IF_ERROR(want_dtype(*gi, DType::kI32, q));
    if (gi->shape != std::vector<int64_t>{cols}) return shape_error(*gi, {cols}, why);
    std::memcpy(g_idx.data(), gi->data, size_t(cols) * sizeof(int32_t));
    for (int64_t i = 0; i < cols; ++i) {
      if (g_idx[size_t(i)] < 0 || g_idx[size_t(i)] >= groups) {
        return make_error(ErrorCode::kInvalidArgument, gi->file + ": tensor '" + gi->name + "' holds group " +
                                                           std::to_string(g_idx[size_t(i)]) + " at " + std::to_string(i) +
                                                           ", outside [0, " + std::to_string(groups) + ")");
      }
    }
  } else if (q.gptq_desc_act) {
    return make_error(ErrorCode::kNotFound, "tensor '" + module + ".g_idx' is missing from the checkpoint "
                                                                  "(quantization_config.desc_act is true)");
  } else {
    for (int64_t i = 0; i < cols; ++i) g_idx[size_t(i)] = int32_t(i / q.group_size);
  }
  bool grouped = true;  // g_idx is i / group_size (no act-order permutation)
  for (int64_t i = 0; i < cols && grouped; ++i) grouped = g_idx[size_t(i)] == int32_t(i / q.group_size);
  if (u != nullptr && grouped) {  // (q - z) * s = fma(q, s, -s * z)
    const auto* qp = static_cast<const int32_t*>(qw.data);
    const auto* zp = static_cast<const int32_t*>((*zt)->data);
    const int64_t zwords = rows / per;
    u->quant = q.bits == 8 ? WeightQuant::kAffine8 : WeightQuant::kAffine4;
    u->group = q.group_size;
    u->codes.resize(size_t(rows * cols));
    u->scales.resize(size_t(rows * groups));
    u->biases.resize(size_t(rows * groups));
    for (int64_t i = 0; i < cols; ++i)
      for (int64_t o = 0; o < rows; ++o)
        u->codes[size_t(o * cols + i)] = uint8_t(quant::gptq_weight_code(qp, rows, i, o, q.bits));
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t o = 0; o < rows; ++o) {
        const float sc = (*s)[size_t(g * rows + o)];
        const float z = float(quant::gptq_zero_code(zp + g * zwords, o, q.bits)) + (q.gptq_zero_plus_one ? 1.0f : 0.0f);
        u->scales[size_t(o * groups + g)] = sc;
        u->biases[size_t(o * groups + g)] = -(sc * z);
      }
    }
    return Status();
  }
  if (u != nullptr) return Status();  // act-order: left to dequantize_weight (u->quant stays kNone)
  out->resize(size_t(rows * cols));
  quant::dequant_gptq(static_cast<const int32_t*>(qw.data), static_cast<const int32_t*>((*zt)->data), s->data(), g_idx.data(),
                      rows, cols, q.bits, q.gptq_zero_plus_one ? 1 : 0, out->data());
  return Status();
}

bool is_float(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }

}  // namespace

bool weight_is_quantized(const QuantConfig& q, const SafetensorsArchive& a, const std::string& weight_name) {
  const std::string module = module_of(weight_name);
  switch (q.format) {
    case QuantFormat::kNone: return false;
    case QuantFormat::kAwq:
    case QuantFormat::kGptq: return a.has(module + ".qweight");
    default: {
      const TensorInfo* w = a.find(weight_name);
      return w != nullptr && !is_float(w->dtype);
    }
  }
}

namespace {

// Reads a quantized weight into `out` (dequantized) or `u` (its codes, scales and biases).
Result<bool> read_quantized(const QuantConfig& q, const SafetensorsArchive& a, const std::string& weight_name, int64_t rows,
                            int64_t cols, std::vector<float>* out, Unpacked* u) {
  if (!weight_is_quantized(q, a, weight_name)) return false;
  const std::string module = module_of(weight_name);
  switch (q.format) {
    case QuantFormat::kNone: return false;
    case QuantFormat::kFp8Block:
    case QuantFormat::kFp8Compressed: {
      const TensorInfo& w = *a.find(weight_name);
      STRATA_RETURN_IF_ERROR(want_dtype(w, DType::kF8E4M3, q));
      if (q.format == QuantFormat::kFp8Block) STRATA_RETURN_IF_ERROR(fp8_block(q, a, w, module, rows, cols, out, u));
      else STRATA_RETURN_IF_ERROR(fp8_compressed(q, a, w, module, rows, cols, out, u));
      return true;
    }
    case QuantFormat::kMlxAffine:
      STRATA_RETURN_IF_ERROR(mlx(q, a, *a.find(weight_name), module, rows, cols, out, u));
      return true;
    case QuantFormat::kAwq:
      STRATA_RETURN_IF_ERROR(awq(q, a, *a.find(module + ".qweight"), module, rows, cols, out, u));
      return true;
    case QuantFormat::kGptq:
      STRATA_RETURN_IF_ERROR(gptq(q, a, *a.find(module + ".qweight"), module, rows, cols, out, u));
      return true;
  }
  return false;
}

}  // namespace

Result<bool> dequantize_weight(const QuantConfig& q, const SafetensorsArchive& a, const std::string& weight_name, int64_t rows,
                               int64_t cols, std::vector<float>* out) {
  return read_quantized(q, a, weight_name, rows, cols, out, nullptr);
}

Result<WeightMatrix> quantized_weight(const QuantConfig& q, const SafetensorsArchive& a, const std::string& weight_name,
                                      int64_t rows, int64_t cols) {
  Unpacked u;
  auto r = read_quantized(q, a, weight_name, rows, cols, nullptr, &u);
  if (!r.ok()) return r.error();
  if (!*r || u.quant == WeightQuant::kNone) return WeightMatrix();
  cpu::QuantWeightSource src;
  src.quant = u.quant;
  src.codes = u.codes.data();
  src.scales = u.scales.data();
  src.biases = u.biases.empty() ? nullptr : u.biases.data();
  src.group = u.group;
  return cpu::pack_quant_weight(src, rows, cols);
}

namespace {

// The logical element count of the quantized matrix whose stored tensor is `t` (0: t is a
// scale, zero, bias or index tensor, or a float tensor).
int64_t quantized_elements(const QuantConfig& q, const TensorInfo& t) {
  const std::string& n = t.name;
  auto ends = [&](const std::string& suffix) {
    return n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  switch (q.format) {
    case QuantFormat::kNone: return 0;
    case QuantFormat::kFp8Block:
    case QuantFormat::kFp8Compressed: return t.dtype == DType::kF8E4M3 ? t.numel() : 0;
    case QuantFormat::kMlxAffine: {
      if (t.dtype != DType::kU32 || !ends(".weight")) return 0;
      const int32_t bits = q.group_of(module_of(n)).bits;
      return bits > 0 ? t.numel() * (32 / bits) : 0;
    }
    case QuantFormat::kAwq: return ends(".qweight") ? t.numel() * 8 : 0;
    case QuantFormat::kGptq: return ends(".qweight") ? t.numel() * (32 / q.bits) : 0;
  }
  return 0;
}

// Bytes the CPU model holds for the quantized matrix whose stored tensor is `t` (`elems` logical
// elements): what quantized_weight packs, or f32 where it dequantizes (GPTQ act-order).
int64_t resident_quantized_bytes(const QuantConfig& q, const SafetensorsArchive& a, const TensorInfo& t, int64_t elems) {
  const int64_t f32_bytes = elems * int64_t(sizeof(float));
  if (t.shape.size() != 2) return f32_bytes;
  const std::string module = module_of(t.name.size() > 8 && t.name.compare(t.name.size() - 8, 8, ".qweight") == 0
                                           ? t.name.substr(0, t.name.size() - 8) + ".weight"
                                           : t.name);
  switch (q.format) {
    case QuantFormat::kNone: return f32_bytes;
    case QuantFormat::kFp8Block: return cpu::quant_weight_bytes(WeightQuant::kFp8, t.shape[0], t.shape[1], q.block_cols);
    case QuantFormat::kFp8Compressed: return cpu::quant_weight_bytes(WeightQuant::kFp8, t.shape[0], t.shape[1], t.shape[1]);
    case QuantFormat::kMlxAffine: {
      const QuantGroup g = q.group_of(module);
      return cpu::quant_weight_bytes(g.bits == 8 ? WeightQuant::kAffine8 : WeightQuant::kAffine4, t.shape[0],
                                     elems / t.shape[0], g.group_size);
    }
    case QuantFormat::kAwq: return cpu::quant_weight_bytes(WeightQuant::kAffine4, t.shape[1] * 8, t.shape[0], q.group_size);
    case QuantFormat::kGptq: {
      const int64_t rows = t.shape[1], cols = elems / rows;
      if (const TensorInfo* gi = a.find(module + ".g_idx")) {
        if (gi->dtype != DType::kI32 || gi->numel() != cols) return f32_bytes;
        const auto* g = static_cast<const int32_t*>(gi->data);
        for (int64_t i = 0; i < cols; ++i) {
          if (g[i] != int32_t(i / q.group_size)) return f32_bytes;  // act-order: dequantized at load
        }
      }
      return cpu::quant_weight_bytes(q.bits == 8 ? WeightQuant::kAffine8 : WeightQuant::kAffine4, rows, cols, q.group_size);
    }
  }
  return f32_bytes;
}

// Scale, zero, bias and index tensors beside a quantized matrix (a module's own .bias is not one).
bool is_companion(const std::string& name) {
  const std::string last = name.substr(name.rfind('.') + 1);
  for (const char* s : {"weight_scale_inv", "weight_scale", "input_scale", "scales", "biases", "qzeros", "g_idx"}) {
    if (last == s) return true;
  }
  return false;
}

}  // namespace

WeightBytesPerToken weight_bytes_per_token(const ModelConfig& cfg, const SafetensorsArchive& a) {
  static const QuantConfig kNoQuant;
  const QuantConfig& q = cfg.quant ? *cfg.quant : kNoQuant;
  const std::string embed = cfg.weight_prefix + "embed_tokens.";
  WeightBytesPerToken total, table;
  for (const auto& [name, t] : a.tensors()) {
    const bool text = name.rfind(cfg.weight_prefix, 0) == 0 || name == cfg.lm_head_name;
    if (!text) continue;
    const int64_t stored = int64_t(t.n_bytes);
    const int64_t deq = quantized_elements(q, t);
    // Dequantized, a quantized matrix is f32 and its scales, zeros and indices are dropped; kept
    // quantized on the CPU, its codes, scales and biases are repacked (resident). Vectors and f16
    // matrices are held as f32, bf16 matrices as they are.
    int64_t loaded = stored, params = t.numel();
    int64_t resident = t.shape.size() == 1 || t.dtype == DType::kF16 ? t.numel() * int64_t(sizeof(float)) : stored;
    if (deq > 0) {
      loaded = deq * int64_t(sizeof(float));
      resident = resident_quantized_bytes(q, a, t, deq);
      params = deq;
    } else if (is_companion(name) && weight_is_quantized(q, a, name.substr(0, name.rfind('.')) + ".weight")) {
      loaded = params = resident = 0;
    }
    total.parameters += params;
    total.stored += stored;
    total.loaded += loaded;
    total.resident += resident;
    if (name.rfind(embed, 0) == 0) {
      table.stored += stored;
      table.loaded += loaded;
      table.resident += resident;
    }
  }
  const int64_t vocab = std::max<int64_t>(cfg.vocab_size, 1);
  WeightBytesPerToken r;
  // The lookup reads one row of the table; a tied head reads all of it (already in total).
  r.stored = total.stored - (cfg.tie_embeddings ? 0 : table.stored) + table.stored / vocab;
  r.loaded = total.loaded - (cfg.tie_embeddings ? 0 : table.loaded) + table.loaded / vocab;
  r.resident = total.resident - (cfg.tie_embeddings ? 0 : table.resident) + table.resident / vocab;
  r.parameters = total.parameters;
  return r;
}

std::string fp8_block_scale_name(const std::string& weight_name) {
  const std::string suffix = ".weight";
  if (weight_name.size() <= suffix.size() ||
      weight_name.compare(weight_name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return std::string();
  }
  return weight_name + "_scale_inv";
}

}  // namespace strata
