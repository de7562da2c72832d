#include "model/rope.h"

#include <algorithm>
#include <cmath>

namespace strata {

namespace {

// 1 / theta^(2i / dim) for i < n_pairs, in float as torch computes it.
std::vector<float> base_inv_freq(double theta, int32_t dim, int32_t n_pairs) {
  std::vector<float> f(static_cast<size_t>(n_pairs));
  for (int32_t i = 0; i < n_pairs; ++i) {
    const float e = float(2 * i) / float(dim);
    f[size_t(i)] = 1.0f / std::pow(float(theta), e);
  }
  return f;
}

double yarn_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

Result<RopeTable> compute_rope(const RopeConfig& r, int32_t head_dim, int32_t max_position, int64_t seq_len) {
  RopeTable t;
  if (r.type == "proportional") {
    const int32_t rope_angles = int32_t(r.partial_rotary_factor * head_dim / 2.0);
    t.rot_dim = head_dim;
    t.inv_freq = base_inv_freq(r.theta, head_dim, rope_angles);
    t.inv_freq.resize(size_t(head_dim / 2), 0.0f);
    for (float& f : t.inv_freq) f = f / float(r.factor);
    return t;
  }
  int32_t dim = int32_t(double(head_dim) * r.partial_rotary_factor);
  if (dim <= 0 || dim % 2 != 0 || dim > head_dim) {
    return make_error(ErrorCode::kInvalidArgument, "rotary dimension " + std::to_string(dim) + " (head_dim " +
                                                       std::to_string(head_dim) + " x partial_rotary_factor) must be even and positive");
  }
  t.rot_dim = dim;
  const int32_t half = dim / 2;
  if (r.type == "default") {
    t.inv_freq = base_inv_freq(r.theta, dim, half);
  } else if (r.type == "linear") {
    t.inv_freq = base_inv_freq(r.theta, dim, half);
    for (float& f : t.inv_freq) f = f / float(r.factor);
  } else if (r.type == "dynamic") {
    if (max_position <= 0) return make_error(ErrorCode::kInvalidArgument, "dynamic RoPE needs max_position_embeddings");
    const double len = double(std::max<int64_t>(seq_len, max_position));
    const double theta =
        r.theta * std::pow(r.factor * len / double(max_position) - (r.factor - 1.0), double(dim) / double(dim - 2));
    t.inv_freq = base_inv_freq(theta, dim, half);
  } else if (r.type == "yarn") {
    const int64_t orig = r.original_max_position > 0 ? r.original_max_position : max_position;
    if (orig <= 0) return make_error(ErrorCode::kInvalidArgument, "yarn RoPE needs original_max_position_embeddings");
    double factor = r.factor;
    double attn = r.attention_factor;
    if (attn == 0.0) {
      attn = (r.mscale != 0.0 && r.mscale_all_dim != 0.0) ? yarn_mscale(factor, r.mscale) / yarn_mscale(factor, r.mscale_all_dim)
                                                          : yarn_mscale(factor, 1.0);
    }
    const double beta_fast = r.beta_fast != 0.0 ? r.beta_fast : 32.0;
    const double beta_slow = r.beta_slow != 0.0 ? r.beta_slow : 1.0;
    auto correction_dim = [&](double rotations) {
      return (double(dim) * std::log(double(orig) / (rotations * 2.0 * M_PI))) / (2.0 * std::log(r.theta));
    };
    double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
    if (r.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, double(dim - 1));
    if (low == high) high += 0.001;  // keeps the ramp finite
    t.inv_freq.resize(size_t(half));
    for (int32_t i = 0; i < half; ++i) {
      const float pos_freq = std::pow(float(r.theta), float(2 * i) / float(dim));
      const float extrap = 1.0f / pos_freq;
      const float interp = 1.0f / (float(factor) * pos_freq);
      float ramp = (float(i) - float(low)) / (float(high) - float(low));
      ramp = std::clamp(ramp, 0.0f, 1.0f);
      const float extrap_factor = 1.0f - ramp;
      t.inv_freq[size_t(i)] = interp * (1.0f - extrap_factor) + extrap * extrap_factor;
    }
    t.attn_factor = float(attn);
  } else if (r.type == "llama3") {
    std::vector<float> f = base_inv_freq(r.theta, dim, half);
    const double orig = double(r.original_max_position);
    const float low_wavelen = float(orig / r.low_freq_factor);
    const float high_wavelen = float(orig / r.high_freq_factor);
    const float factor = float(r.factor);
    for (float& x : f) {
      const float wavelen = float(2.0 * M_PI) / x;
      float y = wavelen > low_wavelen ? x / factor : x;
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      if (medium) {
        const float smooth = (float(orig) / wavelen - float(r.low_freq_factor)) / float(r.high_freq_factor - r.low_freq_factor);
        y = (1.0f - smooth) * y / factor + smooth * y;
      }
      x = y;
    }
    t.inv_freq = std::move(f);
  } else {
    return make_error(ErrorCode::kUnsupported, "rope_type '" + r.type + "' is not supported");
  }
  return t;
}

Result<RopeProvider> RopeProvider::create(const RopeConfig& r, int32_t head_dim, int32_t max_position) {
  RopeProvider p;
  p.cfg_ = r;
  p.head_dim_ = head_dim;
  p.max_position_ = max_position;
  auto t = compute_rope(r, head_dim, max_position, 0);
  if (!t.ok()) return t.error();
  p.base_ = std::move(*t);
  return p;
}

const RopeTable& RopeProvider::table(int64_t seq_len) {
  if (cfg_.type != "dynamic" || seq_len <= max_position_) return base_;
  if (seq_len != scaled_len_) {
    auto t = compute_rope(cfg_, head_dim_, max_position_, seq_len);
    scaled_ = t.ok() ? std::move(*t) : base_;  // inputs were validated by create()
    scaled_len_ = seq_len;
  }
  return scaled_;
}

}  // namespace strata
