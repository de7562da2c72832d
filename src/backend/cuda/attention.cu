// Paged attention (see kernels.h): a tiled online-softmax kernel on CUDA cores.
//
// A block (4 warps) takes one query tile of one sequence for one KV head: its rows are the
// tile's tokens x the q heads of that KV group (GQA: K/V tiles are loaded once for the whole
// group). Keys stream through shared memory 32 at a time; in a warp, lane j scores key j of
// the tile for one row, the softmax statistics are warp reductions, and each lane owns
// head_dim / 32 output dims. With n_splits > 1 the key range is cut into n_splits chunks
// (grid z) that write partial (out, max, sum) for launch_attention_combine (split-KV decode).
// Steps whose tiles are all one decode token (not fused) go to decode_mma_kernel below instead:
// tensor cores, the four warps sharing each key tile, for big decode batches.
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma_util.cuh"
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
  float* head;    // [kWarps, head_dim]: a warp's k or v head under construction (decode fusion)
};

size_t smem_bytes(int head_dim) {
  return size_t(kMaxRows) * head_dim * sizeof(float) + size_t(kKeysPerTile) * (head_dim / 2 + 1) * sizeof(uint32_t) +
         size_t(kKeysPerTile) * head_dim * sizeof(uint16_t) + size_t(kWarps) * head_dim * sizeof(float);
}

// One head of token t's QKV projection, by one warp in two halves so that several heads' loads
// can be in flight together: head_load takes lane's values (d = lane + 32 i) with the bias,
// head_finish applies the optional per-head RMSNorm and RoPE (when `rope`) into buf [head_dim]
// (shared memory): the arithmetic of qkv_post_kernel.
template <int DPL>
__device__ __forceinline__ void head_load(const QkvPostArgs& p, int t, int h, int lane, float (&v)[DPL]) {
  const int hd = p.head_dim;
  const float* src = p.qkv + int64_t(t) * (p.n_heads + 2 * p.n_kv_heads) * hd + h * hd;
#pragma unroll
  for (int i = 0; i < DPL; ++i) {
    const int d = lane + 32 * i;
    v[i] = d < hd ? src[d] + (p.bias ? p.bias[h * hd + d] : 0.0f) : 0.0f;
  }
}

template <int DPL>
__device__ void head_finish(const QkvPostArgs& p, int t, bool rope, const float* norm_w, const float (&v)[DPL], float* buf,
                            int lane) {
  const int hd = p.head_dim;
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < DPL; ++i) ss += v[i] * v[i];
  const float inv = norm_w ? rsqrtf(warp_sum(ss) / float(hd) + p.norm_eps) : 1.0f;
#pragma unroll
  for (int i = 0; i < DPL; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) buf[d] = norm_w ? v[i] * inv * (p.norm_one_plus_w ? 1.0f + norm_w[d] : norm_w[d]) : v[i];
  }
  __syncwarp();
  if (rope && p.rot_dim > 0) {
    const int half = p.rot_dim / 2;
    const int pos = p.positions[t];
    for (int i = lane; i < half; i += 32) {
      const float theta = float(pos) * p.inv_freq[i];
      float s, c;
      sincosf(theta, &s, &c);
      c *= p.attn_factor;
      s *= p.attn_factor;
      const float x0 = buf[i], x1 = buf[i + half];
      buf[i] = x0 * c - x1 * s;
      buf[i + half] = x1 * c + x0 * s;
    }
    __syncwarp();
  }
}

template <int DPL>
__device__ void head_post(const QkvPostArgs& p, int t, int h, bool rope, const float* norm_w, float* buf, int lane) {
  float v[DPL];
  head_load<DPL>(p, t, h, lane, v);
  head_finish<DPL>(p, t, rope, norm_w, v, buf, lane);
}

