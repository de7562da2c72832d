// Skinny bf16 GEMM (see kernels.h: launch_gemv), the decode path at batch 1-4. The weights are
// read once, so the kernel is a stream over W: one warp per weight row (two rows, gate and up,
// for the gated-activation output), each lane loading 16 bytes (8 bf16) per access with
// several accesses in flight before the first use, the few x rows read through the read-only
// cache (they are shared by every warp), fp32 sums reduced across the warp. The fused modes
// move the small kernels of a decode layer into the GEMVs around them: the RMSNorm scale of
// the input (from per-block partial sums of squares left by the previous GEMV), the residual
// add, the next norm's weight and its sums of squares in the epilogue, the gated activation.
// Optionally (GemvArgs::warps_per_row) two warps share a row, each half of k: twice the blocks
// for a grid of a wave and a half. FP8 weights (GemvArgs::w_scale): 16 codes per 16-byte load,
// widened to f32 in registers (cvt e4m3x2 -> f16x2), each chunk's dot scaled by its block's
// scale: half the bytes of the bf16 stream.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace strata::cuda {
namespace {

constexpr int kWarpsPerBlock = kGemvRowsPerBlock;

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Pulls [p, p + bytes) into L2 without waiting (Hopper bulk prefetch): p 16-byte aligned,
// bytes a multiple of 16.
__device__ __forceinline__ void l2_prefetch(const void* p, int64_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(uint32_t(bytes)) : "memory");
#endif
}

// One f32 written by the previous kernel, through L2 (issued in order with the weight loads,
// so it is in flight during the dot that follows).
__device__ __forceinline__ float load_l2(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];\n" : "=f"(v) : "l"(p));
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

// Dot of 16 e4m3 weight codes with 16 bf16 activations (x0: the first 8, x1: the next 8).
__device__ __forceinline__ float dot16_fp8(const uint4& w, const uint4& x0, const uint4& x1) {
  const uint32_t wv[4] = {w.x, w.y, w.z, w.w};
  const uint32_t xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 lo = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(wv[i] & 0xffffu), __NV_E4M3)));
    const float2 hi = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(wv[i] >> 16), __NV_E4M3)));
    acc = fmaf(lo.x, __uint_as_float(xv[2 * i] << 16), acc);
    acc = fmaf(lo.y, __uint_as_float(xv[2 * i] & 0xffff0000u), acc);
    acc = fmaf(hi.x, __uint_as_float(xv[2 * i + 1] << 16), acc);
    acc = fmaf(hi.y, __uint_as_float(xv[2 * i + 1] & 0xffff0000u), acc);
  }
  return acc;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float act_fn(float x, Act act) {
  if (act == Act::kSilu) return x / (1.0f + expf(-x));
  const float k = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

// One step of a lane over U chunks (c, c + 32, ...): S weight rows per warp (1, or 2 for gate
// and up), M activation rows; all U * S weight loads are issued before the first use.
template <int S, int U>
__device__ __forceinline__ void load_step(const uint4* const (&wr)[S], int64_t c, uint4 (&wv)[S][U]) {
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int u = 0; u < U; ++u) wv[s][u] = load_stream(wr[s] + c + 32 * u);
}

// The arithmetic of one step on weights already loaded (wv from load_step at chunk c). W8:
// chunk c holds 16 FP8 codes (activation chunks 2c and 2c + 1), scaled by sr[s][c / 8] (its
// 128-column block in the row's scale row).
template <int M, int S, int U, bool W8>
__device__ __forceinline__ void use_step(const uint4 (&wv)[S][U], const uint4* xr, int64_t x_stride, int64_t c,
                                         const float* const (&sr)[S], float (&acc)[S][M]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if constexpr (W8) {
      const int64_t cc = c + 32 * u;
      float sc[S];
#pragma unroll
      for (int s = 0; s < S; ++s) sc[s] = __ldg(sr[s] + (cc >> 3));
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const uint4 x0 = __ldg(xr + m * x_stride + 2 * cc), x1 = __ldg(xr + m * x_stride + 2 * cc + 1);
#pragma unroll
        for (int s = 0; s < S; ++s) acc[s][m] = fmaf(dot16_fp8(wv[s][u], x0, x1), sc[s], acc[s][m]);
      }
    } else {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const uint4 xv = __ldg(xr + m * x_stride + c + 32 * u);
#pragma unroll
        for (int s = 0; s < S; ++s) acc[s][m] = dot8(wv[s][u], xv, acc[s][m]);
      }
    }
  }
}

