// Paged attention (see kernels.h): a tiled online-softmax kernel on CUDA cores.
//
// A block (4 warps) takes one query tile of one sequence for one KV head: its rows are the
// tile's tokens x the q heads of that KV group (GQA: K/V tiles are loaded once for the whole
// group). Keys stream through shared memory 32 at a time; in a warp, lane j scores key j of
// the tile for one row, the softmax statistics are warp reductions, and each lane owns
// head_dim / 32 output dims. With n_splits > 1 the key range is cut into n_splits chunks
// (grid z) that write partial (out, max, sum) for launch_attention_combine (split-KV decode).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace strata::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 8;
constexpr int kMaxRows = kWarps * kRowsPerWarp;
constexpr int kKeysPerTile = 32;

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

struct Smem {
  float* q;       // [kMaxRows, head_dim]
  uint32_t* k;    // [kKeysPerTile, head_dim / 2 + 1] bf16 pairs; the pad word spreads rows over banks
  uint16_t* v;    // [kKeysPerTile, head_dim]
};

// DPL: output dims per lane (head_dim <= 32 * DPL).
template <int DPL>
__global__ void __launch_bounds__(kWarps * 32) paged_attention_kernel(PagedAttentionArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int hd = a.head_dim;
  const int k_stride = hd / 2 + 1;  // words per K row
  Smem sm;
  sm.q = reinterpret_cast<float*>(smem_raw);
  sm.k = reinterpret_cast<uint32_t*>(sm.q + kMaxRows * hd);
  sm.v = reinterpret_cast<uint16_t*>(sm.k + kKeysPerTile * k_stride);
  pdl_wait();
  pdl_launch_dependents();

  const int tile = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int seq = a.tile_seq[tile];
  const int q0 = a.tile_q0[tile];
  const int tok_begin = a.seq_q_start[seq];
  const int n_q = a.seq_q_start[seq + 1] - tok_begin;
  const int pos0 = a.seq_pos0[seq];
  const int group = a.n_heads / a.n_kv_heads;
  const int n_tok = min(a.tokens_per_tile, n_q - q0);
  const int n_rows = n_tok * group;
  const int* table = a.block_tables + int64_t(seq) * a.max_blocks_per_seq;

  // Rows: r = token_in_tile * group + head_in_group.
  for (int i = threadIdx.x; i < n_rows * hd; i += blockDim.x) {
    const int r = i / hd, d = i % hd;
    const int t = tok_begin + q0 + r / group, h = kvh * group + r % group;
    sm.q[r * hd + d] = bf16_bits_to_f32(a.q[(int64_t(t) * a.n_heads + h) * hd + d]);
  }

  // Keys this tile can see: [lo, hi).
  const int first_pos = pos0 + q0, last_pos = pos0 + q0 + n_tok - 1;
  const int lo = a.window > 0 ? max(0, first_pos - a.window + 1) : 0;
  const int hi = last_pos + 1;
  int k_begin = lo, k_end = hi;
  if (a.n_splits > 1) {
    const int chunk = ((hi - lo + a.n_splits - 1) / a.n_splits + kKeysPerTile - 1) / kKeysPerTile * kKeysPerTile;
    k_begin = min(hi, lo + split * chunk);
    k_end = min(hi, k_begin + chunk);
  }

  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][DPL];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[rr][i] = 0.0f;
  }

  const int vec_per_key = hd / 8;  // 16-byte pieces of one key's head vector
  for (int kt = k_begin; kt < k_end; kt += kKeysPerTile) {
    __syncthreads();  // the previous tile's K/V are no longer read (and q is written, first time)
    for (int i = threadIdx.x; i < kKeysPerTile * vec_per_key; i += blockDim.x) {
      const int j = i / vec_per_key, c = i % vec_per_key;
      const int p = kt + j;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      if (p < k_end) {
        const int64_t slot = int64_t(table[p / a.block_size]) * a.block_size + p % a.block_size;
        const int64_t off = (slot * a.n_kv_heads + kvh) * hd + c * 8;
        kv = *reinterpret_cast<const uint4*>(a.k_pool + off);
        vv = *reinterpret_cast<const uint4*>(a.v_pool + off);
      }
      uint32_t* kd = sm.k + j * k_stride + c * 4;
      kd[0] = kv.x;
      kd[1] = kv.y;
      kd[2] = kv.z;
      kd[3] = kv.w;
      *reinterpret_cast<uint4*>(sm.v + j * hd + c * 8) = vv;
    }
    __syncthreads();

    const int p = kt + lane;  // this lane's key
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp + rr * kWarps;
      if (r >= n_rows) break;
      const int qpos = pos0 + q0 + r / group;
      const float* qr = sm.q + r * hd;
      const uint32_t* kr = sm.k + lane * k_stride;
      float dot = 0.0f;
      for (int d2 = 0; d2 < hd / 2; ++d2) {
        const uint32_t w = kr[d2];
        dot += qr[2 * d2] * __uint_as_float(w << 16) + qr[2 * d2 + 1] * __uint_as_float(w & 0xffff0000u);
      }
      float s = dot * a.scale;
      if (a.softcap > 0.0f) s = a.softcap * tanhf(s / a.softcap);
      const bool visible = p < k_end && p <= qpos && (a.window == 0 || qpos - p < a.window);
      if (!visible) s = -INFINITY;
      const float m_new = fmaxf(m[rr], warp_max(s));
      if (m_new == -INFINITY) continue;  // nothing visible yet for this row
      const float e = visible ? __expf(s - m_new) : 0.0f;
      const float corr = __expf(m[rr] - m_new);  // 0 when m was -inf
      l[rr] = l[rr] * corr + warp_sum(e);
      m[rr] = m_new;
#pragma unroll
      for (int i = 0; i < DPL; ++i) acc[rr][i] *= corr;
      for (int j = 0; j < kKeysPerTile; ++j) {
        const float ej = __shfl_sync(0xffffffffu, e, j);
        if (ej == 0.0f) continue;  // warp-uniform
        const uint16_t* vr = sm.v + j * hd;
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
          const int d = lane + 32 * i;
          if (d < hd) acc[rr][i] += ej * bf16_bits_to_f32(vr[d]);
        }
      }
    }
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = warp + rr * kWarps;
    if (r >= n_rows) break;
    const int t = tok_begin + q0 + r / group, h = kvh * group + r % group;
    const int64_t row = int64_t(t) * a.n_heads + h;
    if (a.n_splits == 1) {
      const float inv = l[rr] > 0.0f ? 1.0f / l[rr] : 0.0f;
#pragma unroll
      for (int i = 0; i < DPL; ++i) {
        const int d = lane + 32 * i;
        if (d < hd) a.out[row * hd + d] = __bfloat16_as_ushort(__float2bfloat16_rn(acc[rr][i] * inv));
      }
    } else {
      const int64_t prow = int64_t(split) * a.n_tokens * a.n_heads + row;
#pragma unroll
      for (int i = 0; i < DPL; ++i) {
        const int d = lane + 32 * i;
        if (d < hd) a.partial_out[prow * hd + d] = acc[rr][i];
      }
      if (lane == 0) {
        a.partial_ml[prow * 2] = m[rr];
        a.partial_ml[prow * 2 + 1] = l[rr];
      }
    }
  }
}