__device__ __forceinline__ uint4 pack8_bf16(const float* f) {
  uint32_t w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    w[j] = uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(f[2 * j]))) |
           (uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(f[2 * j + 1]))) << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

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
  sm.head = reinterpret_cast<float*>(sm.v + kKeysPerTile * hd);

  // The step metadata was copied before the step's first kernel: it may be read before the wait.
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

  // Keys this tile can see: [lo, hi).
  const int first_pos = pos0 + q0, last_pos = pos0 + q0 + n_tok - 1;
  const int lo = a.window > 0 ? max(0, first_pos - a.window + 1) : 0;
  const int hi = last_pos + 1;
  int k_begin = lo, k_end = hi;
  int n_active = 1;  // splits that hold keys (chunks round up to whole tiles: the last ones may be empty)
  if (a.n_splits > 1) {
    const int chunk = ((hi - lo + a.n_splits - 1) / a.n_splits + kKeysPerTile - 1) / kKeysPerTile * kKeysPerTile;
    k_begin = min(hi, lo + split * chunk);
    k_end = min(hi, k_begin + chunk);
    n_active = min(a.n_splits, (hi - lo + chunk - 1) / chunk);
  }

  // A tile's K/V move through registers: item it of this thread is key (i / vec_per_key),
  // 16-byte piece (i % vec_per_key), i = threadIdx.x + it * blockDim.x; all loads of a tile are
  // in flight together, and the next tile's loads overlap this tile's arithmetic.
  const int vec_per_key = hd / 8;  // 16-byte pieces of one key's head vector
  const int n_items = kKeysPerTile * vec_per_key;  // <= DPL * kWarps * 32
  uint4 kreg[DPL], vreg[DPL];
  // Loads the items of tile kt whose key position p is in [from, to) (zeros for p >= k_end);
  // the others are left alone.
  auto load_tile = [&](int kt, int from, int to) {
#pragma unroll
    for (int it = 0; it < DPL; ++it) {
      const int i = threadIdx.x + it * kWarps * 32;
      const int p = kt + i / vec_per_key;
      if (i >= n_items || p < from || p >= to) continue;
      if (p < k_end) {
        const int64_t slot = int64_t(table[p / a.block_size]) * a.block_size + p % a.block_size;
        const int64_t off = (slot * a.n_kv_heads + kvh) * hd + (i % vec_per_key) * 8;
        kreg[it] = *reinterpret_cast<const uint4*>(a.k_pool + off);
        vreg[it] = *reinterpret_cast<const uint4*>(a.v_pool + off);
      } else {
        kreg[it] = make_uint4(0, 0, 0, 0);
        vreg[it] = make_uint4(0, 0, 0, 0);
      }
    }
  };
  // Decode fusion: the keys before this step's tokens were written by earlier steps, so the
  // first tile's loads of them start before the wait, under the previous kernel's tail.
  const bool fused = a.post.qkv != nullptr;
  if (fused && k_begin < k_end) load_tile(k_begin, k_begin, first_pos);
  pdl_wait();
  pdl_launch_dependents();
  // With the in-kernel combine a split without keys has nothing to add (the token's own
  // position lies in a split with keys, whose block writes its k and v): it leaves at once, and
  // the merge counts and reads the n_active splits only.
  if (a.split_counters != nullptr && a.n_splits > 1 && split >= n_active) return;

  // Rows: r = token_in_tile * group + head_in_group.
  if (!fused) {
    for (int i = threadIdx.x; i < n_rows * hd; i += blockDim.x) {
      const int r = i / hd, d = i % hd;
      const int t = tok_begin + q0 + r / group, h = kvh * group + r % group;
      sm.q[r * hd + d] = bf16_bits_to_f32(a.q[(int64_t(t) * a.n_heads + h) * hd + d]);
    }
  } else {
    const QkvPostArgs& p = a.post;
    // The block whose key range holds a token's own position makes its k and v and stores them
    // (one token per sequence: no other block reads that position). With at most kWarps / 2
    // tokens, warp 2i makes token i's k and warp 2i + 1 its v, in the same round as the warp's
    // first q row (both loads in flight), and the heads stay in sm.head for the first tile.
    const bool own_kv = 2 * n_tok <= kWarps;
    const int ti = warp >> 1;
    const bool is_k = (warp & 1) == 0;
    const bool has_task = own_kv && warp < 2 * n_tok && first_pos + ti >= k_begin && first_pos + ti < k_end;
    const bool has_row = warp < n_rows;
    const int t_task = tok_begin + q0 + ti, t_row = tok_begin + q0 + warp / group;
    float kv[DPL], qv[DPL];
    if (has_task) head_load<DPL>(p, t_task, a.n_heads + (is_k ? 0 : a.n_kv_heads) + kvh, lane, kv);
    if (has_row) head_load<DPL>(p, t_row, kvh * group + warp % group, lane, qv);
    if (has_task) {
      float* buf = sm.head + warp * hd;
      head_finish<DPL>(p, t_task, is_k, is_k ? p.k_norm : nullptr, kv, buf, lane);
      const int64_t slot = p.slot_mapping ? p.slot_mapping[t_task] : -1;
      if (slot >= 0) {
        uint16_t* dst = (is_k ? p.k_pool : p.v_pool) + (slot * a.n_kv_heads + kvh) * hd;
        for (int d = lane; d < hd; d += 32) dst[d] = __bfloat16_as_ushort(__float2bfloat16_rn(buf[d]));
      }
    }
    if (has_row) head_finish<DPL>(p, t_row, true, p.q_norm, qv, sm.q + warp * hd, lane);
    for (int r = warp + kWarps; r < n_rows; r += kWarps) {
      head_post<DPL>(p, tok_begin + q0 + r / group, kvh * group + r % group, true, p.q_norm, sm.q + r * hd, lane);
    }
    for (int task = warp; !own_kv && task < 2 * n_tok; task += kWarps) {
      const int i = task >> 1;
      const bool k_head = (task & 1) == 0;
      const int pos = first_pos + i;
      const int t = tok_begin + q0 + i;
      const int64_t slot = p.slot_mapping ? p.slot_mapping[t] : -1;
      if (pos < k_begin || pos >= k_end || slot < 0) continue;
      float* buf = sm.head + warp * hd;
      head_post<DPL>(p, t, a.n_heads + (k_head ? 0 : a.n_kv_heads) + kvh, k_head, k_head ? p.k_norm : nullptr, buf, lane);
      uint16_t* dst = (k_head ? p.k_pool : p.v_pool) + (slot * a.n_kv_heads + kvh) * hd;
      for (int d = lane; d < hd; d += 32) dst[d] = __bfloat16_as_ushort(__float2bfloat16_rn(buf[d]));
    }
  }
  // The first tile's rows of this step's own keys come from sm.head (no reload from the pools).
  const bool new_from_smem = fused && 2 * n_tok <= kWarps;

  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][DPL];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[rr][i] = 0.0f;
  }

  for (int kt = k_begin; kt < k_end; kt += kKeysPerTile) {
    __syncthreads();  // the previous tile's K/V are no longer read (and q, new k/v are written, first time)
    // The step's own keys: after the block wrote them (or from sm.head).
    if (kt == k_begin && !new_from_smem) load_tile(kt, fused ? first_pos : kt, INT_MAX);
#pragma unroll
    for (int it = 0; it < DPL; ++it) {
      const int i = threadIdx.x + it * kWarps * 32;
      if (i >= n_items) continue;
      const int j = i / vec_per_key, c = i % vec_per_key;
      if (new_from_smem && kt == k_begin && kt + j >= first_pos) {
        const int p = kt + j;
        if (p < k_end) {
          kreg[it] = pack8_bf16(sm.head + (2 * (p - first_pos)) * hd + c * 8);
          vreg[it] = pack8_bf16(sm.head + (2 * (p - first_pos) + 1) * hd + c * 8);
        } else {
          kreg[it] = make_uint4(0, 0, 0, 0);
          vreg[it] = make_uint4(0, 0, 0, 0);
        }
      }
      uint32_t* kd = sm.k + j * k_stride + c * 4;
      kd[0] = kreg[it].x;
      kd[1] = kreg[it].y;
      kd[2] = kreg[it].z;
      kd[3] = kreg[it].w;
      *reinterpret_cast<uint4*>(sm.v + j * hd + c * 8) = vreg[it];
    }
    if (kt + kKeysPerTile < k_end) load_tile(kt + kKeysPerTile, kt + kKeysPerTile, INT_MAX);
    __syncthreads();

    const int p = kt + lane;  // this lane's key
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp + rr * kWarps;
      if (r >= n_rows) break;
      const int qpos = pos0 + q0 + r / group;
      const float* qr = sm.q + r * hd;
      const uint32_t* kr = sm.k + lane * k_stride;
      // Two independent sums halve the dependent chain of multiply-adds.
      float dot0 = 0.0f, dot1 = 0.0f;
#pragma unroll 4
      for (int d2 = 0; d2 < hd / 2; ++d2) {
        const uint32_t w = kr[d2];
        dot0 = fmaf(qr[2 * d2], __uint_as_float(w << 16), dot0);
        dot1 = fmaf(qr[2 * d2 + 1], __uint_as_float(w & 0xffff0000u), dot1);
      }
      float s = (dot0 + dot1) * a.scale;
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
      // No branch on the weight (a key that is not visible has e = 0 and finite or zero v):
      // the unrolled loop keeps several shuffles and shared loads in flight.
#pragma unroll 8
      for (int j = 0; j < kKeysPerTile; ++j) {
        const float ej = __shfl_sync(0xffffffffu, e, j);
        const uint16_t* vr = sm.v + j * hd;
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
          const int d = lane + 32 * i;
          if (d < hd) acc[rr][i] = fmaf(ej, bf16_bits_to_f32(vr[d]), acc[rr][i]);
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
  if (a.n_splits == 1 || a.split_counters == nullptr) return;

  // The last split block of this (tile, KV head) to finish merges every split's rows.
  __shared__ int last;
  __shared__ float split_w[kWarps][32];
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(a.split_counters + tile * a.n_kv_heads + kvh, 1) == n_active - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int64_t stride = int64_t(a.n_tokens) * a.n_heads;
  for (int r = warp; r < n_rows; r += kWarps) {
    const int t = tok_begin + q0 + r / group, h = kvh * group + r % group;
    const int64_t row = int64_t(t) * a.n_heads + h;
    // Lane s holds split s (n_splits <= 32).
    const float ms = lane < n_active ? __ldcg(a.partial_ml + (lane * stride + row) * 2) : -INFINITY;
    const float ls = lane < n_active ? __ldcg(a.partial_ml + (lane * stride + row) * 2 + 1) : 0.0f;
    const float mx = warp_max(ms);
    const float wgt = ms == -INFINITY ? 0.0f : __expf(ms - mx);
    const float denom = warp_sum(ls * wgt);
    const float inv = denom > 0.0f ? 1.0f / denom : 0.0f;
    split_w[warp][lane] = wgt;
    __syncwarp();
    // The loads take no branch (a split's weight is applied by a select), so the unrolled
    // loop has many of them in flight instead of one L2 round trip per split.
    float o[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) o[i] = 0.0f;
#pragma unroll 8
    for (int s = 0; s < n_active; ++s) {
      const float ws = split_w[warp][s];
      const float* src = a.partial_out + (s * stride + row) * hd;
#pragma unroll
      for (int i = 0; i < DPL; ++i) {
        const int d = lane + 32 * i;
        const float x = d < hd ? __ldcg(src + d) : 0.0f;
        o[i] += ws != 0.0f ? ws * x : 0.0f;
      }
    }
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) a.out[row * hd + d] = __bfloat16_as_ushort(__float2bfloat16_rn(o[i] * inv));
    }
    __syncwarp();  // split_w is rewritten for this warp's next row
  }
  if (threadIdx.x == 0) a.split_counters[tile * a.n_kv_heads + kvh] = 0;
}