template <int M, int S, int U, bool W8>
__device__ __forceinline__ void dot_step(const uint4* const (&wr)[S], const uint4* xr, int64_t x_stride, int64_t c,
                                         const float* const (&sr)[S], float (&acc)[S][M]) {
  uint4 wv[S][U];
  load_step<S, U>(wr, c, wv);
  use_step<M, S, U, W8>(wv, xr, x_stride, c, sr, acc);
}

// Steps of U chunks while they fit, then halving steps for the tail (no single-load loop over
// a long remainder).
template <int M, int S, int U, bool W8>
__device__ __forceinline__ void dot_span(const uint4* const (&wr)[S], const uint4* xr, int64_t x_stride, int64_t chunks,
                                         const float* const (&sr)[S], int64_t& c, float (&acc)[S][M]) {
  for (; c + 32 * (U - 1) < chunks; c += 32 * U) dot_step<M, S, U, W8>(wr, xr, x_stride, c, sr, acc);
  if constexpr (U > 1) dot_span<M, S, U / 2, W8>(wr, xr, x_stride, chunks, sr, c, acc);
}

// The warp's S dot products for M activation rows over the whole of k, reduced across lanes;
// with `first` the weights of the step at chunk `lane` are already in registers (loaded before
// the wait).
template <int M, int S, int U, bool W8>
__device__ __forceinline__ void dot_rows(const uint4* const (&wr)[S], const uint4* xr, int64_t x_stride, int64_t chunks, int lane,
                                         const uint4 (&first_w)[S][U], bool first, const float* const (&sr)[S],
                                         float (&acc)[S][M]) {
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[s][m] = 0.0f;
  int64_t c = lane;
  if (first) {
    use_step<M, S, U, W8>(first_w, xr, x_stride, c, sr, acc);
    c += 32 * U;
  }
  dot_span<M, S, U, W8>(wr, xr, x_stride, chunks, sr, c, acc);
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[s][m] = warp_sum(acc[s][m]);
}

