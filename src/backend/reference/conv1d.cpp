#include "backend/reference/conv1d.h"

#include <cmath>
#include <vector>

namespace strata::reference {

void causal_conv1d(const cpu::CausalConv1dArgs& a) {
  const int64_t C = a.channels, K = a.kernel, T = a.n_tokens;
  // window[j] holds the input at token t - (K - 1) + j: state first, then x.
  auto input_at = [&](int64_t t, int64_t c) -> float {  // t may be negative (from the state)
    return t >= 0 ? a.x[t * a.x_stride + c] : a.state[(K - 1 + t) * C + c];
  };
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < C; ++c) {
      double acc = a.bias ? a.bias[c] : 0.0;
      for (int64_t j = 0; j < K; ++j) acc += double(a.weight[c * K + j]) * double(input_at(t - (K - 1) + j, c));
      float v = float(acc);
      if (a.silu) v = v / (1.0f + std::exp(-v));
      a.y[t * C + c] = v;
    }
  }
  // New state: the last K - 1 inputs of (old state ++ x).
  std::vector<float> next(size_t((K - 1) * C));
  for (int64_t j = 0; j < K - 1; ++j)
    for (int64_t c = 0; c < C; ++c) next[j * C + c] = input_at(T - (K - 1) + j, c);
  for (size_t i = 0; i < next.size(); ++i) a.state[i] = next[i];
}

}  // namespace strata::reference
