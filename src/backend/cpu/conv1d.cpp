#include "backend/cpu/conv1d.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace strata::cpu {

void causal_conv1d(ThreadPool& pool, const CausalConv1dArgs& a) {
  const int64_t C = a.channels, K = a.kernel, T = a.n_tokens;
  if (T == 0) return;
  pool.parallel_for(C, [&](int64_t c0, int64_t c1, int) {
    const int64_t width = c1 - c0;
    // Per channel block: the K-1 carried inputs followed by this call's inputs, token-major.
    thread_local std::vector<float> win;  // per worker, kept across steps
    win.resize(size_t((K - 1 + T) * width));
    for (int64_t j = 0; j < K - 1; ++j) std::memcpy(&win[j * width], a.state + j * C + c0, width * sizeof(float));
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(&win[(K - 1 + t) * width], a.x + t * a.x_stride + c0, width * sizeof(float));
    for (int64_t t = 0; t < T; ++t) {
      float* y = a.y + t * C + c0;
      for (int64_t c = 0; c < width; ++c) {
        const float* w = a.weight + (c0 + c) * K;
        float acc = a.bias ? a.bias[c0 + c] : 0.0f;
        for (int64_t j = 0; j < K; ++j) acc += w[j] * win[(t + j) * width + c];
        y[c] = a.silu ? acc / (1.0f + std::exp(-acc)) : acc;
      }
    }
    for (int64_t j = 0; j < K - 1; ++j) std::memcpy(a.state + j * C + c0, &win[(T + j) * width], width * sizeof(float));
  }, 16);
}

}  // namespace strata::cpu