// KS warps per weight row (GemvArgs::warps_per_row), warp `kpart` of them taking the kpart-th
// k / KS of the row; their sums meet in shared memory (part 0 + part 1, the same order always).
template <int M, int kIn, int kOut, int U, int KS, bool W8>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) gemv_kernel(GemvArgs a, int32_t prefetch_bytes, int32_t preload,
                                                                        int32_t norm_block) {
  constexpr int S = kOut == int(GemvOut::kGatedAct) ? 2 : 1;
  constexpr int kRows = kWarpsPerBlock / KS;  // weight rows per block
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kpart = warp % KS;
  const int64_t row = int64_t(blockIdx.x) * kRows + warp / KS;
  const int64_t n = a.n, k = a.k;
  const bool active = row < n;
  const int64_t x_stride = k / 8;         // 16-byte chunks per activation row
  const int64_t row_bytes = W8 ? k : 2 * k;
  const int64_t chunks = row_bytes / 16 / KS;  // this warp's chunks of its row
  const char* wbase = reinterpret_cast<const char*>(a.w);
  const uint4* wr[S];
  const float* sr[S];
#pragma unroll
  for (int s = 0; s < S; ++s) {
    wr[s] = reinterpret_cast<const uint4*>(wbase + (row + s * n) * row_bytes) + kpart * chunks;
    sr[s] = W8 && active ? a.w_scale + ((row + s * n) / 128) * a.w_scale_ld : nullptr;
  }
  // The first step's weights (the whole row when k <= 256 U) go into registers before the
  // wait: a block that became resident under the previous kernel's tail has its stream in
  // flight by the time x is ready (LaunchTuning::gemv_preload).
  uint4 first_w[S][U];
  const bool first = preload != 0 && active && lane + 32 * (U - 1) < chunks;
  if (first) load_step<S, U>(wr, lane, first_w);
  // The weights are never written by a kernel: optionally pull more of them into L2 while the
  // previous kernel (whose output is x) finishes, then wait for it. Own rows: the bytes past
  // the preloaded step, up to pf; with prefetch_spread, blocks of the first half also pull the
  // rows of the block half a grid later whole (blocks resident early are the low ones; the high
  // ones may wait for room). One bulk prefetch per row and range (cp.async.bulk, no registers).
  const int64_t pf = a.prefetch_bytes > 0 ? a.prefetch_bytes : prefetch_bytes;
  if (pf > 0 && lane < 2 * S) {
    const int half = int(gridDim.x + 1) / 2;
    const int s = lane % S, h = lane / S;
    const int64_t r = h == 0 ? row : (a.prefetch_spread && int(blockIdx.x) < half ? row + int64_t(half) * kRows : n);
    const int64_t from = h == 0 && first ? int64_t(32 * U * 16) : 0;
    const int64_t to = (pf < row_bytes ? pf : row_bytes) & ~int64_t(15);
    if (r < n && to > from) l2_prefetch(wbase + (r + s * n) * row_bytes + from, to - from);
  }
  // A later kernel's weights (GemvArgs::ahead), this block's slice of each range.
  if (a.ahead_bytes > 0 && lane == 0 && warp < 2 && a.ahead[warp] != nullptr) {
    const int64_t slice = ((a.ahead_bytes + gridDim.x - 1) / gridDim.x + 15) & ~int64_t(15);
    const int64_t from = slice * blockIdx.x;
    const int64_t to = from + slice < a.ahead_bytes ? from + slice : a.ahead_bytes;
    if (to > from) l2_prefetch(static_cast<const char*>(a.ahead[warp]) + from, to - from);
  }
  pdl_wait();
  pdl_launch_dependents();
  // kNormScaled with norm_block (LaunchTuning::gemv_norm_block): the block's threads share the
  // partial sums of squares (at most kSsPerThread each), loaded now so that their L2 round trip
  // overlaps the dot, and the block sums them once; otherwise every warp reads all of them
  // after its dot.
  constexpr int kSsPerThread = 2;
  const bool ss_block = kIn == int(GemvIn::kNormScaled) && norm_block != 0 &&
                        a.in_ss_parts <= kSsPerThread * kWarpsPerBlock * 32;
  float ss_v[M][kSsPerThread];
  if (kIn == int(GemvIn::kNormScaled) && ss_block) {
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int i = 0; i < kSsPerThread; ++i) {
        const int j = int(threadIdx.x) + i * kWarpsPerBlock * 32;
        ss_v[m][i] = j < a.in_ss_parts ? load_l2(a.in_ss + m * a.in_ss_parts + j) : 0.0f;
      }
  }
  float acc[S][M];
  if (active) {
    dot_rows<M, S, U, W8>(wr, reinterpret_cast<const uint4*>(a.x) + kpart * chunks, x_stride, chunks, lane, first_w, first,
                          sr, acc);
  }
  if constexpr (KS > 1) {
    __shared__ float split_acc[kWarpsPerBlock][S][M];
    if (lane == 0) {
#pragma unroll
      for (int s = 0; s < S; ++s)
#pragma unroll
        for (int m = 0; m < M; ++m) split_acc[warp][s][m] = active ? acc[s][m] : 0.0f;
    }
    __syncthreads();
    if (kpart == 0) {
#pragma unroll
      for (int s = 0; s < S; ++s)
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float sum = split_acc[warp][s][m];
#pragma unroll
          for (int j = 1; j < KS; ++j) sum += split_acc[warp + j][s][m];
          acc[s][m] = sum;
        }
    }
  }
  if (kIn == int(GemvIn::kNormScaled)) {
    // The parts are summed in the same order in every warp and block: the scale is identical
    // across warps and blocks, and across runs.
    if (ss_block) {
      __shared__ float ss_warp[kWarpsPerBlock][M];
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < kSsPerThread; ++i) ss += ss_v[m][i];
        ss = warp_sum(ss);
        if (lane == 0) ss_warp[warp][m] = ss;
      }
      __syncthreads();
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < kWarpsPerBlock; ++i) ss += ss_warp[i][m];
        const float inv = rsqrtf(ss / float(k) + a.in_eps);
