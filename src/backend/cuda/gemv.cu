// Skinny bf16 GEMM (see kernels.h: launch_gemv_bf16), the decode path at batch 1-2. The
// weights are read once, so the kernel is a stream over W: one warp per weight row, each lane
// loading 16 bytes (8 bf16) per access with several accesses in flight before the first use,
// the few x rows read through the read-only cache (they are shared by every warp), fp32 sums
// reduced across the warp.
#include <cuda_bf16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace strata::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kUnroll = 4;  // 16-byte weight loads in flight per lane

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Dot of 8 bf16 weights with 8 bf16 activations, accumulated into acc.
__device__ __forceinline__ float dot8(const uint4& w, const uint4& x, float acc) {
  const uint32_t wv[4] = {w.x, w.y, w.z, w.w}, xv[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc = fmaf(__uint_as_float(wv[i] << 16), __uint_as_float(xv[i] << 16), acc);
    acc = fmaf(__uint_as_float(wv[i] & 0xffff0000u), __uint_as_float(xv[i] & 0xffff0000u), acc);
  }
  return acc;
}

template <int M, bool kF32Out>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) gemv_kernel(const uint16_t* __restrict__ x,
                                                                   const uint16_t* __restrict__ w, void* y,
                                                                   int64_t n, int64_t k, int32_t prefetch_bytes) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= n) return;
  const int64_t chunks = k / 8;
  const uint4* wr = reinterpret_cast<const uint4*>(w + row * k);
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  // The weights are never written by a kernel: optionally pull the start of the row into L2
  // while the previous kernel (whose output is x) finishes (LaunchTuning), then wait for it.
  const int64_t row_bytes = k * 2;
  for (int64_t b = int64_t(lane) * 128; b < row_bytes && b < prefetch_bytes; b += 32 * 128) {
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(reinterpret_cast<const char*>(wr) + b));
  }
  pdl_wait();
  pdl_launch_dependents();
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  int64_t c = lane;
  for (; c + 32 * (kUnroll - 1) < chunks; c += 32 * kUnroll) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wv[u] = load_stream(wr + c + 32 * u);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int m = 0; m < M; ++m) acc[m] = dot8(wv[u], __ldg(xr + m * chunks + c + 32 * u), acc[m]);
    }
  }
  for (; c < chunks; c += 32) {
    const uint4 wv = load_stream(wr + c);
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = dot8(wv, __ldg(xr + m * chunks + c), acc[m]);
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float v = acc[m];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) {
      if (kF32Out) {
        static_cast<float*>(y)[m * n + row] = v;
      } else {
        static_cast<uint16_t*>(y)[m * n + row] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
      }
    }
  }
}

template <int M>
void launch_m(const uint16_t* x, const uint16_t* w, void* y, bool f32_out, int64_t n, int64_t k, cudaStream_t stream) {
  const unsigned grid = unsigned((n + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const int32_t prefetch = launch_tuning().gemv_prefetch_bytes;
  if (f32_out) {
    launch_pdl(gemv_kernel<M, true>, grid, kWarpsPerBlock * 32, 0, stream, x, w, y, n, k, prefetch);
  } else {
    launch_pdl(gemv_kernel<M, false>, grid, kWarpsPerBlock * 32, 0, stream, x, w, y, n, k, prefetch);
  }
}

}  // namespace

bool gemv_supports(const void* x, const void* w, int64_t m, int64_t k) {
  const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  return m >= 1 && m <= kGemvMaxRows && k % 8 == 0 && aligned(x) && aligned(w);
}

void launch_gemv_bf16(const uint16_t* x, const uint16_t* w, void* y, bool f32_out, int64_t m, int64_t n, int64_t k,
                      cudaStream_t stream) {
  if (m == 0 || n == 0) return;
  switch (m) {
    case 1: launch_m<1>(x, w, y, f32_out, n, k, stream); break;
    case 2: launch_m<2>(x, w, y, f32_out, n, k, stream); break;
    case 3: launch_m<3>(x, w, y, f32_out, n, k, stream); break;
    case 4: launch_m<4>(x, w, y, f32_out, n, k, stream); break;
    default: cuda_fatal(__FILE__, __LINE__, "launch_gemv_bf16", "m = " + std::to_string(m));
  }
}

}  // namespace strata::cuda
