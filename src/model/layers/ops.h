// Small elementwise steps as plain single-threaded loops: they touch activations only, a
// negligible share of a step's time. cpu::add (cpu_ops.h) is the pooled SIMD version of
// add_inplace; soft-capping has no backend kernel yet.
#pragma once

#include <cmath>
#include <cstdint>

namespace strata {

// x[i] += y[i]
inline void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

// x = cap * tanh(x / cap); cap <= 0: unchanged.
inline void softcap_inplace(float* x, int64_t n, float cap) {
  if (cap <= 0.0f) return;
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

}  // namespace strata