#pragma unroll
        for (int s = 0; s < S; ++s) acc[s][m] *= inv;
      }
    } else {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float ss = 0.0f;
        for (int j = lane; j < a.in_ss_parts; j += 32) ss += a.in_ss[m * a.in_ss_parts + j];
        const float inv = rsqrtf(warp_sum(ss) / float(k) + a.in_eps);
#pragma unroll
        for (int s = 0; s < S; ++s) acc[s][m] *= inv;
      }
    }
  }
  if (kOut == int(GemvOut::kResidual)) {
    __shared__ float part[kWarpsPerBlock][M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float sq = 0.0f;
      if (active && lane == 0) {
        float* xres = static_cast<float*>(a.y) + m * n + row;
        const float v = *xres + acc[0][m] + (a.bias ? a.bias[row] : 0.0f);
        *xres = v;
        if (a.norm_out) {
          const float w = a.norm_w[row];
          a.norm_out[m * n + row] = __bfloat16_as_ushort(__float2bfloat16_rn(v * (a.norm_one_plus_w ? 1.0f + w : w)));
        }
        sq = v * v;
      }
      if (lane == 0) part[warp][m] = sq;
    }
    if (a.ss_out) {
      __syncthreads();
      if (threadIdx.x < M) {
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < kWarpsPerBlock; ++i) s += part[i][threadIdx.x];
        a.ss_out[threadIdx.x * gridDim.x + blockIdx.x] = s;
      }
    }
    return;
  }
  if (!active || lane != 0 || kpart != 0) return;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    if (kOut == int(GemvOut::kF32)) {
      static_cast<float*>(a.y)[m * n + row] = acc[0][m];
    } else if (kOut == int(GemvOut::kBF16)) {
      static_cast<uint16_t*>(a.y)[m * n + row] = __bfloat16_as_ushort(__float2bfloat16_rn(acc[0][m]));
    } else {
      const float v = act_fn(acc[0][m], a.act) * acc[S - 1][m];
      static_cast<uint16_t*>(a.y)[m * n + row] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    }
  }
}

template <int M, int kIn, int kOut, int U, bool W8>
void launch_unrolled(const GemvArgs& a, const LaunchTuning& t, cudaStream_t stream) {
  // Two warps per row only where the epilogue is one plain store (kF32), bf16 weights.
  if constexpr (kOut == int(GemvOut::kF32) && !W8) {
    if (a.warps_per_row == 2 && a.k % 16 == 0) {
      const unsigned grid = unsigned((a.n + kWarpsPerBlock / 2 - 1) / (kWarpsPerBlock / 2));
      launch_pdl(gemv_kernel<M, kIn, kOut, U, 2, W8>, grid, kWarpsPerBlock * 32, 0, stream, a, t.gemv_prefetch_bytes,
                 int32_t(t.gemv_preload), int32_t(t.gemv_norm_block));
      return;
    }
  }
  const unsigned grid = unsigned((a.n + kWarpsPerBlock - 1) / kWarpsPerBlock);
  launch_pdl(gemv_kernel<M, kIn, kOut, U, 1, W8>, grid, kWarpsPerBlock * 32, 0, stream, a, t.gemv_prefetch_bytes,
             int32_t(t.gemv_preload), int32_t(t.gemv_norm_block));
}

