// Paged attention on the tensor cores (see kernels.h): a flash-attention kernel with bf16
// mma.sync m16n8k16 and fp32 accumulation, online softmax in the exp2 domain.
//
// A block (4 warps) takes one query tile of one sequence for one KV head: up to 64 rows, each
// row one (token, q head of the KV group) pair, so every K/V tile is loaded once for the whole
// GQA group. Warp w owns rows 16w..16w+15: its Q fragments stay in registers, it computes
// S = Q K^T for 64 keys, rescales its output accumulators and adds P V with P converted in
// registers from the S accumulators to bf16 A fragments (the m16n8 C layout of two adjacent
// n-tiles is the m16k16 A layout). K/V tiles are gathered from the paged pools with cp.async
// (per-key slot lookup, keys past the range zero-filled) into two shared-memory stages so the
// next tile loads while this one is computed; Q passes through the second V stage before the
// first tile is computed (64 KB of shared memory at head_dim 128: three blocks per
// multiprocessor). Shared rows are XOR-swizzled in 16-byte chunks so that ldmatrix reads of 8
// rows hit distinct banks.
#include <cuda_bf16.h>

#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma_util.cuh"

namespace strata::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kRows = 16 * kWarps;  // query rows per block
constexpr int kKeys = 64;           // keys per K/V tile
constexpr float kLog2e = 1.4426950408889634f;

using namespace mma;

