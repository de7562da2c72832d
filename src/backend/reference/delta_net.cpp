#include "backend/reference/delta_net.h"

#include <cmath>
#include <vector>

namespace strata::reference {

namespace {

// torch.nn.functional.softplus with its default threshold: linear above 20.
double softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }

}  // namespace

void l2_norm_heads(float* x, int64_t n_tokens, int64_t n_heads, int64_t dim, int64_t token_stride, float eps) {
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + t * token_stride + h * dim;
      double ss = 0.0;
      for (int64_t i = 0; i < dim; ++i) ss += double(v[i]) * v[i];
      const double inv = 1.0 / std::sqrt(ss + eps);
      for (int64_t i = 0; i < dim; ++i) v[i] = float(v[i] * inv);
    }
}

void delta_net_gates(const float* a, const float* b, int64_t ab_stride, const float* a_log, const float* dt_bias,
                     float* g, float* beta, int64_t n_tokens, int64_t n_heads) {
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t h = 0; h < n_heads; ++h) {
      g[t * n_heads + h] = float(-std::exp(double(a_log[h])) * softplus(double(a[t * ab_stride + h]) + dt_bias[h]));
      beta[t * n_heads + h] = float(1.0 / (1.0 + std::exp(-double(b[t * ab_stride + h]))));
    }
}

void gated_delta_rule(const cpu::GatedDeltaRuleArgs& a) {
  const int64_t dk = a.d_k, dv = a.d_v, group = a.n_v_heads / a.n_k_heads;
  std::vector<double> kv(size_t(dv), 0.0);
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    for (int64_t h = 0; h < a.n_v_heads; ++h) {
      const float* q = a.q + t * a.qkv_stride + (h / group) * dk;
      const float* k = a.k + t * a.qkv_stride + (h / group) * dk;
      const float* v = a.v + t * a.qkv_stride + h * dv;
      float* S = a.state + h * dk * dv;
      const double decay = std::exp(double(a.g[t * a.n_v_heads + h]));
      const double beta = a.beta[t * a.n_v_heads + h];
      for (int64_t i = 0; i < dk * dv; ++i) S[i] = float(S[i] * decay);
      for (int64_t j = 0; j < dv; ++j) {
        double m = 0.0;
        for (int64_t i = 0; i < dk; ++i) m += double(S[i * dv + j]) * k[i];
        kv[j] = (v[j] - m) * beta;
      }
      for (int64_t i = 0; i < dk; ++i)
        for (int64_t j = 0; j < dv; ++j) S[i * dv + j] = float(S[i * dv + j] + double(k[i]) * kv[j]);
      float* o = a.out + (t * a.n_v_heads + h) * dv;
      for (int64_t j = 0; j < dv; ++j) {
        double acc = 0.0;
        for (int64_t i = 0; i < dk; ++i) acc += double(S[i * dv + j]) * q[i];
        o[j] = float(acc * a.scale);
      }
    }
  }
}

void gated_rms_norm(const float* x, const float* z, int64_t z_stride, const float* w, float* y, int64_t n_tokens,
                    int64_t n_heads, int64_t dim, float eps) {
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t h = 0; h < n_heads; ++h) {
      const float* xv = x + (t * n_heads + h) * dim;
      const float* zv = z + t * z_stride + h * dim;
      float* yv = y + (t * n_heads + h) * dim;
      double ss = 0.0;
      for (int64_t i = 0; i < dim; ++i) ss += double(xv[i]) * xv[i];
      const double inv = 1.0 / std::sqrt(ss / double(dim) + eps);
      for (int64_t i = 0; i < dim; ++i) {
        const double gate = zv[i] / (1.0 + std::exp(-double(zv[i])));
        yv[i] = float(xv[i] * inv * w[i] * gate);
      }
    }
}

}  // namespace strata::reference