template <int M, int kIn, int kOut>
void launch_mode(const GemvArgs& a, cudaStream_t stream) {
  const LaunchTuning t = launch_tuning();
  const int32_t unroll = kOut == int(GemvOut::kGatedAct) && t.gemv_gated_unroll > 0 ? t.gemv_gated_unroll : t.gemv_unroll;
  if (a.w_scale != nullptr) {
    const int32_t u8 = kOut == int(GemvOut::kGatedAct) ? t.gemv_fp8_unroll / 2 : t.gemv_fp8_unroll;
    if constexpr (M == 1) {
      if (u8 >= 16) {
        launch_unrolled<M, kIn, kOut, 16, true>(a, t, stream);
        return;
      }
    }
    if (u8 >= 8) {
      launch_unrolled<M, kIn, kOut, 8, true>(a, t, stream);
    } else {
      launch_unrolled<M, kIn, kOut, 4, true>(a, t, stream);
    }
    return;
  }
  if constexpr (M == 1) {
    if (unroll >= 16) {
      launch_unrolled<M, kIn, kOut, 16, false>(a, t, stream);
      return;
    }
  }
  if (unroll >= 8) {
    launch_unrolled<M, kIn, kOut, 8, false>(a, t, stream);
  } else {
    launch_unrolled<M, kIn, kOut, 4, false>(a, t, stream);
  }
}

template <int M, int kIn>
void launch_out(const GemvArgs& a, cudaStream_t stream) {
  switch (a.out) {
    case GemvOut::kF32: launch_mode<M, kIn, int(GemvOut::kF32)>(a, stream); break;
    case GemvOut::kBF16: launch_mode<M, kIn, int(GemvOut::kBF16)>(a, stream); break;
    case GemvOut::kResidual: launch_mode<M, kIn, int(GemvOut::kResidual)>(a, stream); break;
    case GemvOut::kGatedAct: launch_mode<M, kIn, int(GemvOut::kGatedAct)>(a, stream); break;
  }
}

template <int M>
void launch_m(const GemvArgs& a, cudaStream_t stream) {
  if (a.in == GemvIn::kNormScaled) {
    launch_out<M, int(GemvIn::kNormScaled)>(a, stream);
  } else {
    launch_out<M, int(GemvIn::kPlain)>(a, stream);
  }
}

}  // namespace

bool gemv_supports(const void* x, const void* w, int64_t m, int64_t k) {
  const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  return m >= 1 && m <= kGemvMaxRows && k % 8 == 0 && aligned(x) && aligned(w);
}

int64_t gemv_blocks(int64_t n) { return (n + kGemvRowsPerBlock - 1) / kGemvRowsPerBlock; }

void launch_gemv(const GemvArgs& a, cudaStream_t stream) {
  if (a.m == 0 || a.n == 0) return;
  if (a.w_scale != nullptr && a.k % 16 != 0) cuda_fatal(__FILE__, __LINE__, "launch_gemv", "FP8 weights need k % 16 == 0, k = " + std::to_string(a.k));
  switch (a.m) {
    case 1: launch_m<1>(a, stream); break;
    case 2: launch_m<2>(a, stream); break;
    case 3: launch_m<3>(a, stream); break;
    case 4: launch_m<4>(a, stream); break;
    default: cuda_fatal(__FILE__, __LINE__, "launch_gemv", "m = " + std::to_string(a.m));
  }
}

void launch_gemv_bf16(const uint16_t* x, const uint16_t* w, void* y, bool f32_out, int64_t m, int64_t n, int64_t k,
                      cudaStream_t stream) {
  GemvArgs a{};
  a.x = x;
  a.w = w;
  a.y = y;
  a.m = m;
  a.n = n;
  a.k = k;
  a.out = f32_out ? GemvOut::kF32 : GemvOut::kBF16;
  launch_gemv(a, stream);
}

}  // namespace strata::cuda
