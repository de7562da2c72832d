// Mixture-of-experts kernels (see moe.h). Plain CUDA-core code, written for correctness and
// for any shape; launched plainly (no programmatic dependent launch). The tensor-core grouped
// GEMM that prefill steps take is in moe_mma.cu; the tiled kernel here is its reference.
#include <cuda_bf16.h>

#include <cfloat>
#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/moe.h"

namespace strata::cuda {
namespace {

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

// One thread per token. The softmax terms are recomputed per top-k pass instead of stored
// (a thread has no room for E of them); the same expression gives the same bits each time.
__global__ void moe_route_kernel(MoeRouteArgs a) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= a.n) return;
  const float* l = a.logits + int64_t(t) * a.n_experts;
  float mx = l[0];
  for (int e = 1; e < a.n_experts; ++e) mx = fmaxf(mx, l[e]);
  float sum = 0.0f;
  for (int e = 0; e < a.n_experts; ++e) sum += expf(l[e] - mx);
  float prev_p = FLT_MAX, top_sum = 0.0f;
  int prev_e = -1;
  int32_t* ids = a.ids + int64_t(t) * a.k;
  float* w = a.weights + int64_t(t) * a.k;
  // Order: p descending, then id ascending; pass j takes the first expert after pass j - 1's.
  for (int j = 0; j < a.k; ++j) {
    int best = -1;
    float bp = -1.0f;
    for (int e = 0; e < a.n_experts; ++e) {
      const float p = expf(l[e] - mx) / sum;
      const bool after = p < prev_p || (p == prev_p && e > prev_e);
      if (after && (best < 0 || p > bp)) {
        best = e;
        bp = p;
      }
    }
    ids[j] = best;
    w[j] = bp;
    top_sum += bp;
    prev_p = bp;
    prev_e = best;
  }
  for (int j = 0; j < a.k; ++j) {
    float v = a.renormalize ? w[j] / top_sum : w[j];
    if (a.expert_scale != nullptr) v *= a.expert_scale[ids[j]];
    w[j] = v;
  }
}

// The same routing with a warp per token, for n_experts <= 32 * kRoutePerLane: lane l holds the
// logits of experts l, l + 32, ...; max, sum and each of the k arg-max passes are warp
// reductions. The ordering is the reference's (p descending, then id ascending) on the same
// p = expf(l - max) / sum; only the sum's association differs.
constexpr int kRoutePerLane = 8, kRouteWarps = 4;

__global__ void __launch_bounds__(kRouteWarps * 32) moe_route_warp_kernel(MoeRouteArgs a) {
  const int lane = threadIdx.x & 31;
  const int t = blockIdx.x * kRouteWarps + int(threadIdx.x >> 5);
  if (t >= a.n) return;
  const float* l = a.logits + int64_t(t) * a.n_experts;
  float v[kRoutePerLane];
  float mx = -FLT_MAX;
#pragma unroll
  for (int i = 0; i < kRoutePerLane; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < a.n_experts ? l[e] : -FLT_MAX;
    mx = fmaxf(mx, v[i]);
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kRoutePerLane; ++i) {
    v[i] = lane + 32 * i < a.n_experts ? expf(v[i] - mx) : 0.0f;
    sum += v[i];
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  // Taken and absent experts hold -1, below every p.
#pragma unroll
  for (int i = 0; i < kRoutePerLane; ++i) v[i] = lane + 32 * i < a.n_experts ? v[i] / sum : -1.0f;
  int32_t my_id = 0;
  float my_w = 0.0f, top_sum = 0.0f;
  for (int j = 0; j < a.k; ++j) {
    // The lane's best: the first (lowest id) of its largest p.
    float bp = v[0];
    int bi = 0;
#pragma unroll
    for (int i = 1; i < kRoutePerLane; ++i) {
      if (v[i] > bp) {
        bp = v[i];
        bi = i;
      }
    }
    int be = lane + 32 * bi;
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
      const float op = __shfl_xor_sync(0xffffffffu, bp, off);
      const int oe = __shfl_xor_sync(0xffffffffu, be, off);
      if (op > bp || (op == bp && oe < be)) {
        bp = op;
        be = oe;
      }
    }
#pragma unroll
    for (int i = 0; i < kRoutePerLane; ++i) {
      if (lane + 32 * i == be) v[i] = -1.0f;
    }
    if (lane == j) {
      my_id = be;
      my_w = bp;
    }
    top_sum += bp;
  }
  // Lane j < k owns choice j (k <= 32 here).
  if (lane < a.k) {
    float w = a.renormalize ? my_w / top_sum : my_w;
    if (a.expert_scale != nullptr) w *= a.expert_scale[my_id];
    a.ids[int64_t(t) * a.k + lane] = my_id;
    a.weights[int64_t(t) * a.k + lane] = w;
  }
}

