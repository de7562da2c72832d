// Element-wise and row-wise kernels of the decoder forward (see kernels.h).
#include <cuda_bf16.h>

#include <cfloat>
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace strata::cuda {
namespace {

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024).
__device__ float block_sum(float v) {
  __shared__ float part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // part may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const int n_warps = blockDim.x >> 5;
  float t = lane < n_warps ? part[lane] : 0.0f;
  return warp_sum(t);
}

__global__ void embed_kernel(EmbedArgs a) {
  const int t = blockIdx.x;
  const int64_t id = a.ids[t];
  const uint16_t* row = a.table + id * a.hidden;
  float* out = a.out + int64_t(t) * a.hidden;
  float ss = 0.0f;
  for (int c = threadIdx.x; c < a.hidden; c += blockDim.x) {
    const float v = bf16_bits_to_f32(row[c]) * a.scale;
    out[c] = v;
    if (a.norm_out) {
      const float w = a.norm_one_plus_w ? 1.0f + a.norm_w[c] : a.norm_w[c];
      a.norm_out[int64_t(t) * a.hidden + c] = f32_to_bf16_bits(v * w);
      ss += v * v;
    }
  }
  if (a.norm_out) {
    ss = block_sum(ss);
    if (threadIdx.x == 0) a.ss_out[t] = ss;
  }
}

// With dim % 4 == 0 (every real hidden size) the row moves as float4 / 4 x bf16.
__global__ void add_rms_norm_kernel(AddRmsNormArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const int r = blockIdx.x;
  float* x = a.x + int64_t(a.row_map ? a.row_map[r] : r) * a.dim;
  const float* br = a.branch ? a.branch + int64_t(r) * a.dim : nullptr;
  uint16_t* out = a.out + int64_t(r) * a.dim;
  float ss = 0.0f;
  if ((a.dim & 3) == 0) {
    const int d4 = a.dim / 4;
    float4* x4 = reinterpret_cast<float4*>(x);
    for (int c = threadIdx.x; c < d4; c += blockDim.x) {
      float4 v = x4[c];
      if (br) {
        const float4 b = reinterpret_cast<const float4*>(br)[c];
        const float4 bb = a.branch_bias ? reinterpret_cast<const float4*>(a.branch_bias)[c] : make_float4(0, 0, 0, 0);
        v.x += b.x + bb.x;
        v.y += b.y + bb.y;
        v.z += b.z + bb.z;
        v.w += b.w + bb.w;
        x4[c] = v;
      }
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    const float inv = rsqrtf(block_sum(ss) / float(a.dim) + a.eps);
    // Each thread rereads only the elements it wrote itself: no barrier needed.
    for (int c = threadIdx.x; c < d4; c += blockDim.x) {
      const float4 v = x4[c];
      float4 w = reinterpret_cast<const float4*>(a.w)[c];
      if (a.one_plus_w) w = make_float4(1.0f + w.x, 1.0f + w.y, 1.0f + w.z, 1.0f + w.w);
      const uint32_t lo = uint32_t(f32_to_bf16_bits(v.x * inv * w.x)) | (uint32_t(f32_to_bf16_bits(v.y * inv * w.y)) << 16);
      const uint32_t hi = uint32_t(f32_to_bf16_bits(v.z * inv * w.z)) | (uint32_t(f32_to_bf16_bits(v.w * inv * w.w)) << 16);
      reinterpret_cast<uint2*>(out)[c] = make_uint2(lo, hi);
    }
    return;
  }
  for (int c = threadIdx.x; c < a.dim; c += blockDim.x) {
    float v = x[c];
    if (br) {
      v += br[c] + (a.branch_bias ? a.branch_bias[c] : 0.0f);
      x[c] = v;
    }
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss) / float(a.dim) + a.eps);
  // Each thread rereads only the elements it wrote itself: no barrier needed.
  for (int c = threadIdx.x; c < a.dim; c += blockDim.x) {
    const float w = a.one_plus_w ? 1.0f + a.w[c] : a.w[c];
    out[c] = f32_to_bf16_bits(x[c] * inv * w);
  }
}

// One block (or, for few tokens, gridDim.y blocks) per token; one warp per head (q heads, then
// k heads, then v heads).
__global__ void qkv_post_kernel(QkvPostArgs a) {
  extern __shared__ float head_buf[];  // [warps, head_dim]
  pdl_wait();
  pdl_launch_dependents();
  const int t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  const int hd = a.head_dim;
  const int total_heads = a.n_heads + 2 * a.n_kv_heads;
  const int row_len = total_heads * hd;
  const float* row = a.qkv + int64_t(t) * row_len;
  float* buf = head_buf + warp * hd;
  const int pos = a.positions[t];
  const int64_t slot = a.slot_mapping ? a.slot_mapping[t] : -1;
  for (int h = blockIdx.y * n_warps + warp; h < total_heads; h += n_warps * gridDim.y) {
    const bool is_q = h < a.n_heads;
    const bool is_k = !is_q && h < a.n_heads + a.n_kv_heads;
    float ss = 0.0f;
    for (int d = lane; d < hd; d += 32) {
      float v = row[h * hd + d] + (a.bias ? a.bias[h * hd + d] : 0.0f);
      buf[d] = v;
      ss += v * v;
    }
    const float* nw = is_q ? a.q_norm : (is_k ? a.k_norm : nullptr);
    if (nw) {
      const float inv = rsqrtf(warp_sum(ss) / float(hd) + a.norm_eps);
      for (int d = lane; d < hd; d += 32) buf[d] = buf[d] * inv * (a.norm_one_plus_w ? 1.0f + nw[d] : nw[d]);
    }
    __syncwarp();
    if ((is_q || is_k) && a.rot_dim > 0) {
      const int half = a.rot_dim / 2;
      // Each lane rotates whole pairs, so reads and writes of a pair stay in one lane.
      for (int i = lane; i < half; i += 32) {
        const float theta = float(pos) * a.inv_freq[i];
        float s, c;
        sincosf(theta, &s, &c);
        c *= a.attn_factor;
        s *= a.attn_factor;
        const float x0 = buf[i], x1 = buf[i + half];
        buf[i] = x0 * c - x1 * s;
        buf[i + half] = x1 * c + x0 * s;
      }
      __syncwarp();
    }
    if (a.f32_out != nullptr) {
      for (int d = lane; d < hd; d += 32) a.f32_out[int64_t(t) * row_len + h * hd + d] = buf[d];
    }
    uint16_t* dst;
    if (is_q) {
      dst = a.q_out + (int64_t(t) * a.n_heads + h) * hd;
    } else if (slot >= 0) {
      const int kvh = is_k ? h - a.n_heads : h - a.n_heads - a.n_kv_heads;
      dst = (is_k ? a.k_pool : a.v_pool) + (slot * a.n_kv_heads + kvh) * hd;
    } else {
      dst = nullptr;
    }
    if (dst) {
      for (int d = lane; d < hd; d += 32) dst[d] = f32_to_bf16_bits(buf[d]);
    }
    __syncwarp();  // buf is reused by this warp's next head
  }
}

__device__ __forceinline__ float act_fn(float x, Act act) {
  if (act == Act::kSilu) return x / (1.0f + expf(-x));
  const float k = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

// Grid: x over a row's outputs, y over tokens (no division per element). With inter % 8 == 0
// each thread handles 8 outputs through 16-byte loads and stores.
__global__ void gated_act_kernel(GatedActArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const bool vec = (a.inter & 7) == 0;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t t = blockIdx.y; t < a.n; t += gridDim.y) {
    const uint16_t* gate = a.gate_up + t * 2 * a.inter;
    const uint16_t* up = gate + a.inter;
    uint16_t* out = a.out + t * a.inter;
    if (vec) {
      for (int64_t c = first * 8; c < a.inter; c += step * 8) {
        const uint4 gv = *reinterpret_cast<const uint4*>(gate + c);
        const uint4 uv = *reinterpret_cast<const uint4*>(up + c);
        const uint32_t gw[4] = {gv.x, gv.y, gv.z, gv.w}, uw[4] = {uv.x, uv.y, uv.z, uv.w};
        uint32_t ow[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float lo = act_fn(__uint_as_float(gw[i] << 16), a.act) * __uint_as_float(uw[i] << 16);
          const float hi = act_fn(__uint_as_float(gw[i] & 0xffff0000u), a.act) * __uint_as_float(uw[i] & 0xffff0000u);
          ow[i] = uint32_t(f32_to_bf16_bits(lo)) | (uint32_t(f32_to_bf16_bits(hi)) << 16);
        }
        *reinterpret_cast<uint4*>(out + c) = make_uint4(ow[0], ow[1], ow[2], ow[3]);
      }
    } else {
      for (int64_t c = first; c < a.inter; c += step) {
        out[c] = f32_to_bf16_bits(act_fn(bf16_bits_to_f32(gate[c]), a.act) * bf16_bits_to_f32(up[c]));
      }
    }
  }
}

__global__ void argmax_kernel(ArgmaxArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const float* row = a.logits + int64_t(blockIdx.x) * a.vocab;
  float best = -INFINITY;
  int idx = INT32_MAX;
  for (int c = threadIdx.x; c < a.vocab; c += blockDim.x) {
    const float v = row[c];
    // NaN never wins; the first value seen wins over later equal ones (c rises per thread).
    if (v == v && (idx == INT32_MAX || v > best)) {
      best = v;
      idx = c;
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ob > best || (ob == best && oi < idx)) {
      best = ob;
      idx = oi;
    }
  }
  __shared__ float sb[32];
  __shared__ int si[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sb[warp] = best;
    si[warp] = idx;
  }
  __syncthreads();
  if (warp == 0) {
    const int n_warps = blockDim.x >> 5;
    best = lane < n_warps ? sb[lane] : -INFINITY;
    idx = lane < n_warps ? si[lane] : INT32_MAX;
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
      if (ob > best || (ob == best && oi < idx)) {
        best = ob;
        idx = oi;
      }
    }
    if (lane == 0) a.out[blockIdx.x] = idx == INT32_MAX ? 0 : idx;
  }
}

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_random_bf16_kernel(uint16_t* out, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ull + uint64_t(i));
    const float u = float(h >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    out[i] = f32_to_bf16_bits((2.0f * u - 1.0f) * scale);
  }
}

