// Shared between the gated delta rule files: the per-SIMD-level kernel table and the chunked
// form's scratch layout (delta_net_body.inc is instantiated once per level).
#pragma once

#include <cstdint>

#include "backend/cpu/delta_net.h"

namespace strata::cpu::detail {

// Rows of a chunk and columns of d_v are padded to a multiple of this in the chunked form's
// scratch (a multiple of every level's GEMM column tile), so its layout is the same at every level.
constexpr int64_t kPad = 32;

// Offsets, in floats, of the chunked form's per-worker scratch buffers.
struct ChunkedLayout {
  int64_t dvp = 0;  // d_v rounded up to kPad
  int64_t S = 0, KQ = 0, Kt = 0, X = 0, Y = 0, T = 0, R = 0, U = 0, G = 0, B = 0, D = 0;
  int64_t total = 0;
};

inline ChunkedLayout chunked_layout(const GatedDeltaRuleArgs& a, int32_t chunk) {
  ChunkedLayout l;
  const int64_t cp = (int64_t(chunk) + kPad - 1) / kPad * kPad, dk = a.d_k;
  l.dvp = (int64_t(a.d_v) + kPad - 1) / kPad * kPad;
  int64_t at = 0;
  auto take = [&](int64_t n) {
    const int64_t off = at;
    at += (n + 15) / 16 * 16;  // 64-byte aligned offsets
    return off;
  };
  l.S = take(dk * l.dvp);
  l.KQ = take(2 * cp * dk);
  l.Kt = take(dk * cp);
  l.X = take(2 * cp * l.dvp);
  l.Y = take(2 * cp * cp);
  l.T = take(cp * cp);
  l.R = take(cp * l.dvp);
  l.U = take(cp * l.dvp);
  l.G = take(cp);
  l.B = take(cp);
  l.D = take(cp * cp);
  l.total = at;
  return l;
}

struct DeltaRuleKernels {
  // One value head over a.n_tokens tokens; mem: [d_v] floats.
  void (*recurrent_head)(const GatedDeltaRuleArgs& a, int64_t h, float* mem);
  // One value head in chunks; scratch: chunked_layout(a, chunk).total floats.
  void (*chunked_head)(const GatedDeltaRuleArgs& a, int64_t h, int32_t chunk, float* scratch);
};

const DeltaRuleKernels& delta_rule_kernels_avx512();
const DeltaRuleKernels& delta_rule_kernels_avx2();
const DeltaRuleKernels& delta_rule_kernels_scalar();

}  // namespace strata::cpu::detail
