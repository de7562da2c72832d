// FP8 quantization (fp8.h).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/fp8.h"

namespace strata::cuda {
namespace {

__device__ __forceinline__ float bf16_at(const uint16_t* p, int64_t i) { return __uint_as_float(uint32_t(p[i]) << 16); }

__device__ __forceinline__ uint8_t to_e4m3(float v) {
  return uint8_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float block_max(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < int(blockDim.x >> 5) ? shared[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) shared[0] = v;
  }
  __syncthreads();
  return shared[0];
}

// One block of 256 threads per 128x128 weight block.
__global__ void quantize_blocks_kernel(const uint16_t* w, uint8_t* codes, float* scales, int64_t n, int64_t k) {
  __shared__ float red[8];
  const int64_t r0 = int64_t(blockIdx.y) * kFp8Block, c0 = int64_t(blockIdx.x) * kFp8Block;
  float amax = 0.0f;
  for (int i = int(threadIdx.x); i < kFp8Block * kFp8Block; i += int(blockDim.x)) {
    const int64_t r = r0 + i / kFp8Block, c = c0 + i % kFp8Block;
    if (r < n && c < k) amax = fmaxf(amax, fabsf(bf16_at(w, r * k + c)));
  }
  amax = block_max(amax, red);
  const float scale = amax > 0.0f ? amax / kFp8Max : 1.0f;
  if (threadIdx.x == 0) scales[int64_t(blockIdx.y) * gridDim.x + blockIdx.x] = scale;
  for (int i = int(threadIdx.x); i < kFp8Block * kFp8Block; i += int(blockDim.x)) {
    const int64_t r = r0 + i / kFp8Block, c = c0 + i % kFp8Block;
    if (r < n && c < k) codes[r * k + c] = to_e4m3(bf16_at(w, r * k + c) / scale);
  }
}

// One warp per (row, group): each lane 4 of the group's 128 columns.
__global__ void quantize_rows_kernel(const uint16_t* x, uint8_t* codes, float* scales, int64_t m, int64_t k,
                                     int64_t row_stride, int64_t group_stride) {
  const int64_t groups = (k + kFp8Block - 1) / kFp8Block;
  const int64_t item = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = int(threadIdx.x) & 31;
  if (item >= m * groups) return;
  const int64_t r = item / groups, g = item % groups;
  const int64_t c = g * kFp8Block + lane * 4;
  float v[4];
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    v[j] = c + j < k ? bf16_at(x, r * k + c + j) : 0.0f;
    amax = fmaxf(amax, fabsf(v[j]));
  }
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float scale = fmaxf(amax, 1e-10f) / kFp8Max;
  if (lane == 0) scales[r * row_stride + g * group_stride] = scale;
  const float inv = 1.0f / scale;
  if (c + 3 < k) {
    const uint32_t packed = uint32_t(to_e4m3(v[0] * inv)) | uint32_t(to_e4m3(v[1] * inv)) << 8 |
                            uint32_t(to_e4m3(v[2] * inv)) << 16 | uint32_t(to_e4m3(v[3] * inv)) << 24;
    *reinterpret_cast<uint32_t*>(codes + r * k + c) = packed;
  } else {
    for (int j = 0; j < 4 && c + j < k; ++j) codes[r * k + c + j] = to_e4m3(v[j] * inv);
  }
}

}  // namespace

void launch_quantize_fp8_blocks(const uint16_t* w, uint8_t* codes, float* scales, int64_t n, int64_t k,
                                cudaStream_t stream) {
  if (n == 0 || k == 0) return;
  const dim3 grid(unsigned(fp8_blocks(k)), unsigned(fp8_blocks(n)));
  quantize_blocks_kernel<<<grid, 256, 0, stream>>>(w, codes, scales, n, k);
  STRATA_CUDA_CHECK_LAUNCH();
}

void launch_quantize_fp8_rows(const uint16_t* x, uint8_t* codes, float* scales, int64_t m, int64_t k,
                              int64_t row_stride, int64_t group_stride, cudaStream_t stream) {
  if (m == 0 || k == 0) return;
  const int64_t warps = m * fp8_blocks(k);
  quantize_rows_kernel<<<unsigned((warps * 32 + 255) / 256), 256, 0, stream>>>(x, codes, scales, m, k, row_stride,
                                                                               group_stride);
  STRATA_CUDA_CHECK_LAUNCH();
}

}  // namespace strata::cuda