__global__ void fill_f32_kernel(float* out, int64_t n, float value) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) out[i] = value;
}

int grid_for(int64_t n, int threads) {
  const int64_t g = (n + threads - 1) / threads;
  return int(g < 65535 * 16 ? (g < 1 ? 1 : g) : 65535 * 16);
}

}  // namespace

namespace {
LaunchTuning g_tuning;
}  // namespace

void set_launch_tuning(const LaunchTuning& t) { g_tuning = t; }
LaunchTuning launch_tuning() { return g_tuning; }

void launch_embed(const EmbedArgs& a, cudaStream_t stream) {
  if (a.n == 0) return;
  embed_kernel<<<a.n, 256, 0, stream>>>(a);
  STRATA_CUDA_CHECK_LAUNCH();
}

void launch_add_rms_norm(const AddRmsNormArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  const int threads = a.dim >= 2048 ? 512 : (a.dim >= 512 ? 256 : 128);
  launch_pdl(add_rms_norm_kernel, a.rows, threads, 0, stream, a);
}

void launch_qkv_post(const QkvPostArgs& a, cudaStream_t stream) {
  if (a.n == 0) return;
  const int warps = 8;
  // Few tokens (decode): spread a token's heads over several blocks instead of one.
  const int total_heads = a.n_heads + 2 * a.n_kv_heads;
  const int head_blocks = a.n >= 128 ? 1 : (total_heads + warps - 1) / warps;
  const dim3 grid(a.n, head_blocks);
  launch_pdl(qkv_post_kernel, grid, warps * 32, size_t(warps) * a.head_dim * sizeof(float), stream, a);
}

void launch_gated_act(const GatedActArgs& a, cudaStream_t stream) {
  if (a.n == 0 || a.inter == 0) return;
  const int64_t per_thread = (a.inter & 7) == 0 ? 8 : 1;
  const dim3 grid(unsigned((a.inter + 256 * per_thread - 1) / (256 * per_thread)), unsigned(a.n < 65535 ? a.n : 65535));
  launch_pdl(gated_act_kernel, grid, 256, 0, stream, a);
}

void launch_argmax(const ArgmaxArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  launch_pdl(argmax_kernel, a.rows, 1024, 0, stream, a);
}

void launch_fill_random_bf16(uint16_t* out, int64_t n, uint64_t seed, float scale, cudaStream_t stream) {
  if (n == 0) return;
  fill_random_bf16_kernel<<<grid_for(n, 256), 256, 0, stream>>>(out, n, seed, scale);
  STRATA_CUDA_CHECK_LAUNCH();
}

void launch_fill_f32(float* out, int64_t n, float value, cudaStream_t stream) {
  if (n == 0) return;
  fill_f32_kernel<<<grid_for(n, 256), 256, 0, stream>>>(out, n, value);
  STRATA_CUDA_CHECK_LAUNCH();
}

}  // namespace strata::cuda