constexpr int kGroupThreads = 1024;

__global__ void moe_group_kernel(MoeGroupArgs a) {
  extern __shared__ int32_t counters[];  // [2 * n_experts]: counts, then cursors
  int32_t* cnt = counters;
  int32_t* cur = counters + a.n_experts;
  for (int e = threadIdx.x; e < a.n_experts; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < a.n_slots; i += blockDim.x) atomicAdd(&cnt[a.ids[i]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t run = 0;
    for (int e = 0; e < a.n_experts; ++e) {
      a.offsets[e] = run;
      cur[e] = run;
      run += cnt[e];
    }
    a.offsets[a.n_experts] = run;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < a.n_slots; i += blockDim.x) {
    const int32_t r = atomicAdd(&cur[a.ids[i]], 1);
    a.sorted_slot[r] = i;
    a.slot_row[i] = r;
  }
}

// Tiles of kBM sorted rows x kBN outputs, kBK of the reduction at a time; 256 threads, 4 x 4
// outputs each.
constexpr int kBM = 64, kBN = 64, kBK = 32, kGemmThreads = 256;

__global__ void __launch_bounds__(kGemmThreads) grouped_gemm_kernel(GroupedGemmArgs a) {
  __shared__ float as[kBK][kBM + 1];
  __shared__ float bs[kBK][kBN + 1];
  __shared__ int64_t src[kBM];
  const int e = blockIdx.z;
  const int32_t r_end = a.offsets[e + 1];
  const int32_t m0 = a.offsets[e] + int32_t(blockIdx.y) * kBM;
  if (m0 >= r_end) return;
  const int64_t n0 = int64_t(blockIdx.x) * kBN;
  const int tid = threadIdx.x;
  if (tid < kBM) {
    const int32_t r = m0 + tid;
    src[tid] = r < r_end ? (a.row_src != nullptr ? int64_t(a.row_src[r] / a.row_src_div) : int64_t(r)) : -1;
  }
  const uint16_t* w = a.w + int64_t(e) * a.n * a.k;
  const uint16_t* w_lo = a.w_lo != nullptr ? a.w_lo + int64_t(e) * a.n * a.k : nullptr;
  const int tx = tid % 16, ty = tid / 16;  // outputs: rows ty * 4 + i, columns tx * 4 + j
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < a.k; k0 += kBK) {
    __syncthreads();  // the previous tile is consumed (and src is written)
    for (int i = tid; i < kBM * kBK; i += kGemmThreads) {
      const int row = i / kBK, kk = i % kBK;
      const int64_t s = src[row], kg = k0 + kk;
      float v = 0.0f;
      if (s >= 0 && kg < a.k) {
        v = bf16_bits_to_f32(a.x[s * a.k + kg]);
        if (a.x_lo != nullptr) v += bf16_bits_to_f32(a.x_lo[s * a.k + kg]);
      }
      as[kk][row] = v;
    }
    for (int i = tid; i < kBN * kBK; i += kGemmThreads) {
      const int col = i / kBK, kk = i % kBK;
      const int64_t ng = n0 + col, kg = k0 + kk;
      float v = 0.0f;
      if (ng < a.n && kg < a.k) {
        v = bf16_bits_to_f32(w[ng * a.k + kg]);
        if (w_lo != nullptr) v += bf16_bits_to_f32(w_lo[ng * a.k + kg]);
      }
      bs[kk][col] = v;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kBK; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = as[kk][ty * 4 + i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = bs[kk][tx * 4 + j];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int32_t r = m0 + ty * 4 + i;
    if (r >= r_end) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t c = n0 + tx * 4 + j;
      if (c >= a.n) continue;
      if (a.out_f32) {
        static_cast<float*>(a.y)[int64_t(r) * a.n + c] = acc[i][j];
      } else {
        static_cast<uint16_t*>(a.y)[int64_t(r) * a.n + c] = __bfloat16_as_ushort(__float2bfloat16_rn(acc[i][j]));
      }
    }
  }
}

// Few rows per expert (decode): the step reads each active expert's weights once, so the
// kernel is a grouped GEMV that streams them at full width. A warp owns kGemvCols output
// columns; its lanes stride the reduction 8 bf16 (16 bytes) at a time and every x value loaded
// serves all kGemvCols columns. Rows are taken kGemvRows at a time (a group past that reads
// its columns again, from L2). Needs k % 8 == 0 and 16-byte aligned x and w; no lo parts.
constexpr int kGemvCols = 4, kGemvRows = 8, kGemvWarps = 8;

__device__ __forceinline__ void bf16x8_to_f32(const uint4& v, float* out) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);
    out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