// One block per (token, head): merges the splits' partial results (n_splits <= 32). Warp 0
// turns the splits' (max, sum) into weights; then every thread's loads over the splits take
// no branch, so they are in flight together.
__global__ void attention_combine_kernel(PagedAttentionArgs a) {
  __shared__ float split_w[32];
  __shared__ float inv_s;
  pdl_wait();
  pdl_launch_dependents();
  const int64_t row = blockIdx.x;  // token * n_heads + head
  const int64_t stride = int64_t(a.n_tokens) * a.n_heads;
  if (threadIdx.x < 32) {
    const int s = threadIdx.x;
    const float ms = s < a.n_splits ? a.partial_ml[(s * stride + row) * 2] : -INFINITY;
    const float ls = s < a.n_splits ? a.partial_ml[(s * stride + row) * 2 + 1] : 0.0f;
    const float mx = warp_max(ms);
    const float wgt = ms == -INFINITY ? 0.0f : __expf(ms - mx);
    const float denom = warp_sum(ls * wgt);
    split_w[s] = wgt;
    if (s == 0) inv_s = denom > 0.0f ? 1.0f / denom : 0.0f;
  }
  __syncthreads();
  const float inv = inv_s;
  for (int d = threadIdx.x; d < a.head_dim; d += blockDim.x) {
    float o = 0.0f;
#pragma unroll 8
    for (int s = 0; s < a.n_splits; ++s) {
      const float x = a.partial_out[(s * stride + row) * a.head_dim + d];
      o += split_w[s] != 0.0f ? split_w[s] * x : 0.0f;
    }
    a.out[row * a.head_dim + d] = __bfloat16_as_ushort(__float2bfloat16_rn(o * inv));
  }
}

