#include "model/delta_net.h"

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "backend/cpu/conv1d.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/delta_net.h"
#include "core/check.h"
#include "model/weight_loader.h"
#include "model/weight_manifest.h"

namespace strata {

namespace {

// Builds one matrix from rows of several checkpoint matrices (all of one dtype and width):
// row r of the result is row pick[r].second of pick[r].first.
Result<WeightMatrix> gather_rows(const std::vector<std::pair<const TensorInfo*, int64_t>>& pick, int64_t cols) {
  const DType dt = pick.front().first->dtype;
  if (dt != DType::kF32 && dt != DType::kBF16 && dt != DType::kF16)
    return make_error(ErrorCode::kUnsupported, "tensor '" + pick.front().first->name + "' has dtype " + dtype_name(dt) +
                                                   " (supported: F32, BF16, F16)");
  for (const auto& [t, row] : pick)
    if (t->dtype != dt)
      return make_error(ErrorCode::kUnsupported, "tensor " + t->name + " has dtype " + dtype_name(t->dtype) +
                                                     " but " + pick.front().first->name + " has " + dtype_name(dt));
  const size_t row_bytes = dtype_row_bytes(dt, cols);
  std::vector<uint8_t> bytes(pick.size() * row_bytes);
  for (size_t r = 0; r < pick.size(); ++r)
    std::memcpy(&bytes[r * row_bytes], static_cast<const uint8_t*>(pick[r].first->data) + pick[r].second * row_bytes,
                row_bytes);
  return cpu::pack_weight(dt, bytes.data(), int64_t(pick.size()), cols, /*alias_ok=*/false);
}

Status read_dim(const nlohmann::json& j, const char* key, const std::string& source, int32_t* out) {
  if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() <= 0 || j[key].get<int64_t>() > (1 << 20))
    return make_error(ErrorCode::kInvalidArgument,
                      source + ": " + key + " must be a positive integer, got " + (j.contains(key) ? j[key].dump() : "nothing"));
  *out = j[key].get<int32_t>();
  return {};
}

}  // namespace

StateLayerSpec DeltaNetDims::state_spec() const {
  StateLayerSpec s;
  s.conv_floats = int64_t(conv_kernel - 1) * conv_dim();
  s.recurrent_floats = int64_t(n_v_heads) * d_k * d_v;
  s.has_state = true;
  s.prefill_chunk = cpu::kDeltaChunk;
  return s;
}

Result<DeltaNetDims> parse_delta_net_dims(const ModelConfig& cfg, const std::string& source) {
  if (!cfg.text_json) return make_error(ErrorCode::kInvalidArgument, source + ": no config object");
  const nlohmann::json& j = *cfg.text_json;
  DeltaNetDims d;
  STRATA_RETURN_IF_ERROR(read_dim(j, "linear_num_key_heads", source, &d.n_k_heads));
  STRATA_RETURN_IF_ERROR(read_dim(j, "linear_num_value_heads", source, &d.n_v_heads));
  STRATA_RETURN_IF_ERROR(read_dim(j, "linear_key_head_dim", source, &d.d_k));
  STRATA_RETURN_IF_ERROR(read_dim(j, "linear_value_head_dim", source, &d.d_v));
  STRATA_RETURN_IF_ERROR(read_dim(j, "linear_conv_kernel_dim", source, &d.conv_kernel));
  if (d.n_v_heads % d.n_k_heads != 0)
    return make_error(ErrorCode::kInvalidArgument, source + ": linear_num_value_heads " + std::to_string(d.n_v_heads) +
                                                       " is not a multiple of linear_num_key_heads " +
                                                       std::to_string(d.n_k_heads));
  return d;
}

