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

}  // namespace

void launch_moe_route(const MoeRouteArgs& a, cudaStream_t stream) {
  if (a.n <= 0) return;
  if (a.k <= 0 || a.k > a.n_experts) cuda_fatal(__FILE__, __LINE__, "launch_moe_route", "k " + std::to_string(a.k));
  moe_route_kernel<<<(a.n + 127) / 128, 128, 0, stream>>>(a);
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

void launch_grouped_gemm(const GroupedGemmArgs& a, cudaStream_t stream) {
  if (a.rows_per_expert <= 0 || a.n <= 0 || a.n_experts <= 0) return;
  // STRATA_MOE_GEMM=tiled makes kAuto take the tiled kernel, =simt the CUDA-core dispatch from
  // before the tensor-core kernel (the GEMV up to 256 rows per expert, else the tiled kernel):
  // benchmarks compare them in one run.
  static const std::string env_path = [] {
    const char* v = std::getenv("STRATA_MOE_GEMM");
    return std::string(v != nullptr ? v : "");
  }();
  const bool force_tiled = env_path == "tiled", no_mma = env_path == "simt";
  const bool fits = grouped_gemv_fits(a);
  GroupedGemmPath path = a.path;
  if (path == GroupedGemmPath::kAuto) {
    if (force_tiled) {
      path = GroupedGemmPath::kTiled;
    } else if (fits && a.rows_per_expert <= (no_mma ? 256 : kGroupedGemvMaxRows)) {
      path = GroupedGemmPath::kGemv;
    } else {
      path = !no_mma && grouped_gemm_mma_fits(a) ? GroupedGemmPath::kMma : GroupedGemmPath::kTiled;
    }
  }
  if (path == GroupedGemmPath::kMma) {
    launch_grouped_gemm_mma(a, stream);
    return;
  }
  if (path == GroupedGemmPath::kGemv) {
    if (!fits) cuda_fatal(__FILE__, __LINE__, "launch_grouped_gemm", "the GEMV path needs k % 8 == 0, aligned bf16 x and w, no lo parts");
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
  moe_combine_kernel<<<a.n, 128, 0, stream>>>(a);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::cuda
