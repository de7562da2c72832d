// pack_weight: checkpoint matrices into the panel layout of cpu_internal.h.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_ops.h"
#include "core/check.h"

namespace strata::cpu {

using detail::kPanel;

namespace {

// 64-byte aligned storage, so panel rows start on a cache line. Only the last panel (the one
// that can hold zero padding) is cleared; pack_panels writes every other byte.
std::shared_ptr<void> alloc_aligned(size_t bytes, size_t last_panel_bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  STRATA_CHECK(p != nullptr, "pack_weight: out of memory for " + std::to_string(bytes) + " bytes");
  std::memset(static_cast<uint8_t*>(p) + (bytes - last_panel_bytes), 0, rounded - (bytes - last_panel_bytes));
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

template <typename Dst, typename Convert>
void pack_panels(const void* src, size_t src_elem, int64_t rows, int64_t cols, Dst* dst, Convert convert) {
  const auto* bytes = static_cast<const uint8_t*>(src);
  const int64_t n_panels = detail::panel_count(rows);
  for (int64_t P = 0; P < n_panels; ++P) {
    Dst* panel = dst + P * cols * kPanel;
    const int64_t live = std::min<int64_t>(kPanel, rows - P * kPanel);  // the rest stays zero
    const uint8_t* row0 = bytes + size_t(P * kPanel * cols) * src_elem;
    // Sequential writes, kPanel sequential read streams.
    for (int64_t p = 0; p < cols; ++p)
      for (int64_t l = 0; l < live; ++l) panel[p * kPanel + l] = convert(row0 + size_t(l * cols + p) * src_elem);
  }
}

}  // namespace

WeightMatrix pack_weight(DType src_dtype, const void* src, int64_t rows, int64_t cols, bool alias_ok) {
  STRATA_CHECK(rows > 0 && cols > 0, "pack_weight: empty matrix");
  STRATA_CHECK(src_dtype == DType::kF32 || src_dtype == DType::kBF16 || src_dtype == DType::kF16,
               std::string("pack_weight: unsupported dtype ") + dtype_name(src_dtype));
  // The packed layout never equals the checkpoint's row-major one, so alias_ok is moot.
  (void)alias_ok;
  WeightMatrix w;
  w.rows = rows;
  w.cols = cols;
  w.layout = detail::kLayoutPanel16;
  const int64_t elems = detail::panel_count(rows) * kPanel * cols;
  if (src_dtype == DType::kBF16) {
    w.dtype = DType::kBF16;
    w.storage = alloc_aligned(size_t(elems) * sizeof(bf16_t), size_t(cols * kPanel) * sizeof(bf16_t));
    pack_panels(src, sizeof(bf16_t), rows, cols, static_cast<bf16_t*>(w.storage.get()), [](const uint8_t* s) {
      bf16_t v;
      std::memcpy(&v, s, sizeof v);
      return v;
    });
  } else {
    w.dtype = DType::kF32;
    w.storage = alloc_aligned(size_t(elems) * sizeof(float), size_t(cols * kPanel) * sizeof(float));
    float* dst = static_cast<float*>(w.storage.get());
    if (src_dtype == DType::kF32) {
      pack_panels(src, sizeof(float), rows, cols, dst, [](const uint8_t* s) {
        float v;
        std::memcpy(&v, s, sizeof v);
        return v;
      });
    } else {
      pack_panels(src, sizeof(f16_t), rows, cols, dst, [](const uint8_t* s) {
        f16_t v;
        std::memcpy(&v, s, sizeof v);
        return f16_to_f32(v);
      });
    }
  }
  w.data = w.storage.get();
  return w;
}

void weight_row(const WeightMatrix& w, int64_t row, float* out) {
  STRATA_CHECK(row >= 0 && row < w.rows, "weight_row: row out of range");
  if (w.quantized()) {
    detail::quant_weight_row(w, row, out);
    return;
  }
  if (w.layout == 0) {
    if (w.dtype == DType::kBF16) {
      const bf16_t* src = static_cast<const bf16_t*>(w.data) + row * w.cols;
      for (int64_t p = 0; p < w.cols; ++p) out[p] = bf16_to_f32(src[p]);
    } else {
      std::memcpy(out, static_cast<const float*>(w.data) + row * w.cols, size_t(w.cols) * sizeof(float));
    }
    return;
  }
  STRATA_CHECK(w.layout == detail::kLayoutPanel16, "weight_row: unknown layout " + std::to_string(w.layout));
  const int64_t P = row / kPanel, l = row % kPanel;
  if (w.dtype == DType::kBF16) {
    const bf16_t* panel = static_cast<const bf16_t*>(w.data) + P * w.cols * kPanel;
    for (int64_t p = 0; p < w.cols; ++p) out[p] = bf16_to_f32(panel[p * kPanel + l]);
  } else {
    const float* panel = static_cast<const float*>(w.data) + P * w.cols * kPanel;
    for (int64_t p = 0; p < w.cols; ++p) out[p] = panel[p * kPanel + l];
  }
}

}  // namespace strata::cpu
