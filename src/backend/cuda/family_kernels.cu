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

__device__ __forceinline__ uint16_t to_bf16_bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

// One warp per (token, head).
__global__ void head_rms_norm_kernel(HeadRmsNormArgs a) {
  const int warps = kThreads / 32;
  const int64_t item = int64_t(blockIdx.x) * warps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (item >= int64_t(a.n) * a.n_heads) return;
  const int64_t t = item / a.n_heads, h = item % a.n_heads;
  float* v = a.x + t * a.row_stride + a.col0 + h * a.head_dim;
  float ss = 0.0f;
  for (int i = lane; i < a.head_dim; i += 32) ss += v[i] * v[i];
  const float inv = rsqrtf(warp_sum(ss) / float(a.head_dim) + a.eps);
  for (int i = lane; i < a.head_dim; i += 32) v[i] = v[i] * inv * (a.w ? a.w[i] : 1.0f);
}

// One warp per row.
__global__ void ple_combine_kernel(PleCombineArgs a) {
  const int warps = kThreads / 32;
  const int64_t r = int64_t(blockIdx.x) * warps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= a.rows) return;
  float* c = a.ctx + r * a.dim;
  const float* tk = a.tok + r * a.dim;
  float ss = 0.0f;
  for (int i = lane; i < a.dim; i += 32) {
    const float v = c[i] * a.scale;
    ss += v * v;
  }
  const float inv = rsqrtf(warp_sum(ss) / float(a.dim) + a.eps);
  const float mix = 0.70710678118654752f;
  for (int i = lane; i < a.dim; i += 32) c[i] = (c[i] * a.scale * inv * a.w[i] + tk[i]) * mix;
}

__device__ __forceinline__ float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

__global__ void ple_gate_kernel(PleGateArgs a) {
  const int64_t total = int64_t(a.n) * a.dim;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / a.dim, c = i % a.dim;
    const float g = a.gate[i];
    const float act = a.act == 0 ? g / (1.0f + expf(-g)) : gelu_tanh(g);
    a.out[i] = to_bf16_bits(act * a.ple[t * a.ple_stride + c]);
  }
}

__global__ void scaled_residual_kernel(ScaledResidualArgs a) {
  const int r = blockIdx.x;
  float* x = a.x + int64_t(r) * a.dim;
  const float* br = a.branch + int64_t(r) * a.dim;
  float ss = 0.0f;
  for (int c = threadIdx.x; c < a.dim; c += kThreads) ss += br[c] * br[c];
  const float inv_b = rsqrtf(block_sum(ss) / float(a.dim) + a.eps);
  ss = 0.0f;
  for (int c = threadIdx.x; c < a.dim; c += kThreads) {
    const float v = (x[c] + br[c] * inv_b * a.branch_w[c]) * a.scale;
    x[c] = v;
    ss += v * v;
  }
  if (a.out == nullptr) return;
  const float inv = a.w ? rsqrtf(block_sum(ss) / float(a.dim) + a.eps) : 1.0f;
  // Each thread rereads only the elements it wrote itself.
  for (int c = threadIdx.x; c < a.dim; c += kThreads) {
    a.out[int64_t(r) * a.dim + c] = to_bf16_bits(a.w ? x[c] * inv * a.w[c] : x[c]);
  }
}

__global__ void norm_sum_kernel(NormSumArgs a) {
  const int r = blockIdx.x;
  const float* pa = a.a + int64_t(r) * a.dim;
  const float* pb = a.b + int64_t(r) * a.dim;
  float sa = 0.0f, sb = 0.0f;
  for (int c = threadIdx.x; c < a.dim; c += kThreads) {
    sa += pa[c] * pa[c];
    sb += pb[c] * pb[c];
  }
  const float inv_a = rsqrtf(block_sum(sa) / float(a.dim) + a.eps);
  const float inv_b = rsqrtf(block_sum(sb) / float(a.dim) + a.eps);
  // out may alias a: each thread writes only the elements it read.
  for (int c = threadIdx.x; c < a.dim; c += kThreads) {
    a.out[int64_t(r) * a.dim + c] = pa[c] * inv_a * a.wa[c] + pb[c] * inv_b * a.wb[c];
  }
}

__global__ void to_bf16_kernel(const float* x, uint16_t* out, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = to_bf16_bits(x[i]);
  }
}

unsigned grid_of(int64_t n) { return unsigned(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 4096)); }

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

void launch_head_rms_norm(const HeadRmsNormArgs& a, cudaStream_t stream) {
  const int64_t items = int64_t(a.n) * a.n_heads;
  if (items <= 0) return;
  head_rms_norm_kernel<<<unsigned((items + kThreads / 32 - 1) / (kThreads / 32)), kThreads, 0, stream>>>(a);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void launch_ple_combine(const PleCombineArgs& a, cudaStream_t stream) {
  if (a.rows <= 0) return;
  ple_combine_kernel<<<unsigned((int64_t(a.rows) + kThreads / 32 - 1) / (kThreads / 32)), kThreads, 0, stream>>>(a);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void launch_ple_gate(const PleGateArgs& a, cudaStream_t stream) {
  if (a.n <= 0 || a.dim <= 0) return;
  ple_gate_kernel<<<grid_of(int64_t(a.n) * a.dim), kThreads, 0, stream>>>(a);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void launch_scaled_residual(const ScaledResidualArgs& a, cudaStream_t stream) {
  if (a.rows <= 0) return;
  scaled_residual_kernel<<<a.rows, kThreads, 0, stream>>>(a);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void launch_norm_sum(const NormSumArgs& a, cudaStream_t stream) {
  if (a.rows <= 0) return;
  norm_sum_kernel<<<a.rows, kThreads, 0, stream>>>(a);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void launch_to_bf16(const float* x, uint16_t* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  to_bf16_kernel<<<grid_of(n), kThreads, 0, stream>>>(x, out, n);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::cuda
