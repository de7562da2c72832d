// The grouped expert GEMM on the tensor cores (moe.h, GroupedGemmPath::kMma): bf16 mma.sync
// m16n8k16 with f32 accumulators, for steps past the grouped GEMV's row count (prefill).
//
// Tiles are kBM sorted rows of one expert by kBN output columns. The kernel is persistent: a
// grid of one or two blocks per multiprocessor walks the tile list with a fixed stride, and each
// block derives that list itself from the routing's offsets (per expert ceil(rows / kBM) row
// tiles times the column tiles, prefix-summed in shared memory), so nothing is read back to the
// host and experts with no rows cost nothing. Inside an expert the row tile varies fastest:
// blocks running at the same time share one weight tile, which is then read from memory once.
// A rows are gathered through row_src with cp.async (rows past the group and reduction chunks
// past k are zero-filled) into kStages shared-memory stages of kBK columns, XOR-swizzled in
// 16-byte chunks so that ldmatrix reads of 8 rows hit distinct banks; the next tile's first
// stages load while a tile's outputs are stored. A row's sums run over k in the same order
// whatever the step's size, as in the tiled kernel.
#include <cuda_bf16.h>

#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/mma_util.cuh"
#include "backend/cuda/moe.h"

namespace strata::cuda {
namespace {

using namespace mma;

constexpr int kBM = 128, kBK = 64;
constexpr int kWarpsM = 2;
constexpr int kWarpM = kBM / kWarpsM, kMi = kWarpM / 16;  // rows and m16 tiles per warp
constexpr int kChunks = kBK / 8;                           // 16-byte chunks per tile row

// A block tile of kBM rows x kBN columns; warps 2 x kWarpsN, each 64 x (kBN / kWarpsN):
//   128 x 128, 4 warps of 64 x 64, 3 stages, 2 blocks per multiprocessor (large steps);
//   the same with the m16 tiles alternating between the warp rows and no skipping (below);
//   128 x 128, 8 warps of 64 x 32, 3 stages, 2 blocks per multiprocessor;
//   128 x 256, 8 warps of 64 x 64, 4 stages, 1 block per multiprocessor (small steps: half the
//   tiles to stream the weights through; on large ones its lone block's barriers stall the
//   multiprocessor, and 128 x 128 is faster).
// kContig: warp row wm takes rows wm * 64 .. wm * 64 + 63 (else the m16 tiles alternate
// between the two warp rows), and a warp whose rows all lie past the group skips its MMAs: a
// group's last tile with at most 64 rows issues half of them.
template <int kBN_, int kWarpsN_, int kStages_, bool kContig_, int kMinBlocks_>
struct MmaShape {
  static constexpr int kBN = kBN_, kWarpsN = kWarpsN_, kStages = kStages_, kMinBlocks = kMinBlocks_;
  static constexpr bool kContig = kContig_;
  static constexpr int kThreads = kWarpsM * kWarpsN * 32;
  static constexpr int kWarpN = kBN / kWarpsN, kNi = kWarpN / 8;  // columns and n8 tiles per warp
  static constexpr int kLoadRows = kThreads / kChunks;             // rows one pass of the block loads
  static constexpr int kARows = kBM / kLoadRows, kBRows = kBN / kLoadRows;  // per thread
  static constexpr int kStageElems = (kBM + kBN) * kBK;                     // bf16 per stage: A then B
  static constexpr size_t kPipeBytes = size_t(kStages) * kStageElems * sizeof(uint16_t);
  static_assert(kThreads % kChunks == 0 && kBM % kLoadRows == 0 && kBN % kLoadRows == 0, "whole rows per load pass");
  static_assert(kNi % 2 == 0, "n8 tiles in pairs (one ldmatrix x4)");
};
using Shape128x128 = MmaShape<128, 2, 3, true, 2>;
using Shape128x128w4 = MmaShape<128, 2, 3, false, 2>;
using Shape128x128w8 = MmaShape<128, 4, 3, false, 2>;
using Shape128x256 = MmaShape<256, 4, 4, true, 1>;

// The block's share of the tile list (below) and the shared-memory tables it reads:
//   tile_start [n_experts + 1]: first tile of each expert (row tiles x column tiles)
//   row_begin  [n_experts + 1]: the routing's offsets
__device__ __forceinline__ int find_expert(const int32_t* tile_start, int n_experts, int32_t t) {
  int lo = 0, hi = n_experts;  // tile_start[lo] <= t < tile_start[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (tile_start[mid] <= t) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Row of this warp's m16 tile i.
template <class S>
__device__ __forceinline__ int m16_row(int i, int wm) {
  return S::kContig ? wm * kWarpM + i * 16 : (i * kWarpsM + wm) * 16;
}

// acc += one shared stage (kBK of the reduction) for this warp.
template <class S>
__device__ __forceinline__ void mma_stage(float (&acc)[kMi][S::kNi][4], const uint16_t* sa, const uint16_t* sb, int lane, int wm,
                                          int wn) {
#pragma unroll
  for (int ks = 0; ks < kBK / 16; ++ks) {
    uint32_t af[kMi][4];
#pragma unroll
    for (int i = 0; i < kMi; ++i) {
      const int r = m16_row<S>(i, wm) + (lane & 7) + ((lane >> 3) & 1) * 8;
      ldmatrix_x4(af[i], smem_addr(sa + swz<kBK>(r, ks * 2 + (lane >> 4))));
    }
#pragma unroll
    for (int jp = 0; jp < S::kNi / 2; ++jp) {
      uint32_t bf[4];
      const int c = wn * S::kWarpN + jp * 16 + (lane & 7) + (lane >> 4) * 8;
      ldmatrix_x4(bf, smem_addr(sb + swz<kBK>(c, ks * 2 + ((lane >> 3) & 1))));
#pragma unroll
      for (int i = 0; i < kMi; ++i) {
        mma_bf16(acc[i][2 * jp], af[i], bf[0], bf[1]);
        mma_bf16(acc[i][2 * jp + 1], af[i], bf[2], bf[3]);
      }
    }
  }
}

// One tile of the list: expert, first sorted row, rows in it, first column.
struct Tile {
  int e;
  int32_t r0;
  int rows;
  int64_t n0;
};

template <class S>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks) grouped_gemm_mma_kernel(GroupedGemmArgs a) {
  constexpr int kThreads = S::kThreads, kWarpN = S::kWarpN, kNi = S::kNi, kStages = S::kStages;
  constexpr int kLoadRows = S::kLoadRows;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  uint16_t* pipe = reinterpret_cast<uint16_t*>(smem_raw);                       // [kStages][A kBM x kBK | B kBN x kBK]
  int32_t* tile_start = reinterpret_cast<int32_t*>(smem_raw + S::kPipeBytes);  // [n_experts + 1]
  int32_t* row_begin = tile_start + a.n_experts + 1;                            // [n_experts + 1]
  __shared__ int32_t warp_sums[kThreads / 32];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int E = a.n_experts;
  const int32_t n_tiles_n = int32_t((a.n + S::kBN - 1) / S::kBN);

  // Tile prefix: thread tid sums the row tiles of experts [tid * per, (tid + 1) * per), a block
  // scan of those sums, then each thread writes its experts' starts.
  const int per = (E + kThreads - 1) / kThreads;
  const int e_lo = min(E, tid * per), e_hi = min(E, e_lo + per);
  int32_t mine = 0;
  for (int e = e_lo; e < e_hi; ++e) {
    const int32_t b = a.offsets[e], en = a.offsets[e + 1];
    row_begin[e] = b;
    mine += (en - b + kBM - 1) / kBM;
  }
  if (tid == 0) row_begin[E] = a.offsets[E];
  int32_t incl = mine;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const int32_t v = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += v;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  int32_t warp_base = 0;
  for (int w = 0; w < warp; ++w) warp_base += warp_sums[w];
  int32_t run = warp_base + incl - mine;
  for (int e = e_lo; e < e_hi; ++e) {
    tile_start[e] = run * n_tiles_n;
    run += (row_begin[e + 1] - row_begin[e] + kBM - 1) / kBM;
  }
  if (tid == kThreads - 1) tile_start[E] = run * n_tiles_n;
  __syncthreads();
  const int32_t n_tiles = tile_start[E];

  const int wm = warp / S::kWarpsN, wn = warp % S::kWarpsN;
  const int g = lane >> 2, t4 = lane & 3;
  const int ld_chunk = tid % kChunks, ld_row = tid / kChunks;
  const int n_kt = int((a.k + kBK - 1) / kBK);

  const auto tile_of = [&](int32_t t) {
    Tile ti;
    ti.e = find_expert(tile_start, E, t);
    const int32_t local = t - tile_start[ti.e];
    const int32_t m_tiles = (row_begin[ti.e + 1] - row_begin[ti.e] + kBM - 1) / kBM;
    // Inside an expert the row tile varies fastest (blocks at work together share weights).
    const int32_t nt = local / m_tiles, mt = local % m_tiles;
    ti.r0 = row_begin[ti.e] + mt * kBM;
    ti.rows = min(kBM, row_begin[ti.e + 1] - ti.r0);
    ti.n0 = int64_t(nt) * S::kBN;
    return ti;
  };

  // This thread's A load rows (sources gathered through row_src; an invalid one is never read)
  // and B row base of the tile being loaded.
  const uint16_t* a_src[S::kARows];
  bool a_ok[S::kARows];
  const uint16_t* b_base = a.w;
  int64_t b_n0 = 0;
  const auto setup_loads = [&](const Tile& ti) {
#pragma unroll
    for (int i = 0; i < S::kARows; ++i) {
      const int r = ld_row + i * kLoadRows;
      a_ok[i] = r < ti.rows;
      int64_t src = 0;
      if (a_ok[i]) src = a.row_src != nullptr ? int64_t(a.row_src[ti.r0 + r] / a.row_src_div) : int64_t(ti.r0 + r);
      a_src[i] = a.x + src * a.k + ld_chunk * 8;
    }
    b_base = a.w + int64_t(ti.e) * a.n * a.k + ld_chunk * 8;
    b_n0 = ti.n0;
  };
  const auto load_stage = [&](int stage, int kt) {
    uint16_t* sa = pipe + stage * S::kStageElems;
    uint16_t* sb = sa + kBM * kBK;
    const int64_t k0 = int64_t(kt) * kBK;
    const bool k_ok = k0 + ld_chunk * 8 < a.k;
#pragma unroll
    for (int i = 0; i < S::kARows; ++i) {
      const int r = ld_row + i * kLoadRows;
      cp_async16(smem_addr(sa + swz<kBK>(r, ld_chunk)), a_ok[i] && k_ok ? a_src[i] + k0 : a.x, a_ok[i] && k_ok);
    }
#pragma unroll
    for (int i = 0; i < S::kBRows; ++i) {
      const int r = ld_row + i * kLoadRows;
      const bool ok = k_ok && b_n0 + r < a.n;
      cp_async16(smem_addr(sb + swz<kBK>(r, ld_chunk)), ok ? b_base + (b_n0 + r) * a.k + k0 : a.w, ok);
    }
  };
  const auto prologue = [&] {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < n_kt) load_stage(s, s);
      cp_async_commit();
    }
  };

