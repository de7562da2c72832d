// Device helpers of the KV codec encoder (kv_codec.cu's kv_codec_write_kernel): the reference
// e4m3 conversions and the fits behind the fp8 and turbo3 encoders' scale searches
// (backend/reference/kv_codec.h defines the encoders; these must give the same bytes).
// Private to kv_codec.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::cuda::kv_codec_detail {

// reference f32_to_e4m3: round to nearest even, saturating at +-448, subnormals below 2^-6.
__device__ inline uint32_t f32_to_e4m3(float x) {
  const uint32_t sign = signbit(x) ? 0x80u : 0u;
  float a = fabsf(x);
  if (!(a < 448.0f)) a = 448.0f;
  if (a < 0.015625f) return sign | uint32_t(rintf(a * 512.0f));
  int e = 0;
  frexpf(a, &e);
  int q = int(rintf(ldexpf(a, 3 - (e - 1))));
  int biased = e - 1 + 7;
  if (q == 16) {
    q = 8;
    ++biased;
  }
  return sign | uint32_t(biased << 3) | uint32_t(q - 8);
}

// The reference e4m3_to_f32 (every value exact).
__device__ __forceinline__ float e4m3_value(uint32_t c) {
  const int biased = int(c >> 3) & 15, m = int(c & 7u);
  const float mag = biased == 0 ? float(m) * 0.001953125f : ldexpf(1.0f + float(m) * 0.125f, biased - 7);
  return (c & 0x80u) ? -mag : mag;
}

// The encoders' candidate scale multipliers (reference kKvFp8ScaleSteps / kKvTurboScaleSteps).
constexpr int kFp8Candidates = 16;
constexpr int kTurboCandidates = 17;
struct EncodeSteps {
  float fp8[kFp8Candidates];
  float turbo[kTurboCandidates];
};

// <x, c> and <c, c> for the codes of x / s (c at unit scale), summed in index order in double
// as the reference does; the products are exact, so the sums match it bit for bit.
struct Fit {
  double yc, cc;
};

__device__ inline Fit fp8_fit(const float* x, int dim, float s) {
  const float inv = 1.0f / s;
  Fit f{0.0, 0.0};
  for (int d = 0; d < dim; ++d) {
    const double c = e4m3_value(f32_to_e4m3(x[d] * inv));
    f.yc += double(x[d]) * c;
    f.cc += c * c;
  }
  return f;
}

__device__ __forceinline__ uint32_t nearest_level(float z, const float* levels) {
  uint32_t c = 0;
  while (c < 7 && z > 0.5f * (levels[c] + levels[c + 1])) ++c;
  return c;
}

__device__ inline Fit turbo_fit(const float* x, int dim, float s, const float* levels) {
  const float inv = 1.0f / s;
  Fit f{0.0, 0.0};
  for (int d = 0; d < dim; ++d) {
    const double c = levels[nearest_level(x[d] * inv, levels)];
    f.yc += double(x[d]) * c;
    f.cc += c * c;
  }
  return f;
}

// The lane whose fit scores highest (yc^2 / cc, the least-squares rescale's gain), the lowest
// lane on ties, as the reference's first-wins scan; -1 when no score is positive (lanes
// without a candidate pass score 0).
__device__ __forceinline__ int warp_best_fit(double score) {
  if (!(score > 0.0)) score = 0.0;
  int best = threadIdx.x & 31;
  for (int o = 16; o > 0; o >>= 1) {
    const double os = __shfl_xor_sync(0xffffffffu, score, o);
    const int ol = __shfl_xor_sync(0xffffffffu, best, o);
    if (os > score || (os == score && ol < best)) score = os, best = ol;
  }
  return score > 0.0 ? best : -1;
}

}  // namespace strata::cuda::kv_codec_detail