__global__ void __launch_bounds__(kGemvWarps * 32) grouped_gemv_kernel(GroupedGemmArgs a) {
  const int e = blockIdx.y;
  const int32_t r_begin = a.offsets[e], r_end = a.offsets[e + 1];
  if (r_begin >= r_end) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t c0 = (int64_t(blockIdx.x) * kGemvWarps + warp) * kGemvCols;
  if (c0 >= a.n) return;
  const uint16_t* w = a.w + int64_t(e) * a.n * a.k;
  const int64_t k8 = a.k / 8;
  for (int32_t rb = r_begin; rb < r_end; rb += kGemvRows) {
    const int nr = min(kGemvRows, r_end - rb);
    int64_t src[kGemvRows];
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) {
      const int32_t row = rb + min(r, nr - 1);
      src[r] = a.row_src != nullptr ? int64_t(a.row_src[row] / a.row_src_div) : int64_t(row);
    }
    float acc[kGemvRows][kGemvCols] = {};
    for (int64_t q = lane; q < k8; q += 32) {
      float wf[kGemvCols][8];
#pragma unroll
      for (int c = 0; c < kGemvCols; ++c) {
        const int64_t col = min(c0 + c, a.n - 1);
        bf16x8_to_f32(__ldg(reinterpret_cast<const uint4*>(w + col * a.k) + q), wf[c]);
      }
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r) {
        if (r >= nr) break;
        float xf[8];
        bf16x8_to_f32(__ldg(reinterpret_cast<const uint4*>(a.x + src[r] * a.k) + q), xf);
#pragma unroll
        for (int c = 0; c < kGemvCols; ++c) {
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r][c] += xf[i] * wf[c][i];
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) {
#pragma unroll
      for (int c = 0; c < kGemvCols; ++c) {
#pragma unroll
        for (int off = 16; off > 0; off /= 2) acc[r][c] += __shfl_xor_sync(0xffffffffu, acc[r][c], off);
      }
    }
    // Lane r * kGemvCols + c writes (row r, column c): every lane holds every sum.
    float mine = 0.0f;
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) {
#pragma unroll
      for (int c = 0; c < kGemvCols; ++c) {
        if (lane == r * kGemvCols + c) mine = acc[r][c];
      }
    }
    const int r = lane / kGemvCols, c = lane % kGemvCols;
    if (r < nr && c0 + c < a.n) {
      const int64_t at = int64_t(rb + r) * a.n + c0 + c;
      if (a.out_f32) {
        static_cast<float*>(a.y)[at] = mine;
      } else {
        static_cast<uint16_t*>(a.y)[at] = __bfloat16_as_ushort(__float2bfloat16_rn(mine));
      }
    }
  }
}
static_assert(kGemvRows * kGemvCols <= 32, "one output per lane");