  int32_t t = blockIdx.x;
  Tile cur{};
  if (t < n_tiles) {
    cur = tile_of(t);
    setup_loads(cur);
    prologue();
  }
  while (t < n_tiles) {
    float acc[kMi][kNi][4];
#pragma unroll
    for (int i = 0; i < kMi; ++i) {
#pragma unroll
      for (int j = 0; j < kNi; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
    }
    // Warp-uniform: whether any of this warp's rows lies inside the group.
    const bool live = !S::kContig || m16_row<S>(0, wm) < cur.rows;
    for (int kt = 0; kt < n_kt; ++kt) {
      cp_async_wait<kStages - 2>();
      // Stage kt has landed for every thread, and every warp is done with stage kt - 1, which
      // the next load overwrites.
      __syncthreads();
      if (kt + kStages - 1 < n_kt) load_stage((kt + kStages - 1) % kStages, kt + kStages - 1);
      cp_async_commit();
      const uint16_t* sa = pipe + (kt % kStages) * S::kStageElems;
      if (live) mma_stage<S>(acc, sa, sa + kBM * kBK, lane, wm, wn);
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the stages before the next tile loads them

    // The next tile's first stages load while this one's outputs are stored.
    const Tile done = cur;
    t += gridDim.x;
    if (t < n_tiles) {
      cur = tile_of(t);
      setup_loads(cur);
      prologue();
    }

    // Accumulator (i, j): rows g and g + 8 of m-tile i, columns 2 t4 and 2 t4 + 1 of n-tile j.
#pragma unroll
    for (int i = 0; i < kMi; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = m16_row<S>(i, wm) + g + h * 8;
        if (r >= done.rows) continue;
        const int64_t row = int64_t(done.r0 + r);
#pragma unroll
        for (int j = 0; j < kNi; ++j) {
          const int64_t c = done.n0 + wn * kWarpN + j * 8 + 2 * t4;
          if (c >= a.n) continue;
          const float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
          if (a.out_f32) {
            *reinterpret_cast<float2*>(static_cast<float*>(a.y) + row * a.n + c) = make_float2(v0, v1);
          } else {
            *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(a.y) + row * a.n + c) = pack_bf16(v0, v1);
          }
        }
      }
    }
  }
  cp_async_wait<0>();
}

