#include "backend/reference/quant_matmul.h"

#include <cmath>

namespace strata::reference {

float quant_weight(const cpu::QuantWeightSource& w, int64_t cols, int64_t r, int64_t c) {
  const int64_t groups = (cols + w.group - 1) / w.group;
  const int64_t g = r * groups + c / w.group;
  const uint8_t q = w.codes[r * cols + c];
  if (w.quant == WeightQuant::kFp8) return fp8_e4m3fn_to_f32(q) * w.scales[g];
  return std::fma(float(q), w.scales[g], w.biases[g]);
}

void quant_matmul(const float* x, int64_t m, int64_t k, const cpu::QuantWeightSource& w, int64_t n, const float* bias,
                  float* y) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t p = 0; p < k; ++p) acc = std::fma(x[i * k + p], quant_weight(w, k, j, p), acc);
      y[i * n + j] = bias ? acc + bias[j] : acc;
    }
  }
}

}  // namespace strata::reference