template <int DPL>
void launch_dpl(const PagedAttentionArgs& a, cudaStream_t stream) {
  const size_t smem = smem_bytes(a.head_dim);
  static bool raised = false;  // the attribute is per kernel and process-wide
  if (!raised) {
    STRATA_CUDA_CHECK(cudaFuncSetAttribute(paged_attention_kernel<DPL>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(smem_bytes(256))));
    raised = true;
  }
  if (a.split_counters != nullptr && a.n_splits > 32) {
    cuda_fatal(__FILE__, __LINE__, "launch_paged_attention", "in-kernel combine of " + std::to_string(a.n_splits) + " splits (at most 32)");
  }
  const dim3 grid(a.n_tiles, a.n_kv_heads, a.n_splits);
  launch_pdl(paged_attention_kernel<DPL>, grid, kWarps * 32, smem, stream, a);
}


// ---- Decode on the tensor cores: every tile one query token ----
// A block takes one (token, KV head, split). Its rows are the group's q heads (<= 16: one m16
// tile), so a 64-row flash tile would leave three of its four warps computing padding; here
// the four warps share each 64-key K/V tile instead, warp w taking keys 16w..16w+15 with its
// own running (max, sum, out), and the warps' results merge through shared memory at the end.
// K/V tiles stream through kDecStages cp.async stages, so two tiles are in flight while one is
// computed: the kernel is meant to be bound by the KV stream (big decode batches).
constexpr int kDecKeys = 64;
constexpr int kDecStages = 3;
constexpr int kDecRows = 16;
constexpr float kLog2e = 1.4426950408889634f;