template <class S>
size_t mma_smem_bytes(int32_t n_experts) {
  return S::kPipeBytes + size_t(2) * (size_t(n_experts) + 1) * sizeof(int32_t);
}

template <class S>
void launch_shape(const GroupedGemmArgs& a, cudaStream_t stream) {
  int dev = 0, sms = 0, smem_per_sm = 0;
  STRATA_CUDA_CHECK(cudaGetDevice(&dev));
  STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  const size_t smem = mma_smem_bytes<S>(a.n_experts);
  // 1 KB of shared memory per block is the runtime's.
  const int per_sm = S::kMinBlocks > 1 && size_t(smem_per_sm) >= 2 * (smem + 1024) ? 2 : 1;
  STRATA_CUDA_CHECK(cudaFuncSetAttribute(grouped_gemm_mma_kernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  grouped_gemm_mma_kernel<S><<<unsigned(sms * per_sm), S::kThreads, smem, stream>>>(a);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool grouped_gemm_mma_fits(const GroupedGemmArgs& a) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return a.k % 8 == 0 && a.n % 8 == 0 && aligned(a.x) && aligned(a.w) && aligned(a.y) && a.x_lo == nullptr &&
         a.w_lo == nullptr && a.n_experts <= 4096;
}

void launch_grouped_gemm_mma(const GroupedGemmArgs& a, cudaStream_t stream, MmaTile tile) {
  if (!grouped_gemm_mma_fits(a)) {
    cuda_fatal(__FILE__, __LINE__, "launch_grouped_gemm",
               "the tensor-core path needs k % 8 == 0, n % 8 == 0, aligned bf16 x and w and y, no lo parts, <= 4096 experts");
  }
  if (tile == MmaTile::kAuto) tile = a.rows_per_expert <= kMmaWideTileMaxRows ? MmaTile::k128x256 : MmaTile::k128x128;
  switch (tile) {
    case MmaTile::kAuto:
    case MmaTile::k128x128:
      launch_shape<Shape128x128>(a, stream);
      break;
    case MmaTile::k128x128w4:
      launch_shape<Shape128x128w4>(a, stream);
      break;
    case MmaTile::k128x128w8:
      launch_shape<Shape128x128w8>(a, stream);
      break;
    case MmaTile::k128x256:
      launch_shape<Shape128x256>(a, stream);
      break;
  }
}

}  // namespace strata::cuda
