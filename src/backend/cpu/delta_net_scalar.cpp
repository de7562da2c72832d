// Portable instantiation of the gated delta rule kernels in delta_net_body.inc (one lane).
#include <algorithm>
#include <cmath>

#include "backend/cpu/delta_net_internal.h"

namespace strata::cpu::detail {
namespace {

struct Vec {
  using T = float;
  static constexpr int kLanes = 1;
  static constexpr int kRows = 4;
  static T zero() { return 0.0f; }
  static T set1(float v) { return v; }
  static T load(const float* p) { return *p; }
  static void store(float* p, T v) { *p = v; }
  static T mul(T a, T b) { return a * b; }
  static T fmadd(T a, T b, T c) { return std::fma(a, b, c); }
};

#include "backend/cpu/delta_net_body.inc"

}  // namespace

const DeltaRuleKernels& delta_rule_kernels_scalar() {
  static const DeltaRuleKernels k = {&recurrent_head_impl, &chunked_head_impl};
  return k;
}

}  // namespace strata::cpu::detail