__global__ void moe_combine_kernel(MoeCombineArgs a) {
  __shared__ int order[64];
  const int t = blockIdx.x;
  const int32_t* ids = a.ids + int64_t(t) * a.k;
  if (threadIdx.x == 0) {
    // Insertion sort of the k slots by expert id.
    for (int j = 0; j < a.k; ++j) {
      int q = j;
      while (q > 0 && ids[order[q - 1]] > ids[j]) {
        order[q] = order[q - 1];
        --q;
      }
      order[q] = j;
    }
  }
  __syncthreads();
  for (int h = threadIdx.x; h < a.hidden; h += blockDim.x) {
    float acc = 0.0f;
    for (int q = 0; q < a.k; ++q) {
      const int j = order[q];
      const int64_t row = a.slot_row[int64_t(t) * a.k + j];
      acc += a.y[row * a.hidden + h] * a.weights[int64_t(t) * a.k + j];
    }
    a.out[int64_t(t) * a.hidden + h] = acc;
  }
}

// The same sums, 4 columns per thread with 16-byte loads, the rows' loads of kCombineBatch
// choices issued before their terms are added (in the same order as above: the same bits).
// Needs hidden % 4 == 0 and 16-byte aligned y and out.
constexpr int kCombineThreads = 128, kCombineBatch = 8;

__global__ void __launch_bounds__(kCombineThreads) moe_combine_vec_kernel(MoeCombineArgs a) {
  __shared__ int64_t row_of[64];
  __shared__ float w_of[64];
  const int t = blockIdx.x;
  const int32_t* ids = a.ids + int64_t(t) * a.k;
  if (threadIdx.x == 0) {
    int order[64];
    for (int j = 0; j < a.k; ++j) {
      int q = j;
      while (q > 0 && ids[order[q - 1]] > ids[j]) {
        order[q] = order[q - 1];
        --q;
      }
      order[q] = j;
    }
    for (int q = 0; q < a.k; ++q) {
      row_of[q] = a.slot_row[int64_t(t) * a.k + order[q]];
      w_of[q] = a.weights[int64_t(t) * a.k + order[q]];
    }
  }
  __syncthreads();
  const int h4 = a.hidden / 4;
  const float4* y = reinterpret_cast<const float4*>(a.y);
  float4* out = reinterpret_cast<float4*>(a.out) + int64_t(t) * h4;
  for (int c = threadIdx.x; c < h4; c += kCombineThreads) {
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int q0 = 0; q0 < a.k; q0 += kCombineBatch) {
      float4 v[kCombineBatch];
#pragma unroll
      for (int i = 0; i < kCombineBatch; ++i) {
        if (q0 + i < a.k) v[i] = __ldg(y + row_of[q0 + i] * h4 + c);
      }
#pragma unroll
      for (int i = 0; i < kCombineBatch; ++i) {
        if (q0 + i >= a.k) break;
        const float w = w_of[q0 + i];
        acc.x += v[i].x * w;
        acc.y += v[i].y * w;
        acc.z += v[i].z * w;
        acc.w += v[i].w * w;
      }
    }
    out[c] = acc;
  }
}

}  // namespace