using namespace mma;

template <int HD>
constexpr size_t decode_mma_smem() {
  return size_t(kDecStages) * 2 * kDecKeys * HD * sizeof(uint16_t) + size_t(kDecRows) * HD * sizeof(uint16_t);
}

template <int HD>
__global__ void __launch_bounds__(kWarps * 32, 2) decode_mma_kernel(PagedAttentionArgs a) {
  constexpr int kChunks = HD / 8;  // 16-byte chunks per row
  constexpr int kSteps = HD / 16;  // k-steps of Q K^T; also pairs of output n-tiles
  constexpr int kLoads = kDecKeys * kChunks / (kWarps * 32);
  static_assert(size_t(kWarps) * kDecRows * HD * sizeof(float) <= size_t(kDecStages) * 2 * kDecKeys * HD * sizeof(uint16_t),
                "the warps' outputs reuse the K/V stages");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  uint16_t* sk = reinterpret_cast<uint16_t*>(smem_raw);  // [stages, kDecKeys, HD]
  uint16_t* sv = sk + kDecStages * kDecKeys * HD;        // [stages, kDecKeys, HD]
  uint16_t* sq = sv + kDecStages * kDecKeys * HD;        // [kDecRows, HD]
  __shared__ float red_m[kWarps][kDecRows], red_l[kWarps][kDecRows];

  // KV heads vary fastest over the grid: blocks running together read a sequence's slots
  // whole (n_kv_heads * head_dim contiguous elements) instead of one head's slice of each.
  const int kvh = blockIdx.x, tile = blockIdx.y, split = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int seq = a.tile_seq[tile];
  const int tok = a.seq_q_start[seq] + a.tile_q0[tile];
  const int qpos = a.seq_pos0[seq] + a.tile_q0[tile];
  const int group = a.n_heads / a.n_kv_heads;
  const int* table = a.block_tables + int64_t(seq) * a.max_blocks_per_seq;
  const int lo = a.window > 0 ? max(0, qpos - a.window + 1) : 0;
  const int hi = qpos + 1;
  int k_begin = lo, k_end = hi;
  if (a.n_splits > 1) {
    const int chunk = ((hi - lo + a.n_splits - 1) / a.n_splits + kDecKeys - 1) / kDecKeys * kDecKeys;
    k_begin = min(hi, lo + split * chunk);
    k_end = min(hi, k_begin + chunk);
  }
  const int n_kt = (k_end - k_begin + kDecKeys - 1) / kDecKeys;
  const int bs = a.block_size;
  const bool bs_pow2 = (bs & (bs - 1)) == 0;
  const int bs_shift = __ffs(bs) - 1;

  // q and this step's own k/v were written by the kernel before.
  pdl_wait();
  pdl_launch_dependents();

  for (int i = tid; i < kDecRows * kChunks; i += kWarps * 32) {
    const int r = i / kChunks, c = i % kChunks;
    const bool valid = r < group;
    const uint16_t* src = valid ? a.q + (int64_t(tok) * a.n_heads + kvh * group + r) * HD + c * 8 : a.q;
    cp_async16(smem_addr(sq + swz<HD>(r, c)), src, valid);
  }
  auto load_kv = [&](int stage, int kt) {
    uint16_t* dk = sk + stage * kDecKeys * HD;
    uint16_t* dv = sv + stage * kDecKeys * HD;
#pragma unroll
    for (int it = 0; it < kLoads; ++it) {
      const int i = tid + it * kWarps * 32;
      const int j = i / kChunks, c = i % kChunks;
      const int p = kt + j;
      const bool valid = p < k_end;
      int64_t off = 0;
      if (valid) {
        const int blk = bs_pow2 ? p >> bs_shift : p / bs, in_blk = bs_pow2 ? p & (bs - 1) : p % bs;
        off = ((int64_t(table[blk]) * bs + in_blk) * a.n_kv_heads + kvh) * HD + c * 8;
      }
      cp_async16(smem_addr(dk + swz<HD>(j, c)), a.k_pool + off, valid);
      cp_async16(smem_addr(dv + swz<HD>(j, c)), a.v_pool + off, valid);
    }
  };
  // Q rides in the first group with tile 0.
#pragma unroll
  for (int s = 0; s < kDecStages - 1; ++s) {
    if (s < n_kt) load_kv(s, k_begin + s * kDecKeys);
    cp_async_commit();
  }

  // This thread's rows g and g + 8 (padding rows past the group see nothing).
  const int qp0 = g < group ? qpos : -1, qp1 = g + 8 < group ? qpos : -1;
  const float s_scale = a.scale * kLog2e;
  const bool capped = a.softcap > 0.0f;
  const float cap_in = capped ? a.scale / a.softcap : 0.0f, cap_out = a.softcap * kLog2e;
  uint32_t qf[kSteps][4];
  float o[2 * kSteps][4];
#pragma unroll
  for (int i = 0; i < 2 * kSteps; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

  for (int it = 0; it < n_kt; ++it) {
    cp_async_wait<kDecStages - 2>();
    __syncthreads();  // tile it has landed for every thread; tile it - 1's stage is free
    if (it == 0) {
#pragma unroll
      for (int ks = 0; ks < kSteps; ++ks) {
        ldmatrix_x4(qf[ks], smem_addr(sq + swz<HD>((lane & 7) + ((lane >> 3) & 1) * 8, ks * 2 + (lane >> 4))));
      }
    }
    const int nx = it + kDecStages - 1;
    if (nx < n_kt) load_kv(nx % kDecStages, k_begin + nx * kDecKeys);
    cp_async_commit();
    const uint16_t* ck = sk + (it % kDecStages) * kDecKeys * HD;
    const uint16_t* cv = sv + (it % kDecStages) * kDecKeys * HD;
    const int kt = k_begin + it * kDecKeys;

    // S = Q K^T for this warp's 16 keys: n-tile j holds keys 16 warp + 8j ..
    float s[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      uint32_t b[4];
      const int key = warp * 16 + (lane & 7) + (lane >> 4) * 8;
      ldmatrix_x4(b, smem_addr(ck + swz<HD>(key, ks * 2 + ((lane >> 3) & 1))));
      mma_bf16(s[0], qf[ks], b[0], b[1]);
      mma_bf16(s[1], qf[ks], b[2], b[3]);
    }
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[j][e];
        x = capped ? cap_out * tanhf(x * cap_in) : x * s_scale;
        const int p = kt + warp * 16 + j * 8 + 2 * t4 + (e & 1);
        const int qp = e < 2 ? qp0 : qp1;
        const bool visible = p < k_end && p <= qp && (a.window == 0 || qp - p < a.window);
        s[j][e] = visible ? x : -INFINITY;
      }
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
    uint32_t pf[4];  // P as one A fragment (16 rows x this warp's 16 keys)
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float p0 = fast_exp2(s[j][0] - base0), p1 = fast_exp2(s[j][1] - base0);
      const float p2 = fast_exp2(s[j][2] - base1), p3 = fast_exp2(s[j][3] - base1);
      sum0 += p0 + p1;
      sum1 += p2 + p3;
      pf[j * 2] = pack_bf16(p0, p1);
      pf[j * 2 + 1] = pack_bf16(p2, p3);
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
    // O += P V over the warp's 16 keys, n-tiles over the head dims (two per ldmatrix).
#pragma unroll
    for (int dp = 0; dp < kSteps; ++dp) {
      uint32_t b[4];
      const int key = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
      ldmatrix_x4_trans(b, smem_addr(cv + swz<HD>(key, dp * 2 + (lane >> 4))));
      mma_bf16(o[2 * dp], pf, b[0], b[1]);
      mma_bf16(o[2 * dp + 1], pf, b[2], b[3]);
    }
  }
  cp_async_wait<0>();

  // Merge the four warps: each row's maximum over the warps, every warp's output rescaled to
  // it in shared memory (the K/V stages are free once every warp is past the barrier), then
  // summed over the warps.
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  if (t4 == 0) {
    red_m[warp][g] = m0;
    red_m[warp][g + 8] = m1;
    red_l[warp][g] = l0;
    red_l[warp][g + 8] = l1;
  }
  __syncthreads();
  auto row_max = [&](int r) {
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, red_m[w][r]);
    return mx;
  };
  float* ob = reinterpret_cast<float*>(smem_raw);  // [kWarps, kDecRows, HD]
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = g + 8 * half;
    if (r >= group) continue;
    const float m = half == 0 ? m0 : m1;
    const float f = m == -INFINITY ? 0.0f : fast_exp2(m - row_max(r));
    float* dst = ob + (warp * kDecRows + r) * HD + 2 * t4;
