#include "model/gated_attention.h"

#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "core/check.h"
#include "model/weight_loader.h"
#include "model/weight_manifest.h"

namespace strata {

namespace {

// Rows [h * 2 * head_dim + half * head_dim, + head_dim) of q_proj for every head h: the
// query (half 0) or the gate (half 1).
Result<WeightMatrix> q_proj_half(const TensorInfo& t, int32_t n_heads, int32_t head_dim, int64_t hidden, int half) {
  const size_t row_bytes = dtype_row_bytes(t.dtype, hidden);
  std::vector<uint8_t> bytes(size_t(n_heads) * head_dim * row_bytes);
  for (int64_t h = 0; h < n_heads; ++h)
    std::memcpy(&bytes[size_t(h) * head_dim * row_bytes],
                static_cast<const uint8_t*>(t.data) + (size_t(h) * 2 * head_dim + size_t(half) * head_dim) * row_bytes,
                size_t(head_dim) * row_bytes);
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16)
    return make_error(ErrorCode::kUnsupported, t.file + ": tensor '" + t.name + "' has dtype " + dtype_name(t.dtype) +
                                                   " (supported: F32, BF16, F16)");
  return cpu::pack_weight(t.dtype, bytes.data(), int64_t(n_heads) * head_dim, hidden, /*alias_ok=*/false);
}

std::vector<float> bias_half(const std::vector<float>& b, int32_t n_heads, int32_t head_dim, int half) {
  std::vector<float> out(size_t(n_heads) * head_dim);
  for (int64_t h = 0; h < n_heads; ++h)
    std::memcpy(&out[size_t(h) * head_dim], &b[size_t(h) * 2 * head_dim + size_t(half) * head_dim],
                size_t(head_dim) * sizeof(float));
  return out;
}

}  // namespace

Result<GatedAttentionLayer> GatedAttentionLayer::load(const WeightLoader& w, const WeightManifest& m, int32_t layer,
                                                      int32_t hidden, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                                      float eps) {
  GatedAttentionLayer L;
  // The manifest lists every tensor read here (model/qwen3_next.h's hybrid_manifest).
  auto at = [&](WeightRole role) -> const WeightEntry& {
    const WeightEntry* e = m.find(role, layer);
    STRATA_CHECK(e != nullptr, "the hybrid manifest lists every attention tensor its loader reads");
    return *e;
  };
  auto mat = [&](WeightRole role, WeightMatrix* out) { return take(w.matrix(at(role).name, at(role).shape[0], at(role).shape[1]), out); };
  auto vec = [&](WeightRole role, std::vector<float>* out) { return take(w.vector(at(role).name, at(role).shape[0]), out); };
  auto q = w.tensor(at(WeightRole::kQGate).name, at(WeightRole::kQGate).shape);
  if (!q.ok()) return q.error();
  auto wq = q_proj_half(**q, n_heads, head_dim, hidden, 0);
  if (!wq.ok()) return wq.error();
  L.w_.q = std::move(*wq);
  auto wg = q_proj_half(**q, n_heads, head_dim, hidden, 1);
  if (!wg.ok()) return wg.error();
  L.gate_ = std::move(*wg);
  STRATA_RETURN_IF_ERROR(mat(WeightRole::kK, &L.w_.k));
  STRATA_RETURN_IF_ERROR(mat(WeightRole::kV, &L.w_.v));
  STRATA_RETURN_IF_ERROR(mat(WeightRole::kO, &L.w_.o));
  if (m.find(WeightRole::kQGateBias, layer) != nullptr) {
    std::vector<float> qb;
    STRATA_RETURN_IF_ERROR(vec(WeightRole::kQGateBias, &qb));
    L.w_.q_bias = bias_half(qb, n_heads, head_dim, 0);
    L.gate_bias_ = bias_half(qb, n_heads, head_dim, 1);
    STRATA_RETURN_IF_ERROR(vec(WeightRole::kKBias, &L.w_.k_bias));
    STRATA_RETURN_IF_ERROR(vec(WeightRole::kVBias, &L.w_.v_bias));
  }
  STRATA_RETURN_IF_ERROR(vec(WeightRole::kQNorm, &L.w_.q_norm));
  STRATA_RETURN_IF_ERROR(vec(WeightRole::kKNorm, &L.w_.k_norm));

  L.p_.n_heads = n_heads;
  L.p_.n_kv_heads = n_kv_heads;
  L.p_.head_dim = head_dim;
  L.p_.head_dim_v = head_dim;
  L.p_.scale = 1.0f / std::sqrt(float(head_dim));
  L.p_.norm_eps = eps;
  L.p_.norm_one_plus_w = true;
  return L;
}

KvLayerSpec GatedAttentionLayer::kv_spec() const {
  KvLayerSpec s;
  s.n_kv_heads = p_.n_kv_heads;
  s.head_dim_k = p_.head_dim;
  s.head_dim_v = p_.head_dim_v;
  return s;
}

void GatedAttentionLayer::forward(ThreadPool& pool, RopeProvider& rope, const StepBatch& batch, const int32_t* positions,
                                  const float* x, KvStorage& kv, int layer, GatedAttentionScratch& s, float* out) const {
  const int64_t n = batch.n_tokens(), qd = int64_t(p_.n_heads) * p_.head_dim;
  s.gate.resize(size_t(n * qd));
  cpu::matmul(pool, x, n, gate_, gate_bias_.empty() ? nullptr : gate_bias_.data(), s.gate.data());
  const AttentionParams& p = p_;
  // attention_forward applies o_proj right after attending; the gate sits between the two,
  // so the block is composed from its pieces here.
  AttentionScratch& a = s.attn;
  a.q.resize(size_t(n * qd));
  a.k.resize(size_t(n * p.n_kv_heads * p.head_dim));
  a.v.resize(size_t(n * p.n_kv_heads * p.head_dim_v));
  a.attn.resize(size_t(n * p.n_heads * p.head_dim_v));
  auto bias = [](const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); };
  cpu::matmul(pool, x, n, w_.q, bias(w_.q_bias), a.q.data());
  cpu::matmul(pool, x, n, w_.k, bias(w_.k_bias), a.k.data());
  cpu::matmul(pool, x, n, w_.v, bias(w_.v_bias), a.v.data());
  cpu::rms_norm(pool, a.q.data(), w_.q_norm.data(), a.q.data(), n * p.n_heads, p.head_dim, p.norm_eps, true);
  cpu::rms_norm(pool, a.k.data(), w_.k_norm.data(), a.k.data(), n * p.n_kv_heads, p.head_dim, p.norm_eps, true);
  apply_rope(pool, rope, batch, positions, a.q.data(), p.n_heads, p.head_dim);
  apply_rope(pool, rope, batch, positions, a.k.data(), p.n_kv_heads, p.head_dim);
  write_kv(pool, batch, kv, layer, a.k.data(), a.v.data());
  attend(pool, batch, kv, layer, p, a.q.data(), a.attn.data());
  float* o = a.attn.data();
  const float* g = s.gate.data();
  pool.parallel_for(n * qd, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) o[i] *= 1.0f / (1.0f + std::exp(-g[i]));
  }, 256);
  cpu::matmul(pool, o, n, w_.o, bias(w_.o_bias), out);
}

}  // namespace strata