// kMinBlocks: blocks per multiprocessor the register budget is cut for (3 at head_dim 128 costs
// a few spilled registers; bench_cuda_llama measures 2 against 3).
template <int HD, int kMinBlocks>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) flash_attention_kernel(PagedAttentionArgs a) {
  constexpr int kChunks = HD / 8;  // 16-byte chunks per row
  constexpr int kSteps = HD / 16;  // k-steps of Q K^T; also pairs of output n-tiles
  extern __shared__ __align__(128) unsigned char smem_raw[];
  static_assert(kRows == kKeys, "Q borrows one V stage");
  uint16_t* sk = reinterpret_cast<uint16_t*>(smem_raw);  // [2, kKeys, HD]
  uint16_t* sv = sk + 2 * kKeys * HD;                    // [2, kKeys, HD]
  uint16_t* sq = sv + kKeys * HD;                        // [kRows, HD]: V stage 1 until tile 1 loads

  // Heaviest tiles (the last queries of each sequence) first.
  const int tile = a.n_tiles - 1 - int(blockIdx.x);
  const int kvh = blockIdx.y, split = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int seq = a.tile_seq[tile];
  const int q0 = a.tile_q0[tile];
  const int tok_begin = a.seq_q_start[seq];
  const int n_q = a.seq_q_start[seq + 1] - tok_begin;
  const int pos0 = a.seq_pos0[seq];
  const int group = a.n_heads / a.n_kv_heads;
  const int n_tok = min(a.tokens_per_tile, n_q - q0);
  const int n_rows = n_tok * group;
  const int* table = a.block_tables + int64_t(seq) * a.max_blocks_per_seq;

  // Keys this tile can see: [lo, hi), cut into this split's share.
  const int first_pos = pos0 + q0, last_pos = pos0 + q0 + n_tok - 1;
  const int lo = a.window > 0 ? max(0, first_pos - a.window + 1) : 0;
  const int hi = last_pos + 1;
  int k_begin = lo, k_end = hi;
  if (a.n_splits > 1) {
    const int chunk = ((hi - lo + a.n_splits - 1) / a.n_splits + kKeys - 1) / kKeys * kKeys;
    k_begin = min(hi, lo + split * chunk);
    k_end = min(hi, k_begin + chunk);
  }
  const int n_kt = (k_end - k_begin + kKeys - 1) / kKeys;

  // Q rows (zero past n_rows) into shared memory.
  for (int i = tid; i < kRows * kChunks; i += kWarps * 32) {
    const int r = i / kChunks, c = i % kChunks;
    const bool valid = r < n_rows;
    const uint16_t* src = a.q;
    if (valid) {
      const int t = tok_begin + q0 + r / group, h = kvh * group + r % group;
      src = a.q + (int64_t(t) * a.n_heads + h) * HD + c * 8;
    }
    cp_async16(smem_addr(sq + swz<HD>(r, c)), src, valid);
  }
  // Block sizes are powers of two in practice: shift and mask instead of a division per key.
  const int bs = a.block_size;
  const bool bs_pow2 = (bs & (bs - 1)) == 0;
  const int bs_shift = __ffs(bs) - 1;
  auto load_kv = [&](int stage, int kt) {
    uint16_t* dk = sk + stage * kKeys * HD;
    uint16_t* dv = sv + stage * kKeys * HD;
    for (int i = tid; i < kKeys * kChunks; i += kWarps * 32) {
      const int j = i / kChunks, c = i % kChunks;
      const int p = kt + j;
      const bool valid = p < k_end;
      int64_t off = 0;
      if (valid) {
        const int blk = bs_pow2 ? p >> bs_shift : p / bs, in_blk = bs_pow2 ? p & (bs - 1) : p % bs;
        const int64_t slot = int64_t(table[blk]) * bs + in_blk;
        off = (slot * a.n_kv_heads + kvh) * HD + c * 8;
      }
      cp_async16(smem_addr(dk + swz<HD>(j, c)), a.k_pool + off, valid);
      cp_async16(smem_addr(dv + swz<HD>(j, c)), a.v_pool + off, valid);
    }
  };
  if (n_kt > 0) load_kv(0, k_begin);
  cp_async_commit();

  // This thread's two rows (g and g + 8 of its warp's 16) and their query positions; a row past
  // n_rows gets position -1 (sees nothing when masked; its output is never written).
  const int row0 = warp * 16 + g, row1 = row0 + 8;
  const int qpos0 = row0 < n_rows ? pos0 + q0 + row0 / group : -1;
  const int qpos1 = row1 < n_rows ? pos0 + q0 + row1 / group : -1;
  const float s_scale = a.scale * kLog2e;
  const bool capped = a.softcap > 0.0f;
  const float cap_in = capped ? a.scale / a.softcap : 0.0f, cap_out = a.softcap * kLog2e;

  uint32_t qf[kSteps][4];
  float o[2 * kSteps][4];
#pragma unroll
  for (int i = 0; i < 2 * kSteps; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

  for (int it = 0; it < n_kt; ++it) {
    const int kt = k_begin + it * kKeys;
    if (it == 0) {
      // Q and tile 0 have landed; Q goes to registers before tile 1 overwrites it.
      cp_async_wait<0>();
      __syncthreads();
#pragma unroll
      for (int ks = 0; ks < kSteps; ++ks) {
        const int r = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        ldmatrix_x4(qf[ks], smem_addr(sq + swz<HD>(r, ks * 2 + (lane >> 4))));
      }
      __syncthreads();
    }
    if (it + 1 < n_kt) load_kv((it + 1) & 1, kt + kKeys);
    cp_async_commit();
    if (it > 0) {
      cp_async_wait<1>();
      __syncthreads();
    }
    const uint16_t* ck = sk + (it & 1) * kKeys * HD;
    const uint16_t* cv = sv + (it & 1) * kKeys * HD;

    // S = Q K^T: 16 rows x 64 keys per warp, n-tile j holds keys 8j..8j+7.
    float s[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t b[4];
        const int key = np * 16 + (lane & 7) + (lane >> 4) * 8;
        ldmatrix_x4(b, smem_addr(ck + swz<HD>(key, ks * 2 + ((lane >> 3) & 1))));
        mma_bf16(s[2 * np], qf[ks], b[0], b[1]);
        mma_bf16(s[2 * np + 1], qf[ks], b[2], b[3]);
      }
    }

    // Scale (and soft-cap) into the log2 domain; mask only tiles that cross a boundary.
    const bool full = kt + kKeys <= k_end && kt + kKeys - 1 <= first_pos &&
                      (a.window == 0 || last_pos - kt < a.window);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[j][e];
        x = capped ? cap_out * tanhf(x * cap_in) : x * s_scale;
        if (!full) {
          const int p = kt + j * 8 + 2 * t4 + (e & 1);
          const int qp = e < 2 ? qpos0 : qpos1;
          const bool visible = p < k_end && p <= qp && (a.window == 0 || qp - p < a.window);
          if (!visible) x = -INFINITY;
        }
        s[j][e] = x;
      }
    }

    // Online softmax: row maxima over the quad that shares a row.
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
      mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    // A row that has seen nothing visible keeps base 0 so that no inf - inf appears.
    const float base0 = mn0 == -INFINITY ? 0.0f : mn0, base1 = mn1 == -INFINITY ? 0.0f : mn1;
    const float corr0 = fast_exp2(m0 - base0), corr1 = fast_exp2(m1 - base1);
    m0 = mn0;
    m1 = mn1;
    float sum0 = 0.0f, sum1 = 0.0f;
    uint32_t pf[4][4];  // P as A fragments, one per 16 keys
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float p0 = fast_exp2(s[j][0] - base0), p1 = fast_exp2(s[j][1] - base0);
      const float p2 = fast_exp2(s[j][2] - base1), p3 = fast_exp2(s[j][3] - base1);
      sum0 += p0 + p1;
      sum1 += p2 + p3;
      pf[j / 2][(j & 1) * 2] = pack_bf16(p0, p1);
      pf[j / 2][(j & 1) * 2 + 1] = pack_bf16(p2, p3);
    }
    l0 = l0 * corr0 + sum0;
    l1 = l1 * corr1 + sum1;
