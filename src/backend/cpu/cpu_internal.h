// Shared between the CPU kernel files: SIMD level detection and the packed weight layout.
#pragma once

#include <cstdint>

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

}  // namespace strata::cpu::detail