// One block per (token, head): merges the splits' partial results.
__global__ void attention_combine_kernel(PagedAttentionArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t row = blockIdx.x;  // token * n_heads + head
  const int64_t stride = int64_t(a.n_tokens) * a.n_heads;
  float mx = -INFINITY;
  for (int s = 0; s < a.n_splits; ++s) mx = fmaxf(mx, a.partial_ml[(s * stride + row) * 2]);
  float denom = 0.0f;
  for (int s = 0; s < a.n_splits; ++s) {
    const float ms = a.partial_ml[(s * stride + row) * 2];
    if (ms != -INFINITY) denom += a.partial_ml[(s * stride + row) * 2 + 1] * __expf(ms - mx);
  }
  const float inv = denom > 0.0f ? 1.0f / denom : 0.0f;
  for (int d = threadIdx.x; d < a.head_dim; d += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < a.n_splits; ++s) {
      const float ms = a.partial_ml[(s * stride + row) * 2];
      if (ms != -INFINITY) o += a.partial_out[(s * stride + row) * a.head_dim + d] * __expf(ms - mx);
    }
    a.out[row * a.head_dim + d] = __bfloat16_as_ushort(__float2bfloat16_rn(o * inv));
  }
}

template <int DPL>
void launch_dpl(const PagedAttentionArgs& a, cudaStream_t stream) {
  const size_t smem = size_t(kMaxRows) * a.head_dim * sizeof(float) +
                      size_t(kKeysPerTile) * (a.head_dim / 2 + 1) * sizeof(uint32_t) +
                      size_t(kKeysPerTile) * a.head_dim * sizeof(uint16_t);
  static bool raised = false;  // the attribute is per kernel and process-wide
  if (!raised) {
    STRATA_CUDA_CHECK(cudaFuncSetAttribute(paged_attention_kernel<DPL>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(kMaxRows * 256 * 4 + kKeysPerTile * 129 * 4 + kKeysPerTile * 256 * 2)));
    raised = true;
  }
  const dim3 grid(a.n_tiles, a.n_kv_heads, a.n_splits);
  launch_pdl(paged_attention_kernel<DPL>, grid, kWarps * 32, smem, stream, a);
}

}  // namespace

int32_t attention_max_rows() { return kMaxRows; }

int32_t attention_tokens_per_tile(int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, int32_t n_splits) {
  const int32_t group = n_heads / n_kv_heads;
  const bool flash = flash_attention_supports(head_dim) && n_splits == 1 && group <= flash_attention_rows();
  return std::max(1, (flash ? flash_attention_rows() : kMaxRows) / group);
}

void launch_paged_attention(const PagedAttentionArgs& a, cudaStream_t stream) {
  if (a.n_tiles == 0) return;
  const int32_t group = a.n_heads / a.n_kv_heads;
  if (flash_attention_supports(a.head_dim) && a.n_splits == 1 && a.tokens_per_tile * group <= flash_attention_rows()) {
    launch_flash_attention(a, stream);
    return;
  }
  if (a.head_dim <= 32) {
    launch_dpl<1>(a, stream);
  } else if (a.head_dim <= 64) {
    launch_dpl<2>(a, stream);
  } else if (a.head_dim <= 128) {
    launch_dpl<4>(a, stream);
  } else {
    launch_dpl<8>(a, stream);
  }
}

void launch_attention_combine(const PagedAttentionArgs& a, cudaStream_t stream) {
  if (a.n_tokens == 0 || a.n_splits <= 1) return;
  launch_pdl(attention_combine_kernel, a.n_tokens * a.n_heads, 128, 0, stream, a);
}

}  // namespace strata::cuda
