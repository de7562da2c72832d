// Plain quantized matmul: the oracle of the CPU's dequantize-in-kernel matmul (cpu_quant.cpp).
#pragma once

#include <cstdint>

#include "backend/cpu/cpu_ops.h"

namespace strata::reference {

// W[r, c] of a quantized source (cpu::QuantWeightSource), as f32.
float quant_weight(const cpu::QuantWeightSource& w, int64_t cols, int64_t r, int64_t c);

// y[m, n] = x[m, k] · W[n, k]^T (+ bias[n]), W given as row-major codes with per-(row, group)
// scales and biases. Each output is fma-accumulated along k in order from 0, then biased: the
// order every CPU level keeps, so they agree with this bitwise.
void quant_matmul(const float* x, int64_t m, int64_t k, const cpu::QuantWeightSource& w, int64_t n, const float* bias,
                  float* y);

}  // namespace strata::reference
