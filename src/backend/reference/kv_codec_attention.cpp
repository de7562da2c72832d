#include "backend/reference/kv_codec_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace strata::reference {

void paged_attention_codec(const cpu::KvCodecAttentionArgs& a) {
  const int32_t group = a.n_heads / a.n_kv_heads;
  const int32_t hd = a.k_fmt.dim, hdv = a.v_fmt.dim;
  // Mixed formats (delayed quantization): every value row is decoded fully, no rotated domain.
  const bool mixed = a.n_prefix_blocks > 0;
  const bool rotated = !mixed && a.v_fmt.kind == KvRowKind::kTurbo3;
  // Pool, format and bytes of the row at position p.
  auto k_row = [&](int64_t p, int32_t kvh, const KvRowFormat** f) {
    const int64_t bi = p / a.block_size;
    const int64_t slot = int64_t(a.block_table[bi]) * a.block_size + p % a.block_size;
    const bool pre = bi < a.n_prefix_blocks;
    *f = pre ? &a.k_fmt_prefix : &a.k_fmt;
    return (pre ? a.k_pool_prefix : a.k_pool) + (slot * a.n_kv_heads + kvh) * (*f)->bytes();
  };
  auto v_row = [&](int64_t p, int32_t kvh, const KvRowFormat** f) {
    const int64_t bi = p / a.block_size;
    const int64_t slot = int64_t(a.block_table[bi]) * a.block_size + p % a.block_size;
    const bool pre = bi < a.n_prefix_blocks;
    *f = pre ? &a.v_fmt_prefix : &a.v_fmt;
    return (pre ? a.v_pool_prefix : a.v_pool) + (slot * a.n_kv_heads + kvh) * (*f)->bytes();
  };
  std::vector<double> logits, acc(static_cast<size_t>(hdv));
  std::vector<float> k(static_cast<size_t>(hd)), v(static_cast<size_t>(hdv)), o(static_cast<size_t>(hdv)),
      signs(static_cast<size_t>(hdv));
  for (int32_t t = 0; t < a.n_q; ++t) {
    const int64_t qpos = int64_t(a.pos0) + t;
    const int64_t lo = a.window > 0 ? std::max<int64_t>(0, qpos - a.window + 1) : 0;
    for (int32_t h = 0; h < a.n_heads; ++h) {
      const int32_t kvh = h / group;
      const uint64_t seed = kv_rotation_seed(a.seed_layer, kvh);
      const float* q = a.q + (int64_t(t) * a.n_heads + h) * hd;
      logits.assign(size_t(qpos - lo + 1), 0.0);
      double max_logit = -INFINITY;
      for (int64_t p = lo; p <= qpos; ++p) {
        const KvRowFormat* kf;
        const uint8_t* row = k_row(p, kvh, &kf);
        kv_decode_row(*kf, row, k.data(), 0);
        double dot = 0.0;
        for (int32_t d = 0; d < hd; ++d) dot += double(q[d]) * double(k[size_t(d)]);
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
        const KvRowFormat* vf;
        const uint8_t* row = v_row(p, kvh, &vf);
        kv_decode_row(*vf, row, v.data(), seed, rotated);
        for (int32_t d = 0; d < hdv; ++d) acc[size_t(d)] += e * double(v[size_t(d)]);
      }
      float* out = a.out + (int64_t(t) * a.n_heads + h) * hdv;
      for (int32_t d = 0; d < hdv; ++d) o[size_t(d)] = float(acc[size_t(d)] / denom);
      if (rotated) {
        kv_rotation_signs(seed, hdv, signs.data());
        kv_unrotate(o.data(), hdv, signs.data());
      }
      std::copy(o.begin(), o.end(), out);
    }
  }
}

}  // namespace strata::reference