void launch_moe_route(const MoeRouteArgs& a, cudaStream_t stream) {
  if (a.n <= 0) return;
  if (a.k <= 0 || a.k > a.n_experts) cuda_fatal(__FILE__, __LINE__, "launch_moe_route", "k " + std::to_string(a.k));
  if (!a.reference && a.n_experts <= 32 * kRoutePerLane && a.k <= 32) {
    moe_route_warp_kernel<<<(a.n + kRouteWarps - 1) / kRouteWarps, kRouteWarps * 32, 0, stream>>>(a);
  } else {
    moe_route_kernel<<<(a.n + 127) / 128, 128, 0, stream>>>(a);
  }
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void launch_moe_group(const MoeGroupArgs& a, cudaStream_t stream) {
  if (a.n_experts <= 0 || a.n_experts > 4096) {
    cuda_fatal(__FILE__, __LINE__, "launch_moe_group", "n_experts " + std::to_string(a.n_experts));
  }
  moe_group_kernel<<<1, kGroupThreads, size_t(2 * a.n_experts) * sizeof(int32_t), stream>>>(a);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

namespace {

// Whether the GEMV kernel can take these arguments (any number of rows per expert).
bool grouped_gemv_fits(const GroupedGemmArgs& a) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return a.k % 8 == 0 && aligned(a.x) && aligned(a.w) && a.x_lo == nullptr && a.w_lo == nullptr;
}

}  // namespace

namespace {

// The kernel kAuto (or a.path) stands for on these arguments.
GroupedGemmPath resolve_path(const GroupedGemmArgs& a) {
  // STRATA_MOE_GEMM=tiled makes kAuto take the tiled kernel, =simt the CUDA-core dispatch from
  // before the tensor-core kernel (the GEMV up to 256 rows per expert, else the tiled kernel):
  // benchmarks compare them in one run.
  static const std::string env_path = [] {
    const char* v = std::getenv("STRATA_MOE_GEMM");
    return std::string(v != nullptr ? v : "");
  }();
  if (a.path != GroupedGemmPath::kAuto) return a.path;
  const bool force_tiled = env_path == "tiled", no_mma = env_path == "simt";
  if (force_tiled) return GroupedGemmPath::kTiled;
  if (grouped_gemv_fits(a) && a.rows_per_expert <= (no_mma ? 256 : kGroupedGemvMaxRows)) return GroupedGemmPath::kGemv;
  return !no_mma && grouped_gemm_mma_fits(a) ? GroupedGemmPath::kMma : GroupedGemmPath::kTiled;
}

}  // namespace

void launch_grouped_gemm(const GroupedGemmArgs& a, cudaStream_t stream) {
  if (a.rows_per_expert <= 0 || a.n <= 0 || a.n_experts <= 0) return;
  const GroupedGemmPath path = resolve_path(a);
  if (path == GroupedGemmPath::kMma) {
    launch_grouped_gemm_mma(a, stream);
    return;
  }
  if (path == GroupedGemmPath::kGemv) {
    if (!grouped_gemv_fits(a)) {
      cuda_fatal(__FILE__, __LINE__, "launch_grouped_gemm", "the GEMV path needs k % 8 == 0, aligned bf16 x and w, no lo parts");
    }
    const int64_t cols_per_block = int64_t(kGemvWarps) * kGemvCols;
    const dim3 grid(unsigned((a.n + cols_per_block - 1) / cols_per_block), unsigned(a.n_experts));
    grouped_gemv_kernel<<<grid, kGemvWarps * 32, 0, stream>>>(a);
    STRATA_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const dim3 grid(unsigned((a.n + kBN - 1) / kBN), unsigned((a.rows_per_expert + kBM - 1) / kBM), unsigned(a.n_experts));
  grouped_gemm_kernel<<<grid, kGemmThreads, 0, stream>>>(a);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void launch_moe_combine(const MoeCombineArgs& a, cudaStream_t stream) {
  if (a.n <= 0) return;
  if (a.k <= 0 || a.k > 64) cuda_fatal(__FILE__, __LINE__, "launch_moe_combine", "k " + std::to_string(a.k));
  const bool vec = a.hidden % 4 == 0 && reinterpret_cast<uintptr_t>(a.y) % 16 == 0 && reinterpret_cast<uintptr_t>(a.out) % 16 == 0;
  if (vec && !a.reference) {
    moe_combine_vec_kernel<<<a.n, kCombineThreads, 0, stream>>>(a);
  } else {
    moe_combine_kernel<<<a.n, 128, 0, stream>>>(a);
  }
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::cuda
