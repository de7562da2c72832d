#include "model/layers/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace strata {

void route_topk(const float* logits, int64_t n, int32_t n_experts, int32_t k, bool renormalize, int32_t* ids,
                float* weights) {
  std::vector<float> p(static_cast<size_t>(n_experts));
  std::vector<int32_t> order(static_cast<size_t>(n_experts));
  for (int64_t t = 0; t < n; ++t) {
    const float* l = logits + t * n_experts;
    float mx = l[0];
    for (int32_t e = 1; e < n_experts; ++e) mx = std::max(mx, l[e]);
    float sum = 0.0f;
    for (int32_t e = 0; e < n_experts; ++e) {
      p[size_t(e)] = std::exp(l[e] - mx);
      sum += p[size_t(e)];
    }
    for (float& v : p) v /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[size_t(a)] > p[size_t(b)]; });
    float top_sum = 0.0f;
    for (int32_t j = 0; j < k; ++j) top_sum += p[size_t(order[size_t(j)])];
    for (int32_t j = 0; j < k; ++j) {
      ids[t * k + j] = order[size_t(j)];
      const float w = p[size_t(order[size_t(j)])];
      weights[t * k + j] = renormalize ? w / top_sum : w;
    }
  }
}

void moe_forward(ThreadPool& pool, const MoeWeights& w, cpu::Activation act, const float* x, int64_t n, int64_t hidden,
                 MoeScratch& s, float* out) {
  const int32_t n_experts = int32_t(w.experts.size());
  const int32_t k = w.top_k;
  s.router_logits.resize(size_t(n * n_experts));
  s.topk_ids.resize(size_t(n * k));
  s.topk_weights.resize(size_t(n * k));
  cpu::matmul(pool, x, n, w.router, nullptr, s.router_logits.data());
  route_topk(s.router_logits.data(), n, n_experts, k, w.norm_topk_prob, s.topk_ids.data(), s.topk_weights.data());
  moe_experts_forward(pool, w.experts, act, x, n, hidden, s.topk_ids.data(), s.topk_weights.data(), k, s, out);
}

void moe_experts_forward(ThreadPool& pool, const std::vector<GatedMlpWeights>& experts, cpu::Activation act,
                         const float* x, int64_t n, int64_t hidden, const int32_t* ids, const float* weights, int32_t k,
                         MoeScratch& s, float* out) {
  const int32_t n_experts = int32_t(experts.size());
  s.contrib.assign(size_t(n * k * hidden), 0.0f);
  for (int32_t e = 0; e < n_experts; ++e) {
    s.rows.clear();
    s.slot.clear();
    for (int64_t t = 0; t < n; ++t) {
      for (int32_t j = 0; j < k; ++j) {
        if (ids[t * k + j] == e) {
          s.rows.push_back(t);
          s.slot.push_back(j);
        }
      }
    }
    if (s.rows.empty()) continue;
    const int64_t m = int64_t(s.rows.size());
    s.xs.resize(size_t(m * hidden));
    s.ys.resize(size_t(m * hidden));
    for (int64_t r = 0; r < m; ++r) std::memcpy(&s.xs[size_t(r * hidden)], x + s.rows[size_t(r)] * hidden, size_t(hidden) * 4);
    gated_mlp_forward(pool, experts[size_t(e)], act, s.xs.data(), m, s.mlp, s.ys.data());
    for (int64_t r = 0; r < m; ++r) {
      const int64_t t = s.rows[size_t(r)];
      const int32_t j = s.slot[size_t(r)];
      const float wt = weights[t * k + j];
      float* c = &s.contrib[size_t((t * k + j) * hidden)];
      const float* y = &s.ys[size_t(r * hidden)];
      for (int64_t h = 0; h < hidden; ++h) c[h] = y[h] * wt;
    }
  }
  // Sum each token's k terms in ascending expert id order.
  for (int64_t t = 0; t < n; ++t) {
    int32_t idx[64];
    const int32_t kk = std::min<int32_t>(k, 64);
    for (int32_t j = 0; j < kk; ++j) idx[j] = j;
    std::sort(idx, idx + kk, [&](int32_t a, int32_t b) { return ids[t * k + a] < ids[t * k + b]; });
    float* o = out + t * hidden;
    std::fill(o, o + hidden, 0.0f);
    for (int32_t jj = 0; jj < kk; ++jj) {
      const float* c = &s.contrib[size_t((t * k + idx[jj]) * hidden)];
      for (int64_t h = 0; h < hidden; ++h) o[h] += c[h];
    }
  }
}

}  // namespace strata
