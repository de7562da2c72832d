// Kernels of WeightSplit (see weight_split_kernels.h).
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/weight_split_kernels.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float bits_to_f32(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

// Round to nearest even; NaN stays NaN.
__device__ __forceinline__ uint16_t f32_to_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

unsigned grid_of(int64_t n) { return unsigned(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 4096)); }

__global__ void embed_residual_kernel(EmbedResidualArgs a) {
  const int64_t total = int64_t(a.n) * a.hidden;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / a.hidden, c = i % a.hidden;
    a.out[i] += bits_to_f32(a.lo[int64_t(a.ids[t]) * a.hidden + c]) * a.scale;
  }
}

__global__ void norm_residual_kernel(NormResidualArgs a) {
  __shared__ float part[kThreads / 32];
  const int r = blockIdx.x;
  const float* x = a.x + int64_t(a.row_map ? a.row_map[r] : r) * a.dim;
  float inv = 1.0f;
  if (a.w != nullptr) {
    float ss = 0.0f;
    for (int c = threadIdx.x; c < a.dim; c += blockDim.x) ss += x[c] * x[c];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
    __syncthreads();
    float sum = 0.0f;
    for (int i = 0; i < int(blockDim.x / 32); ++i) sum += part[i];
    inv = rsqrtf(sum / float(a.dim) + a.eps);
  }
  const uint16_t* hi = a.hi + int64_t(r) * a.dim;
  uint16_t* lo = a.lo + int64_t(r) * a.dim;
  for (int c = threadIdx.x; c < a.dim; c += blockDim.x) {
    float v = x[c];
    if (a.w != nullptr) v = v * inv * (a.one_plus_w ? 1.0f + a.w[c] : a.w[c]);
    lo[c] = f32_to_bits(v - bits_to_f32(hi[c]));
  }
}

__device__ __forceinline__ float act_of(float x, int32_t act) {
  if (act == 0) return x / (1.0f + expf(-x));
  const float k = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

__global__ void act_residual_kernel(ActResidualArgs a) {
  const int64_t total = int64_t(a.n) * a.inter;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / a.inter, c = i % a.inter;
    const float* row = a.gate_up + t * 2 * a.inter;
    const float v = act_of(row[c], a.act) * row[a.inter + c];
    a.lo[i] = f32_to_bits(v - bits_to_f32(a.hi[i]));
  }
}

}  // namespace

void launch_embed_residual(const EmbedResidualArgs& a, cudaStream_t stream) {
  if (a.n <= 0) return;
  embed_residual_kernel<<<grid_of(int64_t(a.n) * a.hidden), kThreads, 0, stream>>>(a);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void launch_norm_residual(const NormResidualArgs& a, cudaStream_t stream) {
  if (a.rows <= 0) return;
  norm_residual_kernel<<<a.rows, kThreads, 0, stream>>>(a);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void launch_act_residual(const ActResidualArgs& a, cudaStream_t stream) {
  if (a.n <= 0) return;
  act_residual_kernel<<<grid_of(int64_t(a.n) * a.inter), kThreads, 0, stream>>>(a);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::cuda