#pragma unroll
    for (int i = 0; i < 2 * kSteps; ++i) {
      dst[8 * i] = o[i][2 * half] * f;
      dst[8 * i + 1] = o[i][2 * half + 1] * f;
    }
  }
  __syncthreads();
  const int64_t stride = int64_t(a.n_tokens) * a.n_heads;
  for (int i = tid; i < group * HD; i += kWarps * 32) {
    const int r = i / HD, d = i % HD;
    const float mx = row_max(r);
    float sum = 0.0f, l = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      sum += ob[(w * kDecRows + r) * HD + d];
      l += red_m[w][r] == -INFINITY ? 0.0f : red_l[w][r] * fast_exp2(red_m[w][r] - mx);
    }
    const int64_t row = int64_t(tok) * a.n_heads + kvh * group + r;
    if (a.n_splits == 1) {
      a.out[row * HD + d] = __bfloat16_as_ushort(__float2bfloat16_rn(l > 0.0f ? sum / l : 0.0f));
    } else {
      const int64_t prow = int64_t(split) * stride + row;
      a.partial_out[prow * HD + d] = sum;
      if (d == 0) {
        // The split's maximum back in the natural-log domain, as the combine expects.
        a.partial_ml[prow * 2] = mx == -INFINITY ? -INFINITY : mx / kLog2e;
        a.partial_ml[prow * 2 + 1] = l;
      }
    }
  }
}

