// Quantized weights on the CPU: pack_quant_weight (row-major codes into kLayoutQuantPanel16),
// the scalar quantized tile, and the dispatch behind cpu::matmul for a quantized WeightMatrix.
// Every level dequantizes an element as the reference does (fma(q, scale, bias), or e4m3 * scale)
// and fma-accumulates along k in natural order, so all levels and tilings agree bitwise.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_matmul_tile.h"
#include "backend/cpu/cpu_ops.h"
#include "core/check.h"

namespace strata::cpu {

using detail::kPanel;

namespace {

size_t round64(size_t b) { return (b + 63) / 64 * 64; }

}  // namespace

WeightMatrix pack_quant_weight(const QuantWeightSource& src, int64_t rows, int64_t cols) {
  STRATA_CHECK(rows > 0 && cols > 0, "pack_quant_weight: empty matrix");
  STRATA_CHECK(src.quant != WeightQuant::kNone && src.codes != nullptr && src.scales != nullptr && src.group > 0,
               "pack_quant_weight: not a quantized source");
  STRATA_CHECK(src.quant == WeightQuant::kFp8 || src.biases != nullptr, "pack_quant_weight: affine codes need biases");
  const bool nib = src.quant == WeightQuant::kAffine4;
  STRATA_CHECK(!nib || src.group % 2 == 0, "pack_quant_weight: 4-bit codes need an even group size");
  const int64_t n_panels = detail::panel_count(rows), groups = (cols + src.group - 1) / src.group;
  const int64_t code_stride = detail::quant_panel_code_bytes(cols, nib);
  const size_t code_bytes = round64(size_t(n_panels * code_stride));
  const size_t scale_bytes = round64(size_t(n_panels * groups * kPanel) * sizeof(float));
  const bool has_bias = src.quant != WeightQuant::kFp8;
  const size_t total = code_bytes + scale_bytes * (has_bias ? 2 : 1);
  void* p = std::aligned_alloc(64, total);
  STRATA_CHECK(p != nullptr, "pack_quant_weight: out of memory for " + std::to_string(total) + " bytes");
  std::memset(p, 0, total);
  auto* codes = static_cast<uint8_t*>(p);
  auto* scales = reinterpret_cast<float*>(codes + code_bytes);
  float* biases = has_bias ? reinterpret_cast<float*>(codes + code_bytes + scale_bytes) : nullptr;
  const float fp8_mul = src.quant == WeightQuant::kFp8 ? 256.0f : 1.0f;
  for (int64_t P = 0; P < n_panels; ++P) {
    const int64_t live = std::min<int64_t>(kPanel, rows - P * kPanel);
    uint8_t* panel = codes + P * code_stride;
    for (int64_t l = 0; l < live; ++l) {
      const int64_t r = P * kPanel + l;
      const uint8_t* row = src.codes + r * cols;
      if (nib) {
        for (int64_t c = 0; c < cols; ++c) {
          STRATA_CHECK(row[c] < 16, "pack_quant_weight: 4-bit code out of range");
          panel[(c / 2) * kPanel + l] |= uint8_t(row[c] << ((c % 2) * 4));
        }
      } else {
        for (int64_t c = 0; c < cols; ++c) panel[c * kPanel + l] = row[c];
      }
      for (int64_t g = 0; g < groups; ++g) {
        scales[(P * groups + g) * kPanel + l] = src.scales[r * groups + g] * fp8_mul;
        if (has_bias) biases[(P * groups + g) * kPanel + l] = src.biases[r * groups + g];
      }
    }
  }
  WeightMatrix w;
  w.rows = rows;
  w.cols = cols;
  w.layout = detail::kLayoutQuantPanel16;
  w.dtype = src.quant == WeightQuant::kFp8 ? DType::kF8E4M3 : nib ? DType::kI4 : DType::kU8;
  w.quant = src.quant;
  w.group = src.group;
  w.storage = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  w.data = codes;
  w.scales = scales;
  w.biases = biases;
  return w;
}

int64_t quant_weight_bytes(WeightQuant quant, int64_t rows, int64_t cols, int64_t group) {
  const int64_t n_panels = detail::panel_count(rows), groups = (cols + group - 1) / group;
  const int64_t scale_bytes = n_panels * groups * kPanel * int64_t(sizeof(float));
  return n_panels * detail::quant_panel_code_bytes(cols, quant == WeightQuant::kAffine4) +
         scale_bytes * (quant == WeightQuant::kFp8 ? 1 : 2);
}

int64_t weight_bytes(const WeightMatrix& w) {
  if (w.empty()) return 0;
  if (w.quantized()) return quant_weight_bytes(w.quant, w.rows, w.cols, w.group);
  const int64_t rows = w.layout == 0 ? w.rows : detail::panel_count(w.rows) * kPanel;
  return rows * w.cols * int64_t(dtype_size(w.dtype));
}

namespace detail {

namespace {

// Element (row l of panel P, input p) of a quantized tile's weights, dequantized.
inline float qweight(const MatmulTile& t, int64_t P, int64_t p, int64_t l) {
  const auto* codes = static_cast<const uint8_t*>(t.w) + P * t.code_stride;
  const int64_t si = (P * t.n_groups + p / t.group) * kPanel + l;
  switch (t.quant) {
    case WeightQuant::kAffine8: return std::fma(float(codes[p * kPanel + l]), t.scales[si], t.biases[si]);
    case WeightQuant::kAffine4:
      return std::fma(float((codes[(p / 2) * kPanel + l] >> ((p % 2) * 4)) & 0xF), t.scales[si], t.biases[si]);
    case WeightQuant::kFp8: return f16_to_f32(fp8_e4m3_as_f16_bits(codes[p * kPanel + l])) * t.scales[si];
    case WeightQuant::kNone: break;
  }
  return 0.0f;
}

MatmulTile quant_tile_base(const WeightMatrix& w) {
  MatmulTile t{};
  t.quant = w.quant;
  t.w = w.data;
  t.code_stride = quant_panel_code_bytes(w.cols, w.quant == WeightQuant::kAffine4);
  t.scales = w.scales;
  t.biases = w.biases;
  t.group = w.group;
  t.n_groups = w.n_groups();
  return t;
}

}  // namespace

void qmatmul_tile_scalar(const MatmulTile& t) {
  for (int64_t P = t.panel_begin; P < t.panel_end; ++P) {
    const int64_t cols = std::min(kPanel, t.n - P * kPanel);
    for (int64_t i = t.row_begin; i < t.row_end; ++i) {
      const float* xr = t.x + i * t.k;
      float* yr = t.y + i * t.n + P * kPanel;
      for (int64_t l = 0; l < cols; ++l) {
        float acc = 0.0f;
        for (int64_t p = 0; p < t.k; ++p) acc = std::fma(xr[p], qweight(t, P, p, l), acc);
        yr[l] = t.bias ? acc + t.bias[P * kPanel + l] : acc;
      }
    }
  }
}

}  // namespace detail

void detail::quant_weight_row(const WeightMatrix& w, int64_t row, float* out) {
  const detail::MatmulTile t = detail::quant_tile_base(w);
  const int64_t P = row / kPanel, l = row % kPanel;
  for (int64_t p = 0; p < w.cols; ++p) out[p] = detail::qweight(t, P, p, l);
}

void detail::quant_matmul(ThreadPool& pool, const float* x, int64_t m, const WeightMatrix& w, const float* bias, float* y) {
  using namespace detail;
  STRATA_CHECK(w.layout == kLayoutQuantPanel16, "matmul: quantized weight in unknown layout " + std::to_string(w.layout));
  // Rows at or below this count dequantize in registers and stream the codes once (decode);
  // above it a k-block of panels is dequantized to scratch once and shared by the row groups.
  constexpr int64_t kSmallM = 16;
  constexpr int64_t kBlockK = 256;
  void (*tile_fn)(const MatmulTile&) = &qmatmul_tile_scalar;
  switch (simd_level()) {
    case SimdLevel::kAvx512Bf16:
    case SimdLevel::kAvx512: tile_fn = &qmatmul_tile_avx512; break;
    case SimdLevel::kAvx2: tile_fn = &qmatmul_tile_avx2; break;
    case SimdLevel::kScalar: break;
  }
  const int64_t n_panels = panel_count(w.rows);
  const bool small_m = m <= kSmallM;
  MatmulTile base = quant_tile_base(w);
  base.x = x;
  base.k = w.cols;
  base.n = w.rows;
  base.w_dtype = w.dtype;
  base.bias = bias;
  base.y = y;
  base.kc = small_m ? w.cols : kBlockK;
  auto run = [&](int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
    MatmulTile t = base;
    t.row_begin = r0;
    t.row_end = r1;
    t.panel_begin = p0;
    t.panel_end = p1;
    if (!small_m) {
      thread_local std::vector<float> scratch;
      const size_t need = size_t(kBlockK * kPanel * kMaxGroupPanels);
      if (scratch.size() < need) scratch.resize(need);
      t.scratch = scratch.data();
    }
    tile_fn(t);
  };
  if (n_panels >= 2 * pool.size() || m < 2 * kSmallM) {
    pool.parallel_for(n_panels, [&](int64_t b, int64_t e, int) { run(0, m, b, e); });
  } else {
    pool.parallel_for(m, [&](int64_t b, int64_t e, int) { run(b, e, 0, n_panels); }, 8);
  }
}

}  // namespace strata::cpu