#pragma unroll
    for (int i = 0; i < 2 * kSteps; ++i) {
      o[i][0] *= corr0;
      o[i][1] *= corr0;
      o[i][2] *= corr1;
      o[i][3] *= corr1;
    }

    // O += P V: k = 16 keys at a time, n-tiles over the head dims (two per ldmatrix).
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int dp = 0; dp < kSteps; ++dp) {
        uint32_t b[4];
        const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        ldmatrix_x4_trans(b, smem_addr(cv + swz<HD>(key, dp * 2 + (lane >> 4))));
        mma_bf16(o[2 * dp], pf[kk], b[0], b[1]);
        mma_bf16(o[2 * dp + 1], pf[kk], b[2], b[3]);
      }
    }
    __syncthreads();  // this stage is refilled by the next iteration's load
  }
  cp_async_wait<0>();

  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = half == 0 ? row0 : row1;
    if (r >= n_rows) continue;
    const int t = tok_begin + q0 + r / group, h = kvh * group + r % group;
    const int64_t row = int64_t(t) * a.n_heads + h;
    const float l = half == 0 ? l0 : l1;
    if (a.n_splits == 1) {
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      uint32_t* dst = reinterpret_cast<uint32_t*>(a.out + row * HD);
#pragma unroll
      for (int i = 0; i < 2 * kSteps; ++i) dst[i * 4 + t4] = pack_bf16(o[i][half * 2] * inv, o[i][half * 2 + 1] * inv);
    } else {
      const int64_t prow = int64_t(split) * a.n_tokens * a.n_heads + row;
      float2* dst = reinterpret_cast<float2*>(a.partial_out + prow * HD);
#pragma unroll
      for (int i = 0; i < 2 * kSteps; ++i) dst[i * 4 + t4] = make_float2(o[i][half * 2], o[i][half * 2 + 1]);
      if (t4 == 0) {
        // The split's maximum back in the natural-log domain, as the combine kernel expects.
        const float m = half == 0 ? m0 : m1;
        a.partial_ml[prow * 2] = m == -INFINITY ? -INFINITY : m / kLog2e;
        a.partial_ml[prow * 2 + 1] = l;
      }
    }
  }
}

template <int HD, int kMinBlocks>
void launch_hd(const PagedAttentionArgs& a, cudaStream_t stream) {
  constexpr size_t kSmem = size_t(4 * kKeys) * HD * sizeof(uint16_t);
  static bool raised = false;  // the attribute is per kernel and process-wide
  if (!raised) {
    STRATA_CUDA_CHECK(cudaFuncSetAttribute(flash_attention_kernel<HD, kMinBlocks>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
    raised = true;
  }
  const dim3 grid(a.n_tiles, a.n_kv_heads, a.n_splits);
  flash_attention_kernel<HD, kMinBlocks><<<grid, kWarps * 32, kSmem, stream>>>(a);
  STRATA_CUDA_CHECK_LAUNCH();
}

int g_min_blocks_128 = 3;

}  // namespace

void set_flash_attention_min_blocks(int32_t blocks) { g_min_blocks_128 = blocks <= 2 ? 2 : 3; }

bool flash_attention_supports(int32_t head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

int32_t flash_attention_rows() { return kRows; }

void launch_flash_attention(const PagedAttentionArgs& a, cudaStream_t stream) {
  if (a.n_tiles == 0) return;
  switch (a.head_dim) {
    case 16: launch_hd<16, 3>(a, stream); break;
    case 32: launch_hd<32, 3>(a, stream); break;
    case 64: launch_hd<64, 3>(a, stream); break;
    case 128:
      if (g_min_blocks_128 == 2) {
        launch_hd<128, 2>(a, stream);
      } else {
        launch_hd<128, 3>(a, stream);
      }
      break;
    default: cuda_fatal(__FILE__, __LINE__, "launch_flash_attention", "head_dim " + std::to_string(a.head_dim));
  }
}

}  // namespace strata::cuda
