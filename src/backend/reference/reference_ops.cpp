// Plain scalar kernels: the oracle. Written for clarity, not speed; one thread.
#include "backend/reference/reference_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"

namespace strata::reference {

namespace {

float load_weight(DType t, const void* w, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(w)[i];
    case DType::kBF16: return bf16_to_f32(static_cast<const bf16_t*>(w)[i]);
    case DType::kF16: return f16_to_f32(static_cast<const f16_t*>(w)[i]);
    default: STRATA_CHECK(false, std::string("reference::matmul: unsupported weight dtype ") + dtype_name(t));
  }
  return 0.0f;
}

// In double: 1 + tanh(z) cancels badly in f32 for x << 0, and the oracle must be the accurate side.
double silu(double x) { return x / (1.0 + std::exp(-x)); }

double gelu_tanh(double x) {
  const double kSqrt2OverPi = 0.7978845608028654;
  return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
}

}  // namespace

void matmul(const float* x, int64_t m, int64_t k, DType w_dtype, const void* w, int64_t n, const float* bias,
            float* y) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t p = 0; p < k; ++p) acc += x[i * k + p] * load_weight(w_dtype, w, j * k + p);
      y[i * n + j] = bias ? acc + bias[j] : acc;
    }
  }
}

void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps, bool one_plus_w) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double sum_sq = 0.0;
    for (int64_t i = 0; i < dim; ++i) sum_sq += double(xr[i]) * double(xr[i]);
    const float inv_rms = float(1.0 / std::sqrt(sum_sq / double(dim) + double(eps)));
    for (int64_t i = 0; i < dim; ++i) {
      const float g = w == nullptr ? 1.0f : (one_plus_w ? 1.0f + w[i] : w[i]);
      yr[i] = xr[i] * inv_rms * g;
    }
  }
}

void gated_act(const float* gate, const float* up, float* out, int64_t n, cpu::Activation act) {
  for (int64_t i = 0; i < n; ++i) {
    const double a = act == cpu::Activation::kSilu ? silu(gate[i]) : gelu_tanh(gate[i]);
    out[i] = float(a * double(up[i]));
  }
}

void add(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void mul(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
}

void activation(const float* x, float* out, int64_t n, cpu::Activation act) {
  for (int64_t i = 0; i < n; ++i) out[i] = float(act == cpu::Activation::kSilu ? silu(x[i]) : gelu_tanh(x[i]));
}

void softmax(const float* x, float* y, int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double mx = -INFINITY;
    for (int64_t i = 0; i < dim; ++i) mx = std::max(mx, double(xr[i]));
    double sum = 0.0;
    for (int64_t i = 0; i < dim; ++i) sum += std::exp(double(xr[i]) - mx);
    for (int64_t i = 0; i < dim; ++i) yr[i] = float(std::exp(double(xr[i]) - mx) / sum);
  }
}

void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t rot_dim, const int32_t* positions,
          const float* inv_freq, float attn_factor) {
  const int64_t half = rot_dim / 2;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        // The angle is formed in f32 like the Hugging Face implementation does.
        const float theta = float(positions[t]) * inv_freq[i];
        const float c = std::cos(theta) * attn_factor;
        const float s = std::sin(theta) * attn_factor;
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
      }
    }
  }
}

void paged_attention(const cpu::PagedAttentionArgs& a) {
  const int32_t group = a.n_heads / a.n_kv_heads;
  std::vector<double> logits;
  std::vector<double> acc(a.head_dim_v);
  for (int32_t t = 0; t < a.n_q; ++t) {
    const int64_t qpos = int64_t(a.pos0) + t;
    const int64_t lo = a.window > 0 ? std::max<int64_t>(0, qpos - a.window + 1) : 0;
    for (int32_t h = 0; h < a.n_heads; ++h) {
      const int32_t kvh = h / group;
      const float* q = a.q + (int64_t(t) * a.n_heads + h) * a.head_dim;
      logits.assign(size_t(qpos - lo + 1), 0.0);
      double max_logit = -INFINITY;
      for (int64_t p = lo; p <= qpos; ++p) {
        const int64_t block = a.block_table[p / a.block_size];
        const int64_t slot = block * a.block_size + p % a.block_size;
        const float* k = a.k_pool + (slot * a.n_kv_heads + kvh) * a.head_dim;
        double dot = 0.0;
        for (int32_t d = 0; d < a.head_dim; ++d) dot += double(q[d]) * double(k[d]);
        double s = dot * double(a.scale);
        if (a.softcap > 0.0f) s = double(a.softcap) * std::tanh(s / double(a.softcap));
        logits[size_t(p - lo)] = s;
        max_logit = std::max(max_logit, s);
      }
      double denom = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t p = lo; p <= qpos; ++p) {
        const double e = std::exp(logits[size_t(p - lo)] - max_logit);
        denom += e;
        const int64_t block = a.block_table[p / a.block_size];
        const int64_t slot = block * a.block_size + p % a.block_size;
        const float* v = a.v_pool + (slot * a.n_kv_heads + kvh) * a.head_dim_v;
        for (int32_t d = 0; d < a.head_dim_v; ++d) acc[size_t(d)] += e * double(v[d]);
      }
      float* out = a.out + (int64_t(t) * a.n_heads + h) * a.head_dim_v;
      for (int32_t d = 0; d < a.head_dim_v; ++d) out[d] = float(acc[size_t(d)] / denom);
    }
  }
}

}  // namespace strata::reference