Result<DeltaNetLayer> DeltaNetLayer::load(const WeightLoader& w, const WeightManifest& m, int32_t layer, const DeltaNetDims& d,
                                          int32_t hidden, float eps) {
  DeltaNetLayer L;
  L.dims_ = d;
  L.hidden_ = hidden;
  L.eps_ = eps;
  const int64_t kd = d.key_dim(), vd = d.value_dim(), nv = d.n_v_heads, H = hidden;
  // The manifest lists every tensor read here (model/qwen3_next.h's hybrid_manifest).
  auto at = [&](WeightRole role) -> const WeightEntry& {
    const WeightEntry* e = m.find(role, layer);
    STRATA_CHECK(e != nullptr, "the hybrid manifest lists every DeltaNet tensor its loader reads");
    return *e;
  };
  auto tensor = [&](WeightRole role) { return w.tensor(at(role).name, at(role).shape); };
  std::vector<std::pair<const TensorInfo*, int64_t>> rows;  // q | k | v | z | b | a
  rows.reserve(size_t(2 * kd + 2 * vd + 2 * nv));
  if (m.find(WeightRole::kDeltaQkvz, layer) != nullptr) {
    // Per key head g the fused rows are [q_g (d_k) | k_g (d_k) | v_g (r d_v) | z_g (r d_v)] and
    // [b_g (r) | a_g (r)], r = n_v / n_k value heads per key head; regroup them by kind.
    const int64_t r = d.n_v_heads / d.n_k_heads, gq = 2 * d.d_k + 2 * r * d.d_v;
    auto qkvz = tensor(WeightRole::kDeltaQkvz);
    if (!qkvz.ok()) return qkvz.error();
    auto ba = tensor(WeightRole::kDeltaBa);
    if (!ba.ok()) return ba.error();
    const int64_t offsets[4] = {0, d.d_k, 2 * d.d_k, 2 * d.d_k + r * d.d_v};
    const int64_t widths[4] = {d.d_k, d.d_k, r * d.d_v, r * d.d_v};
    for (int kind = 0; kind < 4; ++kind)
      for (int64_t g = 0; g < d.n_k_heads; ++g)
        for (int64_t i = 0; i < widths[kind]; ++i) rows.push_back({*qkvz, g * gq + offsets[kind] + i});
    for (int kind = 0; kind < 2; ++kind)
      for (int64_t g = 0; g < d.n_k_heads; ++g)
        for (int64_t i = 0; i < r; ++i) rows.push_back({*ba, g * 2 * r + kind * r + i});
  } else {
    for (WeightRole role : {WeightRole::kDeltaQkv, WeightRole::kDeltaZ, WeightRole::kDeltaB, WeightRole::kDeltaA}) {
      auto t = tensor(role);
      if (!t.ok()) return t.error();
      for (int64_t i = 0; i < at(role).shape[0]; ++i) rows.push_back({*t, i});
    }
  }
  auto in_proj = gather_rows(rows, H);
  if (!in_proj.ok()) return in_proj.error();
  L.in_proj_ = std::move(*in_proj);

  if (w.has(at(WeightRole::kDeltaConvBias).name))
    return make_error(ErrorCode::kUnsupported,
                      "tensor '" + w.prefix() + at(WeightRole::kDeltaConvBias).name + "': a DeltaNet conv bias is not supported");
  auto conv = w.f32(at(WeightRole::kDeltaConv).name, at(WeightRole::kDeltaConv).shape);
  if (!conv.ok()) return conv.error();
  L.conv_w_ = std::move(*conv);
  for (auto [role, dst] : {std::pair{WeightRole::kDeltaALog, &L.a_log_}, std::pair{WeightRole::kDeltaDtBias, &L.dt_bias_},
                           std::pair{WeightRole::kDeltaNorm, &L.norm_w_}}) {
    auto v = w.vector(at(role).name, at(role).shape[0]);
    if (!v.ok()) return v.error();
    *dst = std::move(*v);
  }
  auto out = w.matrix(at(WeightRole::kDeltaOut).name, H, vd);
  if (!out.ok()) return out.error();
  L.out_proj_ = std::move(*out);
  return L;
}

void DeltaNetLayer::forward(ThreadPool& pool, const float* x, int64_t n_tokens, const std::vector<DeltaNetSpan>& spans,
                            DeltaNetScratch& scratch, float* out) const {
  const DeltaNetDims& d = dims_;
  const int64_t kd = d.key_dim(), vd = d.value_dim(), cd = d.conv_dim(), nv = d.n_v_heads;
  const int64_t P = in_proj_.rows;  // projection row: q | k | v | z | b | a
  std::vector<float>& proj = scratch.proj;
  std::vector<float>& mixed = scratch.mixed;
  std::vector<float>& g = scratch.g;
  std::vector<float>& beta = scratch.beta;
  std::vector<float>& core = scratch.core;
  proj.resize(size_t(n_tokens * P));
  // Rows outside every span must read as zeros in the l2 norm below, not as stale values.
  mixed.assign(size_t(n_tokens * cd), 0.0f);
  g.resize(size_t(n_tokens * nv));
  beta.resize(size_t(n_tokens * nv));
  core.assign(size_t(n_tokens * vd), 0.0f);
  cpu::matmul(pool, x, n_tokens, in_proj_, nullptr, proj.data());

  for (const DeltaNetSpan& s : spans) {
    cpu::CausalConv1dArgs c{};
    c.x = proj.data() + s.t0 * P;
    c.y = mixed.data() + s.t0 * cd;
    c.state = s.conv;
    c.weight = conv_w_.data();
    c.bias = nullptr;
    c.x_stride = P;
    c.n_tokens = s.n_tokens;
    c.channels = int32_t(cd);
    c.kernel = d.conv_kernel;
    c.silu = true;
    cpu::causal_conv1d(pool, c);
  }
  // q and k heads are the first 2 n_k heads of each conv row.
  cpu::l2_norm_heads(pool, mixed.data(), n_tokens, 2 * d.n_k_heads, d.d_k, cd, 1e-6f);
  cpu::delta_net_gates(proj.data() + cd + vd + nv, proj.data() + cd + vd, P, a_log_.data(), dt_bias_.data(), g.data(),
                       beta.data(), n_tokens, nv);

  for (const DeltaNetSpan& s : spans) {
    cpu::GatedDeltaRuleArgs a{};
    a.q = mixed.data() + s.t0 * cd;
    a.k = a.q + kd;
    a.v = a.k + kd;
    a.qkv_stride = cd;
    a.g = g.data() + s.t0 * nv;
    a.beta = beta.data() + s.t0 * nv;
    a.state = s.recurrent;
    a.out = core.data() + s.t0 * vd;
    a.n_tokens = s.n_tokens;
    a.n_k_heads = d.n_k_heads;
    a.n_v_heads = d.n_v_heads;
    a.d_k = d.d_k;
    a.d_v = d.d_v;
    a.pos0 = s.pos0;
    a.scale = 1.0f / std::sqrt(float(d.d_k));
    // The form is chosen per absolute 64-position block from the rows the span covers (see
    // cpu::gated_delta_rule), so a block covered from its start to the same end gives the same
    // bits whatever else the span holds.
    cpu::gated_delta_rule(pool, a);
  }
  cpu::gated_rms_norm(pool, core.data(), proj.data() + cd, P, norm_w_.data(), core.data(), n_tokens, nv, d.d_v, eps_);
  cpu::matmul(pool, core.data(), n_tokens, out_proj_, nullptr, out);
}

}  // namespace strata