template <int HD>
void launch_decode_mma(const PagedAttentionArgs& a, cudaStream_t stream) {
  static bool raised = false;  // the attribute is per kernel and process-wide
  if (!raised) {
    STRATA_CUDA_CHECK(cudaFuncSetAttribute(decode_mma_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(decode_mma_smem<HD>())));
    raised = true;
  }
  const dim3 grid(a.n_kv_heads, a.n_tiles, a.n_splits);
  launch_pdl(decode_mma_kernel<HD>, grid, kWarps * 32, decode_mma_smem<HD>(), stream, a);
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
  // Tiles cover the tokens and hold at least one each: as many tiles as tokens means every
  // tile is one decode token.
  // (Tiles go on grid y, at most 65535 of them.)
  if (a.post.qkv == nullptr && a.batch_invariant == 0 && a.n_tiles == a.n_tokens && a.n_tiles <= 65535 && group <= kDecRows &&
      (a.head_dim == 64 || a.head_dim == 128) && launch_tuning().decode_mma_attention) {
    if (a.head_dim == 64) {
      launch_decode_mma<64>(a, stream);
    } else {
      launch_decode_mma<128>(a, stream);
    }
    return;
  }
  if (a.post.qkv == nullptr && flash_attention_supports(a.head_dim) && a.n_splits == 1 &&
      a.tokens_per_tile * group <= flash_attention_rows()) {
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
  if (a.n_tokens == 0 || a.n_splits <= 1 || a.split_counters != nullptr) return;
  if (a.n_splits > 32) cuda_fatal(__FILE__, __LINE__, "launch_attention_combine", "n_splits " + std::to_string(a.n_splits) + " (at most 32)");
  launch_pdl(attention_combine_kernel, a.n_tokens * a.n_heads, 128, 0, stream, a);
}

}  // namespace strata::cuda
