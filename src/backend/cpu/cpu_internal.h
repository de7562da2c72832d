// Shared between the CPU kernel files: SIMD level detection and the packed weight layout.
#pragma once

#include <cstdint>

#include "backend/weight.h"
#include "core/thread_pool.h"

namespace strata::cpu::detail {

enum class SimdLevel : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };

// The level the kernels dispatch on: the best the CPU supports, capped by
// cap_simd_level (tests use the cap to exercise every path on one machine).
SimdLevel simd_level();
// The best level this CPU supports, regardless of the cap.
SimdLevel detected_simd_level();
// Caps dispatch at `level` (never above what the CPU supports). Not thread-safe against
// running kernels: call between kernel calls only.
void cap_simd_level(SimdLevel level);

// Packed weight layout kLayoutPanel16: rows are grouped in panels of kPanel consecutive
// output rows; panel P holds, for each input index p in [0, cols), the kPanel values
// W[P*kPanel + l, p] (l = 0..kPanel-1) contiguously: data[P][p][l]. The last panel is
// zero-padded. One vector load then feeds kPanel output columns, and every output element
// is accumulated along k in natural order whatever the batch shape.
constexpr int32_t kLayoutPanel16 = 1;
constexpr int64_t kPanel = 16;

inline int64_t panel_count(int64_t rows) { return (rows + kPanel - 1) / kPanel; }

// Quantized layout kLayoutQuantPanel16 (WeightMatrix::quant != kNone): the panels of
// kLayoutPanel16 holding one-byte codes (kAffine8, kFp8: byte [P][p][l]) or nibbles (kAffine4:
// byte [P][p / 2][l], input p in bits (p % 2) * 4); scales and biases [P][g][l] f32, group
// g = p / group. kFp8 scales hold 256 * scale: the kernels read e4m3 through f16 bits, which
// yield the value / 256 (exact, a power of two). Padding rows hold code 0, scale 0, bias 0.
constexpr int32_t kLayoutQuantPanel16 = 2;

// Bytes of codes one panel holds for `cols` inputs.
// The quantized paths of matmul and weight_row (cpu_quant.cpp).
void quant_matmul(ThreadPool& pool, const float* x, int64_t m, const WeightMatrix& w, const float* bias, float* y);
void quant_weight_row(const WeightMatrix& w, int64_t row, float* out);

inline int64_t quant_panel_code_bytes(int64_t cols, bool nibbles) { return (nibbles ? (cols + 1) / 2 : cols) * kPanel; }

}  // namespace strata::cpu::detail
