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

// Dims per lane of a row held in registers (head dims up to 256).
constexpr int kEncDimsPerLane = 8;

// The reference's fixed order of the encoders' sums: the lane's partial (its dims l, l + 32,
// ... in index order) combined by the xor butterfly, own value first (the reference's partial
// l += partial l + o); a + b == b + a exactly, so every lane ends with the reference's sum.
__device__ __forceinline__ double warp_tree_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// <x, c> and <c, c> for the codes of x / s (c at unit scale), the whole warp fitting one
// candidate: xr[i] is dim lane + 32 i (n dims in the row). The products are exact in double, so
// the sums match the reference bit for bit; every lane returns the same fit.
struct Fit {
  double yc, cc;
};

__device__ __forceinline__ Fit fp8_fit(const float (&xr)[kEncDimsPerLane], int lane, int dim, float s) {
  const float inv = 1.0f / s;
  double yc = 0.0, cc = 0.0;
#pragma unroll
  for (int i = 0; i < kEncDimsPerLane; ++i) {
    if (lane + 32 * i < dim) {
      const double c = e4m3_value(f32_to_e4m3(xr[i] * inv));
      yc += double(xr[i]) * c;
      cc += c * c;
    }
  }
  return Fit{warp_tree_sum(yc), warp_tree_sum(cc)};
}

__device__ __forceinline__ uint32_t nearest_level(float z, const float* levels) {
  uint32_t c = 0;
  while (c < 7 && z > 0.5f * (levels[c] + levels[c + 1])) ++c;
  return c;
}

__device__ __forceinline__ Fit turbo_fit(const float (&xr)[kEncDimsPerLane], int lane, int dim, float s,
                                         const float* levels) {
  const float inv = 1.0f / s;
  double yc = 0.0, cc = 0.0;
#pragma unroll
  for (int i = 0; i < kEncDimsPerLane; ++i) {
    if (lane + 32 * i < dim) {
      const double c = levels[nearest_level(xr[i] * inv, levels)];
      yc += double(xr[i]) * c;
      cc += c * c;
    }
  }
  return Fit{warp_tree_sum(yc), warp_tree_sum(cc)};
}

}  // namespace strata::cuda::kv_codec_detail
