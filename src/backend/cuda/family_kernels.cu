// Family kernels (see family_kernels.h). Launched plainly (no programmatic dependent launch):
// each starts after the kernel before it has finished.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/family_kernels.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (kThreads threads).
__device__ float block_sum(float v) {
  __shared__ float part[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // part may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  float t = lane < kThreads / 32 ? part[lane] : 0.0f;
  return warp_sum(t);
}

__global__ void sandwich_add_norm_kernel(SandwichAddNormArgs a) {
  const int r = blockIdx.x;
  float* x = a.x + int64_t(r) * a.dim;
  const float* br = a.branch + int64_t(r) * a.dim;
  float ss = 0.0f;
  for (int c = threadIdx.x; c < a.dim; c += kThreads) {
    const float b = br[c] + (a.branch_bias ? a.branch_bias[c] : 0.0f);
    ss += b * b;
  }
  const float inv_b = rsqrtf(block_sum(ss) / float(a.dim) + a.eps);
  ss = 0.0f;
  for (int c = threadIdx.x; c < a.dim; c += kThreads) {
    const float b = br[c] + (a.branch_bias ? a.branch_bias[c] : 0.0f);
    const float wb = a.one_plus_w ? 1.0f + a.branch_w[c] : a.branch_w[c];
    const float v = x[c] + b * inv_b * wb;
    x[c] = v;
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss) / float(a.dim) + a.eps);
  // Each thread rereads only the elements it wrote itself.
  for (int c = threadIdx.x; c < a.dim; c += kThreads) {
    const float w = a.one_plus_w ? 1.0f + a.w[c] : a.w[c];
    a.out[int64_t(r) * a.dim + c] = __bfloat16_as_ushort(__float2bfloat16_rn(x[c] * inv * w));
  }
}

__global__ void softcap_kernel(float* v, int64_t n, float cap) {
  const float inv = 1.0f / cap;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    v[i] = cap * tanhf(v[i] * inv);
  }
}

}  // namespace

void launch_sandwich_add_norm(const SandwichAddNormArgs& a, cudaStream_t stream) {
  if (a.rows <= 0) return;
  sandwich_add_norm_kernel<<<a.rows, kThreads, 0, stream>>>(a);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void launch_softcap(float* v, int64_t n, float cap, cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 4096);
  softcap_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(v, n, cap);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::cuda
