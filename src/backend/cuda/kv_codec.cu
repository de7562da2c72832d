// KV codec rows on the GPU (see kv_codec.h): the encoder and the split-KV decode attention.
//
// Encoder: one warp per (token, KV head) row. The row is built in shared memory as 32-bit words
// (bytes little-endian, codes OR-ed in) and stored whole. Every value is computed with the
// reference's own arithmetic (IEEE division and square root, round-to-nearest-even, the
// Walsh-Hadamard butterflies in the same pairing, the turbo |y|^2 and the fp8 / turbo3 scale
// searches' fits summed in double in the reference's order: each lane sums its dims l, l + 32,
// ..., then the xor butterfly combines the lanes; every candidate is fitted by the whole warp,
// the first best kept), so the bytes are the reference's.
//
// Attention, two split kernels. The tensor-core kernel (head dims 64 and 128, GQA groups up to
// 8; kv_codec_mma.cu) runs by default. The CUDA-core kernel below takes
// every other layout: a block (4 warps) takes one KV head of one sequence and one split of its keys;
// warp w takes the split's tiles w, w + 4, ... of 1024 / head_dim keys. A warp copies its next
// tiles' encoded K and V rows into shared memory with cp.async (3 to 6 tiles in flight; the
// split's block-table entries are cached in shared memory first) and scores the current one.
// A warp scores several keys at once: each key belongs to a lane group of head_dim / 16
// lanes, each lane owning 16 consecutive dims of the key and value rows (so an affine lane
// sees one group: one scale and bias). A row part dequantizes in registers to "unit" values u
// with x = mul * u + add per row part; the dot is mul * sum(q u) + add * sum(q), and the value
// sum gets (e * mul) * u per dim and e * add once per row part. Keys are scored a tile at a
// time (the softmax rescale happens once per tile); the lane groups, then the warps, merge at
// the end, and the split partials (max, sum of exp, unnormalized sums) are merged by a second
// kernel, which also rotates turbo3 outputs back.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kv_codec.h"
#include "backend/cuda/kv_codec_common.cuh"
#include "backend/cuda/kv_codec_encode.cuh"
#include "backend/cuda/pdl.cuh"

// Defined with the row formats (backend/reference/kv_codec.cpp); that header is C++20.
namespace strata {
extern const float kLloydMax3[8];
extern const float kKvFp8ScaleSteps[16];
extern const float kKvTurboScaleSteps[17];
uint64_t kv_rotation_seed(int32_t layer, int32_t kv_head);
void kv_rotation_signs(uint64_t seed, int32_t dim, float* signs);
}  // namespace strata

namespace strata::cuda {

using namespace kv_codec_detail;

namespace {

constexpr int kMaxDim = 256;
constexpr int kMaxRowWords = 256;   // rows of at most 1,024 bytes
constexpr int kMaxSplits = 64;

TurboConsts turbo_consts(int32_t seed_layer, int32_t n_kv_heads, int32_t dim) {
  TurboConsts c{};
  for (int i = 0; i < 8; ++i) c.levels[i] = kLloydMax3[i];
  float signs[kMaxDim];
  for (int32_t h = 0; h < n_kv_heads; ++h) {
    kv_rotation_signs(kv_rotation_seed(seed_layer, h), dim, signs);
    for (int32_t d = 0; d < dim; ++d) {
      const int32_t bit = h * dim + d;
      if (signs[d] < 0.0f) c.sign_bits[bit / 32] |= 1u << (bit % 32);
    }
  }
  return c;
}

__device__ __forceinline__ float sign_of(const TurboConsts& c, int bit) {
  return (c.sign_bits[bit >> 5] >> (bit & 31)) & 1u ? -1.0f : 1.0f;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_min(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ uint32_t f32_to_bf16_bits(float x) {
  return uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(x)));
}

// ---------------------------------------------------------------------------------------------
// Encoder

__device__ __forceinline__ void or_byte(uint32_t* w, int byte, uint32_t v) {
  atomicOr(w + (byte >> 2), v << (8 * (byte & 3)));
}

EncodeSteps encode_steps() {
  EncodeSteps e{};
  for (int i = 0; i < kFp8Candidates; ++i) e.fp8[i] = kKvFp8ScaleSteps[i];
  for (int i = 0; i < kTurboCandidates; ++i) e.turbo[i] = kKvTurboScaleSteps[i];
  return e;
}

constexpr int kEncWarps = 4;

// Encodes row x (dim floats in shared memory, overwritten by turbo3) into w (the row's words in
// shared memory, zeroed): the whole warp, the reference's arithmetic. src: the row's bf16 bits
// when it came from bf16 (bf16 rows copy them), null when it came from f32. sign(bit): turbo3's
// rotation sign of bit h * dim + d; levels: its codebook.
template <class Sign>
__device__ __forceinline__ void encode_row(const KvRowLayout& f, float* x, uint32_t* w, const uint16_t* src, int lane, int h,
                                           const Sign& sign, const float* levels, const EncodeSteps& es) {
  const int dim = f.dim;
  switch (f.kind) {
    case Kind::kF32: break;  // kv_codec_write_f32_kernel
    case Kind::kBf16:
      for (int i = lane; i < dim / 2; i += 32) {
        w[i] = src == nullptr ? f32_to_bf16_bits(x[2 * i]) | (f32_to_bf16_bits(x[2 * i + 1]) << 16)
                              : uint32_t(src[2 * i]) | (uint32_t(src[2 * i + 1]) << 16);
      }
      break;
    case Kind::kFp8: {
      float amax = 0.0f;
      for (int d = lane; d < dim; d += 32) amax = fmaxf(amax, fabsf(x[d]));
      amax = warp_max(amax);
      // The reference's search, each candidate fitted by the whole warp (every lane gets the
      // same sums, so every lane makes the same first-best choice); the best codes'
      // least-squares scale.
      const float base = amax / 448.0f;
      float pick = base, scale = base;
      if (base > 0.0f) {
        float xr[kEncDimsPerLane];
#pragma unroll
        for (int i = 0; i < kEncDimsPerLane; ++i) xr[i] = lane + 32 * i < dim ? x[lane + 32 * i] : 0.0f;
        double best = 0.0;
        for (int c = 0; c < kFp8Candidates; ++c) {
          const float s = base * es.fp8[c];
          const Fit fit = fp8_fit(xr, lane, dim, s);
          const double score = fit.yc * fit.yc / fit.cc;
          if (score > best) best = score, pick = s, scale = float(fit.yc / fit.cc);
        }
      }
      const float inv = pick > 0.0f ? 1.0f / pick : 0.0f;
      if (lane == 0) w[0] = __float_as_uint(scale);
      for (int d = lane; d < dim; d += 32) or_byte(w, 4 + d, f32_to_e4m3(x[d] * inv));
      break;
    }
    case Kind::kAffine8:
    case Kind::kAffine4: {
      const bool eight = f.kind == Kind::kAffine8;
      const int qmax = eight ? 255 : 15;
      const int packed = eight ? (dim + 3) / 4 * 4 : (dim + 7) / 8 * 4;
      const int n_groups = dim / f.group;
      for (int g = 0; g < n_groups; ++g) {
        const float* xg = x + g * f.group;
        float mn = INFINITY, mx = -INFINITY;
        for (int i = lane; i < f.group; i += 32) mn = fminf(mn, xg[i]), mx = fmaxf(mx, xg[i]);
        mn = warp_min(mn);
        mx = warp_max(mx);
        const uint32_t s16 = f32_to_bf16_bits((mx - mn) / float(qmax)), b16 = f32_to_bf16_bits(mn);
        if (lane == 0) {
          or_byte(w, packed + 2 * g, s16 & 0xff);
          or_byte(w, packed + 2 * g + 1, s16 >> 8);
          or_byte(w, packed + 2 * (n_groups + g), b16 & 0xff);
          or_byte(w, packed + 2 * (n_groups + g) + 1, b16 >> 8);
        }
        const float s = bf16_to_f32(s16), b = bf16_to_f32(b16);
        for (int i = lane; i < f.group; i += 32) {
          const int d = g * f.group + i;
          const int q = s > 0.0f ? min(max(int(rintf((xg[i] - b) / s)), 0), qmax) : 0;
          if (eight) {
            or_byte(w, d, uint32_t(q));
          } else {
            or_byte(w, d / 2, uint32_t(q) << (4 * (d % 2)));
          }
        }
      }
      break;
    }
    case Kind::kTurbo3: {
      // y = H (s . x) / sqrt(dim): the reference's butterflies, stage by stage.
      for (int d = lane; d < dim; d += 32) x[d] *= sign(h * dim + d);
      __syncwarp();
      for (int len = 1; len < dim; len <<= 1) {
        for (int k = lane; k < dim / 2; k += 32) {
          const int j = (k / len) * 2 * len + k % len;
          const float p = x[j], r = x[j + len];
          x[j] = p + r;
          x[j + len] = p - r;
        }
        __syncwarp();
      }
      const float norm = 1.0f / sqrtf(float(dim));
      for (int d = lane; d < dim; d += 32) x[d] *= norm;
      __syncwarp();
      float xr[kEncDimsPerLane];
      double ss = 0.0;
#pragma unroll
      for (int i = 0; i < kEncDimsPerLane; ++i) {
        xr[i] = lane + 32 * i < dim ? x[lane + 32 * i] : 0.0f;
        if (lane + 32 * i < dim) ss += double(xr[i]) * double(xr[i]);
      }
      ss = warp_tree_sum(ss);  // the reference's order
      const float rms = float(sqrt(ss / double(dim)));
      // The reference's search, its two refits and the scale |y|^2 / <y, c>, each fit by the
      // whole warp (every lane gets the same sums and makes the same choices).
      float pick = rms, scale = rms;
      if (rms > 0.0f) {
        double best = 0.0;
        for (int c = 0; c < kTurboCandidates; ++c) {
          const float s = rms * es.turbo[c];
          const Fit fit = turbo_fit(xr, lane, dim, s, levels);
          const double score = fit.yc * fit.yc / fit.cc;
          if (score > best) best = score, pick = s;
        }
        for (int it = 0; it < 2; ++it) {
          const Fit fit = turbo_fit(xr, lane, dim, pick, levels);
          pick = float(fit.yc / fit.cc);
        }
        scale = float(ss / turbo_fit(xr, lane, dim, pick, levels).yc);
      }
      const float inv = pick > 0.0f ? 1.0f / pick : 0.0f;
      if (lane == 0) w[0] = __float_as_uint(scale);
      for (int d = lane; d < dim; d += 32) {
        const uint32_t c = nearest_level(x[d] * inv, levels);
        const int bit = 3 * d;
        atomicOr(w + 1 + (bit >> 5), c << (bit & 31));
        if ((bit & 31) > 29) atomicOr(w + 2 + (bit >> 5), c >> (32 - (bit & 31)));
      }
      break;
    }
  }
}

// Token t's destination slot in the pool (< 0: skip it) and, through src_t, its source row:
// t itself, or with block conversion (src_blocks) its position in source block t / block_size.
__device__ __forceinline__ int64_t write_slot(const KvCodecWriteArgs& a, int64_t t, int64_t* src_t) {
  if (a.src_blocks == nullptr) return a.slot_mapping[t];
  const int64_t b = t / a.block_size, j = t - b * a.block_size;
  *src_t = int64_t(a.src_blocks[b]) * a.block_size + j;
  return int64_t(a.dst_blocks[b]) * a.block_size + j;
}

__global__ void __launch_bounds__(kEncWarps * 32) kv_codec_write_kernel(KvCodecWriteArgs a, TurboConsts tc,
                                                                       EncodeSteps es) {
  __shared__ float xs[kEncWarps][kMaxDim];
  __shared__ uint32_t ws[kEncWarps][kMaxRowWords];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  pdl_wait();
  pdl_launch_dependents();
  const int64_t row = int64_t(blockIdx.x) * kEncWarps + warp;
  if (row >= int64_t(a.n_tokens) * a.n_kv_heads) return;
  const int t = int(row / a.n_kv_heads), h = int(row % a.n_kv_heads);
  int64_t src_t = t;  // source row
  const int64_t slot = write_slot(a, t, &src_t);
  if (slot < 0) return;
  const KvRowLayout& f = a.fmt;
  const int dim = f.dim, n_words = f.bytes / 4;
  float* x = xs[warp];
  uint32_t* w = ws[warp];
  const uint16_t* src = a.x + (src_t * a.n_kv_heads + h) * dim;
  const float* src_f32 = a.x_f32 != nullptr ? a.x_f32 + src_t * a.x_stride + int64_t(h) * dim : nullptr;
  for (int d = lane; d < dim; d += 32) x[d] = src_f32 != nullptr ? src_f32[d] : bf16_to_f32(src[d]);
  for (int i = lane; i < n_words; i += 32) w[i] = 0u;
  __syncwarp();

  encode_row(f, x, w, src_f32 != nullptr ? nullptr : src, lane, h, [&](int bit) { return sign_of(tc, bit); }, tc.levels, es);
  __syncwarp();
  uint32_t* dst = reinterpret_cast<uint32_t*>(a.pool + (slot * a.n_kv_heads + h) * int64_t(f.bytes));
  for (int i = lane; i < n_words; i += 32) dst[i] = w[i];
}

struct Levels {
  float v[8];
};

// Block conversion of every layer at once: blockIdx.y is the part (layer l's K at 2 l, V at
// 2 l + 1), warp rows as kv_codec_write_kernel's over the blocks' tokens and KV heads.
__global__ void __launch_bounds__(kEncWarps * 32) kv_codec_convert_kernel(KvCodecConvertArgs a, Levels lv, EncodeSteps es) {
  __shared__ float xs[kEncWarps][kMaxDim];
  __shared__ uint32_t ws[kEncWarps][kMaxRowWords];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  pdl_wait();
  pdl_launch_dependents();
  const int part = int(blockIdx.y), layer = part >> 1;
  const int64_t row = int64_t(blockIdx.x) * kEncWarps + warp;
  if (row >= int64_t(a.n_blocks) * a.block_size * a.n_kv_heads) return;
  const int t = int(row / a.n_kv_heads), h = int(row % a.n_kv_heads);
  const int i = t / a.block_size, j = t - i * a.block_size;
  const int64_t slot = int64_t(a.dst_blocks[i]) * a.block_size + j;
  const int64_t src_row = (int64_t(a.src_blocks[i]) * a.block_size + j) * a.n_kv_heads + h;
  const KvRowLayout f = (part & 1) != 0 ? a.v_fmt : a.k_fmt;
  const int dim = f.dim, n_words = f.bytes / 4;
  float* x = xs[warp];
  uint32_t* w = ws[warp];
  const uint8_t* part_src = a.src_parts[part];
  const uint16_t* src = a.src_f32 ? nullptr : reinterpret_cast<const uint16_t*>(part_src) + src_row * dim;
  const float* src_f32 = a.src_f32 ? reinterpret_cast<const float*>(part_src) + src_row * dim : nullptr;
  for (int d = lane; d < dim; d += 32) x[d] = src_f32 != nullptr ? src_f32[d] : bf16_to_f32(src[d]);
  for (int k = lane; k < n_words; k += 32) w[k] = 0u;
  __syncwarp();
  const uint32_t* signs = a.turbo_signs != nullptr ? a.turbo_signs + int64_t(layer) * kMaxSignWords : nullptr;
  encode_row(f, x, w, src, lane, h, [&](int bit) { return (__ldg(signs + (bit >> 5)) >> (bit & 31)) & 1u ? -1.0f : 1.0f; },
             lv.v, es);
  __syncwarp();
  uint32_t* dst = reinterpret_cast<uint32_t*>(a.dst_parts[part] + (slot * a.n_kv_heads + h) * int64_t(f.bytes));
  for (int k = lane; k < n_words; k += 32) dst[k] = w[k];
}

// ---------------------------------------------------------------------------------------------
// Attention

constexpr int kDpl = 16;          // dims per lane
constexpr int kAttnWarps = 4;
constexpr int kKeysPerGroup = 2;  // keys per lane group per tile

// One lane's 16 dims of one row, as loaded (before dequantization).
template <Kind K>
struct RowPart {
  static constexpr int kWords = K == Kind::kBf16 ? 8 : (K == Kind::kFp8 || K == Kind::kAffine8) ? 4 : 2;
  uint32_t w[kWords];
  uint32_t meta0;  // fp8 scale, turbo3 rms (f32 bits); affine scale (bf16 bits)
  uint32_t meta1;  // affine bias (bf16 bits)
};

// Row part li (dims [16 li, 16 li + 16)) of `row`.
template <Kind K>
__device__ __forceinline__ void load_part(RowPart<K>& r, const uint8_t* row, int li, const KvRowLayout& f) {
  if constexpr (K == Kind::kBf16) {
    const uint4* p = reinterpret_cast<const uint4*>(row + 32 * li);
    const uint4 x0 = p[0], x1 = p[1];
    r.w[0] = x0.x, r.w[1] = x0.y, r.w[2] = x0.z, r.w[3] = x0.w;
    r.w[4] = x1.x, r.w[5] = x1.y, r.w[6] = x1.z, r.w[7] = x1.w;
    r.meta0 = r.meta1 = 0u;
  } else if constexpr (K == Kind::kFp8) {
    r.meta0 = ld_u32(row);
#pragma unroll
    for (int i = 0; i < 4; ++i) r.w[i] = ld_u32(row + 4 + 16 * li + 4 * i);
    r.meta1 = 0u;
  } else if constexpr (K == Kind::kAffine8 || K == Kind::kAffine4) {
    constexpr bool eight = K == Kind::kAffine8;
    const int packed = eight ? f.dim : f.dim / 2;
    const int n_groups = f.dim / f.group, g = (kDpl * li) / f.group;
#pragma unroll
    for (int i = 0; i < RowPart<K>::kWords; ++i) r.w[i] = ld_u32(row + (eight ? 16 : 8) * li + 4 * i);
    r.meta0 = ld_u16(row + packed + 2 * g);
    r.meta1 = ld_u16(row + packed + 2 * (n_groups + g));
  } else {  // turbo3: 48 bits of codes at byte 6 li of the codes
    r.meta0 = ld_u32(row);
    const uint8_t* c = row + 4 + 6 * li;
    r.w[0] = ld_u16(c) | (ld_u16(c + 2) << 16);
    r.w[1] = ld_u16(c + 4);
    r.meta1 = 0u;
  }
}

__device__ __forceinline__ float byte_to_f32(uint32_t b) {  // b < 2^23: exact, no I2F
  return __uint_as_float(0x4B000000u | b) - 8388608.0f;
}

// x[i] = mul * u[i] + add for the part's 16 dims.
template <Kind K>
__device__ __forceinline__ void unpack(const RowPart<K>& r, const float* levels, float (&u)[kDpl], float& mul,
                                       float& add) {
  if constexpr (K == Kind::kBf16) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      u[2 * i] = __uint_as_float(r.w[i] << 16);
      u[2 * i + 1] = __uint_as_float(r.w[i] & 0xffff0000u);
    }
    mul = 1.0f;
    add = 0.0f;
  } else if constexpr (K == Kind::kFp8) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const __half2_raw hr =
            __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t((r.w[i] >> (16 * j)) & 0xffffu), __NV_E4M3);
        const float2 f2 = __half22float2(*reinterpret_cast<const __half2*>(&hr));
        u[4 * i + 2 * j] = f2.x;
        u[4 * i + 2 * j + 1] = f2.y;
      }
    }
    mul = __uint_as_float(r.meta0);
    add = 0.0f;
  } else if constexpr (K == Kind::kAffine8) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) u[4 * i + j] = byte_to_f32((r.w[i] >> (8 * j)) & 0xffu);
    }
    mul = bf16_to_f32(r.meta0);
    add = bf16_to_f32(r.meta1);
  } else if constexpr (K == Kind::kAffine4) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j) u[8 * i + j] = byte_to_f32((r.w[i] >> (4 * j)) & 0xfu);
    }
    mul = bf16_to_f32(r.meta0);
    add = bf16_to_f32(r.meta1);
  } else {
    const uint64_t bits = uint64_t(r.w[0]) | (uint64_t(r.w[1]) << 32);
#pragma unroll
    for (int i = 0; i < kDpl; ++i) u[i] = levels[(bits >> (3 * i)) & 7u];
    mul = __uint_as_float(r.meta0);
    add = 0.0f;
  }
}

__device__ __forceinline__ void cp_async(void* smem, const void* gmem, int bytes16) {
  const uint32_t dst = uint32_t(__cvta_generic_to_shared(smem));
  if (bytes16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(gmem));
  }
}
// Tiles of K/V rows in flight per warp: each stage holds one tile (tile_keys rows of K then V).
template <Kind KK>
constexpr int kStages = KK == Kind::kBf16 ? 3 : 6;

// Dynamic shared memory of one block: the warps' staging, later reused for the warp merge.
size_t attention_smem(const KvRowLayout& k, const KvRowLayout& v, int stages, int group) {
  const size_t tile_keys = size_t(kKeysPerGroup) * (32 / (k.dim / kDpl));
  const size_t staging = size_t(kAttnWarps) * stages * tile_keys * size_t(k.bytes + v.bytes);
  const size_t merge = size_t(kAttnWarps) * group * k.dim * sizeof(float);
  return staging > merge ? staging : merge;
}

template <Kind KK, Kind VK, int G, int MinBlocks>
__global__ void __launch_bounds__(kAttnWarps * 32, MinBlocks) kv_codec_attention_kernel(KvCodecAttentionArgs a, TurboConsts tc) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ float levels[8];
  __shared__ float s_m[kAttnWarps][G], s_l[kAttnWarps][G];
  constexpr int kS = kStages<KK>;
  const int kvh = blockIdx.x, split = blockIdx.y, seq = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int hd = a.k_fmt.dim;
  const int lanes_per_key = hd / kDpl, keys_per_pass = 32 / lanes_per_key;
  const int li = lane % lanes_per_key, grp = lane / lanes_per_key;
  if (threadIdx.x < 8) levels[threadIdx.x] = tc.levels[threadIdx.x];

  int k_begin, k_end;
  split_keys(a, seq, split, k_begin, k_end);
  const int* table = a.block_tables + int64_t(a.query_seq != nullptr ? a.query_seq[seq] : seq) * a.max_blocks_per_seq;
  // The split's block-table entries, cached in shared memory when they fit (the step metadata
  // was copied before the step's first kernel: it may be read before the wait).
  __shared__ int s_table[kTableCache];
  const int first_b = k_begin / a.block_size;
  const int n_b = k_end > k_begin ? (k_end - 1) / a.block_size - first_b + 1 : 0;
  const bool cached = n_b <= kTableCache;
  if (cached) {
    for (int i = threadIdx.x; i < n_b; i += blockDim.x) s_table[i] = table[first_b + i];
  }
  __syncthreads();  // s_table, levels

  // Staging of this warp: kS stages of tile_keys (K row, V row) pairs.
  const int kb = a.k_fmt.bytes, vb = a.v_fmt.bytes, pair = kb + vb;
  const int tile_keys = kKeysPerGroup * keys_per_pass;
  uint8_t* stage0 = smem_raw + size_t(warp) * kS * tile_keys * pair;
  const int64_t k_stride = int64_t(a.n_kv_heads) * kb, v_stride = int64_t(a.n_kv_heads) * vb;
  const uint8_t* k_base = a.k_pool + int64_t(kvh) * kb;
  const uint8_t* v_base = a.v_pool + int64_t(kvh) * vb;
  // This warp's tiles start at k_begin + (warp + kAttnWarps i) tile_keys.
  const int first_kt = k_begin + warp * tile_keys, kt_step = kAttnWarps * tile_keys;
  const int n_tiles = first_kt < k_end ? (k_end - first_kt + kt_step - 1) / kt_step : 0;
  // Copies tile i's rows into its stage (bf16 rows in 16-byte pieces, others in words).
  constexpr int kPiece = KK == Kind::kBf16 ? 16 : 4;
  const int k_pieces = kb / kPiece, pieces = pair / kPiece;
  auto issue = [&](int i) {
    if (i < n_tiles) {
      const int kt = first_kt + i * kt_step;
      uint8_t* buf = stage0 + size_t(i % kS) * tile_keys * pair;
      const int n = min(tile_keys, k_end - kt);
      // Lane j finds key j0 + j's slot; the loop below takes them by shuffle (no dependent
      // loads). Tiles pass 32 keys at head dim 16 only.
      for (int j0 = 0; j0 < n; j0 += 32) {
        int64_t my_slot = 0;
        if (j0 + lane < n) {
          const int p = kt + j0 + lane, b = p / a.block_size;
          const int blk = cached ? s_table[b - first_b] : table[b];
          my_slot = int64_t(blk) * a.block_size + (p - b * a.block_size);
        }
        const int j1 = min(n, j0 + 32);
        for (int j = j0; j < j1; ++j) {
          const int64_t slot = __shfl_sync(0xffffffffu, my_slot, j - j0);
          const uint8_t* kr = k_base + slot * k_stride;
          const uint8_t* vr = v_base + slot * v_stride;
          for (int c = lane; c < pieces; c += 32) {
            const uint8_t* src = c < k_pieces ? kr + c * kPiece : vr + (c - k_pieces) * kPiece;
            cp_async(buf + j * pair + c * kPiece, src, kPiece == 16);
          }
        }
      }
    }
    cp_async_commit();  // an empty group keeps the count uniform
  };

  pdl_wait();
  pdl_launch_dependents();
#pragma unroll
  for (int i = 0; i < kS - 1; ++i) issue(i);

  // This lane's 16 dims of the group's query heads.
  float qf[G][kDpl], qsum[G];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    const uint4* p =
        reinterpret_cast<const uint4*>(a.q + (int64_t(seq) * a.n_heads + kvh * G + h) * hd + kDpl * li);
    const uint4 x0 = p[0], x1 = p[1];
    const uint32_t w[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    qsum[h] = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      qf[h][2 * i] = __uint_as_float(w[i] << 16);
      qf[h][2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
      qsum[h] += qf[h][2 * i] + qf[h][2 * i + 1];
    }
  }
  // m: running max (warp-uniform); l, bsum: this lane group's keys; acc: its dims.
  float m[G], l[G], bsum[G], acc[G][kDpl];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.0f;
    bsum[h] = 0.0f;
#pragma unroll
    for (int i = 0; i < kDpl; ++i) acc[h][i] = 0.0f;
  }

  for (int ti = 0; ti < n_tiles; ++ti) {
    issue(ti + kS - 1);
    cp_async_wait<kS - 1>();  // tile ti has landed (this lane's copies)
    __syncwarp();             // and every lane's
    const int kt = first_kt + ti * kt_step;
    const uint8_t* buf = stage0 + size_t(ti % kS) * tile_keys * pair;
    bool valid[kKeysPerGroup];
    const uint8_t* rows[kKeysPerGroup];
#pragma unroll
    for (int j = 0; j < kKeysPerGroup; ++j) {
      const int kk = grp + keys_per_pass * j;
      valid[j] = kt + kk < k_end;
      rows[j] = buf + (valid[j] ? kk : 0) * pair;  // an invalid key reads key 0 (valid); its weight is 0
    }
    float s[kKeysPerGroup][G];
#pragma unroll
    for (int j = 0; j < kKeysPerGroup; ++j) {
      RowPart<KK> kr;
      load_part<KK>(kr, rows[j], li, a.k_fmt);
      float u[kDpl], mul, add;
      unpack<KK>(kr, levels, u, mul, add);
#pragma unroll
      for (int h = 0; h < G; ++h) {
        float d0 = 0.0f, d1 = 0.0f;
#pragma unroll
        for (int i = 0; i < kDpl; i += 2) {
          d0 = fmaf(qf[h][i], u[i], d0);
          d1 = fmaf(qf[h][i + 1], u[i + 1], d1);
        }
        s[j][h] = (d0 + d1) * mul + add * qsum[h];
      }
    }
    // Sum over the lane group (each level's shuffles independent, so they overlap), then
    // logits and the tile's max over the warp.
    for (int o = 1; o < lanes_per_key; o <<= 1) {
#pragma unroll
      for (int j = 0; j < kKeysPerGroup; ++j) {
#pragma unroll
        for (int h = 0; h < G; ++h) s[j][h] += __shfl_xor_sync(0xffffffffu, s[j][h], o);
      }
    }
    float tmaxs[G];
#pragma unroll
    for (int h = 0; h < G; ++h) {
      tmaxs[h] = -INFINITY;
#pragma unroll
      for (int j = 0; j < kKeysPerGroup; ++j) {
        float x = s[j][h] * a.scale;
        if (a.softcap > 0.0f) x = a.softcap * tanhf(x / a.softcap);
        s[j][h] = valid[j] ? x : -INFINITY;
        tmaxs[h] = fmaxf(tmaxs[h], s[j][h]);
      }
    }
    for (int o = lanes_per_key; o < 32; o <<= 1) {
#pragma unroll
      for (int h = 0; h < G; ++h) tmaxs[h] = fmaxf(tmaxs[h], __shfl_xor_sync(0xffffffffu, tmaxs[h], o));
    }
#pragma unroll
    for (int h = 0; h < G; ++h) {
      const float tmax = tmaxs[h];
      const float m_new = fmaxf(m[h], tmax);  // finite: key kt is valid for lane group 0
      if (m_new > m[h]) {  // warp-uniform: most tiles do not raise the max
        const float corr = __expf(m[h] - m_new);  // 0 while m is -inf
        l[h] *= corr;
        bsum[h] *= corr;
#pragma unroll
        for (int i = 0; i < kDpl; ++i) acc[h][i] *= corr;
      }
      m[h] = m_new;
#pragma unroll
      for (int j = 0; j < kKeysPerGroup; ++j) {
        s[j][h] = valid[j] ? __expf(s[j][h] - m_new) : 0.0f;
        l[h] += s[j][h];
      }
    }
#pragma unroll
    for (int j = 0; j < kKeysPerGroup; ++j) {
      RowPart<VK> vr;
      load_part<VK>(vr, rows[j] + kb, li, a.v_fmt);
      float u[kDpl], mul, add;
      unpack<VK>(vr, levels, u, mul, add);
#pragma unroll
      for (int h = 0; h < G; ++h) {
        const float wgt = s[j][h] * mul;
        bsum[h] = fmaf(s[j][h], add, bsum[h]);
#pragma unroll
        for (int i = 0; i < kDpl; ++i) acc[h][i] = fmaf(wgt, u[i], acc[h][i]);
      }
    }
    __syncwarp();  // the stage is read before a later issue overwrites it
  }
  cp_async_wait<0>();
  __syncthreads();  // the staging becomes the merge buffer
  float* s_acc = reinterpret_cast<float*>(smem_raw);  // [kAttnWarps, G, hd]

  // Lane groups merge (they share m), then the warps through shared memory.
#pragma unroll
  for (int h = 0; h < G; ++h) {
#pragma unroll
    for (int i = 0; i < kDpl; ++i) acc[h][i] += bsum[h];
  }
  for (int o = lanes_per_key; o < 32; o <<= 1) {
#pragma unroll
    for (int h = 0; h < G; ++h) {
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], o);
#pragma unroll
      for (int i = 0; i < kDpl; ++i) acc[h][i] += __shfl_xor_sync(0xffffffffu, acc[h][i], o);
    }
  }
  if (grp == 0) {
#pragma unroll
    for (int h = 0; h < G; ++h) {
#pragma unroll
      for (int i = 0; i < kDpl; ++i) s_acc[(warp * G + h) * hd + kDpl * li + i] = acc[h][i];
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int h = 0; h < G; ++h) s_m[warp][h] = m[h], s_l[warp][h] = l[h];
  }
  __syncthreads();
  const int64_t stride = int64_t(a.n_seqs) * a.n_heads;
  for (int idx = threadIdx.x; idx < G * hd; idx += blockDim.x) {
    const int h = idx / hd, d = idx % hd;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) mx = fmaxf(mx, s_m[w][h]);
    float o = 0.0f, sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) {
      const float wgt = s_m[w][h] == -INFINITY ? 0.0f : __expf(s_m[w][h] - mx);
      o += wgt * s_acc[(w * G + h) * hd + d];
      sum += wgt * s_l[w][h];
    }
    const int64_t prow = int64_t(a.split_base + split) * stride + int64_t(seq) * a.n_heads + kvh * G + h;
    a.partial_out[prow * hd + d] = o;
    if (d == 0) {
      a.partial_ml[prow * 2] = mx;
      a.partial_ml[prow * 2 + 1] = sum;
    }
  }
}

// One block of head_dim threads per (sequence, head): merges the splits, normalizes, rotates
// turbo3 outputs back (y = s . H y / sqrt(dim); with two sources only the rotated splits' sum,
// which then joins the others') and stores bf16.
__global__ void kv_codec_combine_kernel(KvCodecAttentionArgs a, TurboConsts tc) {
  __shared__ float split_w[kMaxSplits];
  __shared__ float inv_s;
  __shared__ float y[kMaxDim];
  pdl_wait();
  pdl_launch_dependents();
  const int64_t row = blockIdx.x;  // seq * n_heads + head
  const int64_t stride = int64_t(a.n_seqs) * a.n_heads;
  const int hd = a.v_fmt.dim, d = threadIdx.x;
  const int n_total = a.split_base + a.n_splits;
  const int n_rot = a.v_fmt.kind == Kind::kTurbo3 ? n_total : a.rotated_splits;  // block-uniform
  if (threadIdx.x == 0) {
    float mx = -INFINITY;
    for (int s = 0; s < n_total; ++s) mx = fmaxf(mx, a.partial_ml[(s * stride + row) * 2]);
    float denom = 0.0f;
    for (int s = 0; s < n_total; ++s) {
      const float ms = a.partial_ml[(s * stride + row) * 2];
      const float wgt = ms == -INFINITY ? 0.0f : __expf(ms - mx);
      split_w[s] = wgt;
      denom += wgt * a.partial_ml[(s * stride + row) * 2 + 1];
    }
    inv_s = denom > 0.0f ? 1.0f / denom : 0.0f;
  }
  __syncthreads();
  float o = 0.0f, o_rot = 0.0f;
  for (int s = 0; s < n_total; ++s) {
    const float wgt = split_w[s];
    const float x = a.partial_out[(s * stride + row) * hd + d];
    if (s < n_rot) {
      o_rot += wgt != 0.0f ? wgt * x : 0.0f;
    } else {
      o += wgt != 0.0f ? wgt * x : 0.0f;
    }
  }
  o *= inv_s;
  if (n_rot > 0) {
    y[d] = o_rot * inv_s;
    for (int len = 1; len < hd; len <<= 1) {
      __syncthreads();
      if (d < hd / 2) {
        const int j = (d / len) * 2 * len + d % len;
        const float p = y[j], r = y[j + len];
        y[j] = p + r;
        y[j + len] = p - r;
      }
    }
    __syncthreads();
    const int kvh = int(row % a.n_heads) / (a.n_heads / a.n_kv_heads);
    const float r = y[d] * (1.0f / sqrtf(float(hd))) * sign_of(tc, kvh * hd + d);
    o = n_rot == n_total ? r : r + o;
  }
  const uint32_t hi = f32_to_bf16_bits(o);
  a.out[row * hd + d] = uint16_t(hi);
  if (a.out_lo != nullptr) a.out_lo[row * hd + d] = uint16_t(f32_to_bf16_bits(o - bf16_to_f32(hi)));
}

// ---------------------------------------------------------------------------------------------
// f32 rows (f32 checkpoints): plain copies in, and an f32 kernel out.

// One thread per value: row slot_mapping[t] * n_kv_heads + h of the pool gets x_f32's head h.
__global__ void kv_codec_write_f32_kernel(KvCodecWriteArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const int dim = a.fmt.dim;
  const int64_t total = int64_t(a.n_tokens) * a.n_kv_heads * dim;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / (int64_t(a.n_kv_heads) * dim), r = i % (int64_t(a.n_kv_heads) * dim);
    int64_t src_t = t;  // source row
    const int64_t slot = write_slot(a, t, &src_t);
    if (slot < 0) continue;
    reinterpret_cast<float*>(a.pool)[slot * a.n_kv_heads * dim + r] = a.x_f32[src_t * a.x_stride + r];
  }
}

constexpr int kF32Warps = 4;
constexpr int kF32PerLane = kMaxDim / 32;  // dims per lane at the largest head dim

// A block (4 warps) takes one query head of one query row and one split of its keys; warp w
// takes keys k_begin + 32 w + 128 i, one key per lane: the lane scores its key against q (in
// shared memory), the warp rescales once per 32 keys, then adds each key's value row (lanes
// over dims, the key's weight and row offset by shuffle). Everything in f32 with IEEE exp.
__global__ void __launch_bounds__(kF32Warps * 32) kv_codec_f32_attention_kernel(KvCodecAttentionArgs a) {
  __shared__ float qs[kMaxDim];
  __shared__ int s_table[kTableCache];
  __shared__ float s_m[kF32Warps], s_l[kF32Warps];
  __shared__ float s_acc[kF32Warps][kMaxDim];
  const int head = blockIdx.x, split = blockIdx.y, seq = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int hd = a.k_fmt.dim, kvh = head / (a.n_heads / a.n_kv_heads), bs = a.block_size;
  int k_begin, k_end;
  split_keys(a, seq, split, k_begin, k_end);
  const int* table = a.block_tables + int64_t(a.query_seq != nullptr ? a.query_seq[seq] : seq) * a.max_blocks_per_seq;
  const int first_b = k_begin / bs;
  const int n_b = k_end > k_begin ? (k_end - 1) / bs - first_b + 1 : 0;
  const bool cached = n_b <= kTableCache;
  if (cached) {
    for (int i = threadIdx.x; i < n_b; i += blockDim.x) s_table[i] = table[first_b + i];
  }
  pdl_wait();  // q and the pools are written by the kernels before
  pdl_launch_dependents();
  const float* q = a.q_f32 + int64_t(seq) * a.q_stride + int64_t(head) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = q[d];
  __syncthreads();
  const float* kp = reinterpret_cast<const float*>(a.k_pool);
  const float* vp = reinterpret_cast<const float*>(a.v_pool);
  const bool vec = (reinterpret_cast<uintptr_t>(kp) & 15u) == 0;
  float m = -INFINITY, l = 0.0f, acc[kF32PerLane];
#pragma unroll
  for (int i = 0; i < kF32PerLane; ++i) acc[i] = 0.0f;
  for (int kt = k_begin + warp * 32; kt < k_end; kt += kF32Warps * 32) {  // warp-uniform
    const int p = kt + lane;
    const bool valid = p < k_end;
    int64_t off = 0;
    float s = -INFINITY;
    if (valid) {
      const int b = p / bs;
      const int blk = cached ? s_table[b - first_b] : table[b];
      off = ((int64_t(blk) * bs + (p - b * bs)) * a.n_kv_heads + kvh) * hd;
      const float* kr = kp + off;
      float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
      for (int i = 0; i < hd / 4; ++i) {
        // Rows are 16-byte aligned when the part is (a part after other codecs' parts may not be).
        const float4 k4 = vec ? reinterpret_cast<const float4*>(kr)[i] : make_float4(kr[4 * i], kr[4 * i + 1], kr[4 * i + 2], kr[4 * i + 3]);
        d0 = fmaf(qs[4 * i], k4.x, d0);
        d1 = fmaf(qs[4 * i + 1], k4.y, d1);
        d2 = fmaf(qs[4 * i + 2], k4.z, d2);
        d3 = fmaf(qs[4 * i + 3], k4.w, d3);
      }
      s = ((d0 + d1) + (d2 + d3)) * a.scale;
      if (a.softcap > 0.0f) s = a.softcap * tanhf(s / a.softcap);
    }
    const float m_new = fmaxf(m, warp_max(s));  // finite: lane 0's key is valid
    const float corr = expf(m - m_new);         // 0 while m is -inf
    const float e = valid ? expf(s - m_new) : 0.0f;
    float es = e;
    for (int o = 16; o > 0; o >>= 1) es += __shfl_xor_sync(0xffffffffu, es, o);
    l = l * corr + es;
    m = m_new;
#pragma unroll
    for (int i = 0; i < kF32PerLane; ++i) acc[i] *= corr;
    const int nk = min(32, k_end - kt);
    for (int j = 0; j < nk; ++j) {
      const float ej = __shfl_sync(0xffffffffu, e, j);
      const float* vr = vp + __shfl_sync(0xffffffffu, off, j);
#pragma unroll
      for (int i = 0; i < kF32PerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < hd) acc[i] = fmaf(ej, vr[d], acc[i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kF32PerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) s_acc[warp][d] = acc[i];
  }
  if (lane == 0) s_m[warp] = m, s_l[warp] = l;
  __syncthreads();
  const int64_t prow = int64_t(a.split_base + split) * a.n_seqs * a.n_heads + int64_t(seq) * a.n_heads + head;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float mx = -INFINITY;
    for (int w = 0; w < kF32Warps; ++w) mx = fmaxf(mx, s_m[w]);
    float o = 0.0f, sum = 0.0f;
    for (int w = 0; w < kF32Warps; ++w) {
      const float wgt = s_m[w] == -INFINITY ? 0.0f : expf(s_m[w] - mx);
      o += wgt * s_acc[w][d];
      sum += wgt * s_l[w];
    }
    a.partial_out[prow * hd + d] = o;
    if (d == 0) {
      a.partial_ml[prow * 2] = mx;
      a.partial_ml[prow * 2 + 1] = sum;
    }
  }
}

// One thread per token: its key count and its sequence (binary search over the starts).
__global__ void kv_codec_query_rows_kernel(KvCodecQueryRowsArgs a) {
  const int t = int(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= a.n_tokens) return;
  int lo = 0, hi = a.n_seqs - 1;  // the last s with seq_q_start[s] <= t
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.seq_q_start[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  a.context_lens[t] = a.positions[t] + 1;
  a.query_seq[t] = lo;
  if (a.quant_lens != nullptr) {
    const int n_quant = a.n_quant_blocks != nullptr ? a.n_quant_blocks[lo] * a.block_size : 0;
    a.quant_lens[t] = min(n_quant, a.positions[t] + 1);
  }
}

int32_t g_min_blocks = 3;  // set_kv_codec_attention_min_blocks
bool g_use_mma = true;      // set_kv_codec_attention_mma

template <Kind KK, Kind VK, int G, int MinBlocks>
void launch_attention_mb(const KvCodecAttentionArgs& a, const TurboConsts& tc, cudaStream_t stream) {
  const dim3 grid(a.n_kv_heads, a.n_splits, a.n_seqs);
  const size_t smem = attention_smem(a.k_fmt, a.v_fmt, kStages<KK>, G);
  static size_t raised = 0;  // the attribute is per kernel and process-wide
  if (smem > raised) {
    STRATA_CUDA_CHECK(cudaFuncSetAttribute(kv_codec_attention_kernel<KK, VK, G, MinBlocks>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    raised = smem;
  }
  launch_pdl(kv_codec_attention_kernel<KK, VK, G, MinBlocks>, grid, kAttnWarps * 32, smem, stream, a, tc);
}

template <Kind KK, Kind VK, int G>
void launch_attention(const KvCodecAttentionArgs& a, const TurboConsts& tc, cudaStream_t stream) {
  if (g_min_blocks == 2) {
    launch_attention_mb<KK, VK, G, 2>(a, tc, stream);
  } else {
    launch_attention_mb<KK, VK, G, 3>(a, tc, stream);
  }
}

template <Kind KK, Kind VK>
void launch_pair(const KvCodecAttentionArgs& a, const TurboConsts& tc, cudaStream_t stream) {
  if (g_use_mma && mma_supports(a)) {
    launch_mma(a, tc, stream);
    return;
  }
  switch (a.n_heads / a.n_kv_heads) {
    case 1: launch_attention<KK, VK, 1>(a, tc, stream); return;
    case 2: launch_attention<KK, VK, 2>(a, tc, stream); return;
    case 4: launch_attention<KK, VK, 4>(a, tc, stream); return;
    case 8: launch_attention<KK, VK, 8>(a, tc, stream); return;
    default: cuda_fatal(__FILE__, __LINE__, "launch_kv_codec_attention", "group size not 1, 2, 4 or 8");
  }
}

bool valid_dim(int32_t d) { return d == 16 || d == 32 || d == 64 || d == 128 || d == 256; }

}  // namespace

void set_kv_codec_attention_min_blocks(int32_t blocks) {
  if (blocks != 2 && blocks != 3) {
    cuda_fatal(__FILE__, __LINE__, "set_kv_codec_attention_min_blocks", std::to_string(blocks) + " (2 or 3)");
  }
  g_min_blocks = blocks;
}
int32_t kv_codec_attention_min_blocks() { return g_min_blocks; }
void set_kv_codec_attention_mma(bool on) { g_use_mma = on; }
bool kv_codec_attention_mma() { return g_use_mma; }

const char* kv_codec_write_problem(const KvRowLayout& f) {
  if (f.kind == Kind::kF32) {
    if (f.dim <= 0 || f.dim > kMaxDim || f.dim % 4 != 0) return "f32 rows: head dim must be a multiple of 4, at most 256";
    if (f.bytes != 4 * f.dim) return "f32 rows: row bytes must be 4 x head dim";
    return "";
  }
  if (!valid_dim(f.dim)) return "head dim must be 16, 32, 64, 128 or 256";
  if (f.bytes <= 0 || f.bytes % 4 != 0 || f.bytes > 4 * kMaxRowWords) return "row bytes must be a multiple of 4, at most 1024";
  if (f.kind == Kind::kAffine8 || f.kind == Kind::kAffine4) {
    if (f.group <= 0 || f.group % 16 != 0 || f.dim % f.group != 0) return "affine group must be a multiple of 16 dividing the head dim";
  } else if (f.kind != Kind::kBf16 && f.kind != Kind::kFp8 && f.kind != Kind::kTurbo3) {
    return "row kind not stored on the GPU";
  }
  return "";
}

const char* kv_codec_gpu_problem(const KvRowLayout& k, const KvRowLayout& v) {
  const char* p = kv_codec_write_problem(k);
  if (*p != '\0') return p;
  p = kv_codec_write_problem(v);
  if (*p != '\0') return p;
  if (k.dim != v.dim) return "key and value head dims must match";
  const bool same = k.kind == v.kind && k.kind != Kind::kTurbo3;
  const bool turbo = k.kind == Kind::kAffine8 && v.kind == Kind::kTurbo3;
  if (!same && !turbo) return "key/value kinds must be one codec's pair (f32, bf16, fp8, int8, int4 or turbo)";
  return "";
}

void launch_kv_codec_write(const KvCodecWriteArgs& a, cudaStream_t stream) {
  const char* p = kv_codec_write_problem(a.fmt);
  if (*p != '\0') cuda_fatal(__FILE__, __LINE__, "launch_kv_codec_write", p);
  if (a.fmt.kind == Kind::kTurbo3 && int64_t(a.n_kv_heads) * a.fmt.dim > 32 * kMaxSignWords) {
    cuda_fatal(__FILE__, __LINE__, "launch_kv_codec_write", "turbo3: n_kv_heads * head dim above 8192");
  }
  if (a.src_blocks != nullptr && (a.dst_blocks == nullptr || a.block_size <= 0 || a.n_tokens % a.block_size != 0)) {
    cuda_fatal(__FILE__, __LINE__, "launch_kv_codec_write", "block conversion needs dst_blocks and n_tokens a multiple of block_size");
  }
  const int64_t rows = int64_t(a.n_tokens) * a.n_kv_heads;
  if (rows == 0) return;
  if (a.fmt.kind == Kind::kF32) {
    if (a.x_f32 == nullptr) cuda_fatal(__FILE__, __LINE__, "launch_kv_codec_write", "f32 rows need x_f32");
    const int64_t n = rows * a.fmt.dim;
    launch_pdl(kv_codec_write_f32_kernel, dim3(unsigned(std::min<int64_t>((n + 255) / 256, 4096))), 256, 0, stream, a);
    return;
  }
  const TurboConsts tc = a.fmt.kind == Kind::kTurbo3 ? turbo_consts(a.seed_layer, a.n_kv_heads, a.fmt.dim) : TurboConsts{};
  launch_pdl(kv_codec_write_kernel, dim3(unsigned((rows + kEncWarps - 1) / kEncWarps)), kEncWarps * 32, 0, stream, a,
             tc, encode_steps());
}

void kv_turbo_sign_words(int32_t seed_layer, int32_t n_kv_heads, int32_t dim, uint32_t* words) {
  if (int64_t(n_kv_heads) * dim > 32 * kMaxSignWords) {
    cuda_fatal(__FILE__, __LINE__, "kv_turbo_sign_words", "n_kv_heads * head dim above 8192");
  }
  const TurboConsts c = turbo_consts(seed_layer, n_kv_heads, dim);
  std::copy(c.sign_bits, c.sign_bits + kMaxSignWords, words);
}

void launch_kv_codec_convert(const KvCodecConvertArgs& a, cudaStream_t stream) {
  for (const KvRowLayout* f : {&a.k_fmt, &a.v_fmt}) {
    const char* p = kv_codec_write_problem(*f);
    if (*p != '\0') cuda_fatal(__FILE__, __LINE__, "launch_kv_codec_convert", p);
    if (f->kind == Kind::kF32) cuda_fatal(__FILE__, __LINE__, "launch_kv_codec_convert", "f32 rows are not a codec");
    if (f->kind == Kind::kTurbo3 && (a.turbo_signs == nullptr || int64_t(a.n_kv_heads) * f->dim > 32 * kMaxSignWords)) {
      cuda_fatal(__FILE__, __LINE__, "launch_kv_codec_convert", "turbo3 needs turbo_signs and n_kv_heads * head dim <= 8192");
    }
  }
  if (a.n_layers <= 0 || a.n_blocks <= 0) return;
  if (a.block_size <= 0 || a.src_blocks == nullptr || a.dst_blocks == nullptr || 2 * a.n_layers > 65535) {
    cuda_fatal(__FILE__, __LINE__, "launch_kv_codec_convert", "needs src_blocks, dst_blocks, block_size > 0 and at most 32767 layers");
  }
  const int64_t rows = int64_t(a.n_blocks) * a.block_size * a.n_kv_heads;
  Levels lv{};
  for (int i = 0; i < 8; ++i) lv.v[i] = kLloydMax3[i];
  launch_pdl(kv_codec_convert_kernel, dim3(unsigned((rows + kEncWarps - 1) / kEncWarps), unsigned(2 * a.n_layers)),
             kEncWarps * 32, 0, stream, a, lv, encode_steps());
}

void launch_kv_codec_query_rows(const KvCodecQueryRowsArgs& a, cudaStream_t stream) {
  if (a.n_tokens <= 0) return;
  kv_codec_query_rows_kernel<<<unsigned((a.n_tokens + 127) / 128), 128, 0, stream>>>(a);
  STRATA_CUDA_CHECK_LAUNCH();
}

void launch_kv_codec_attention(const KvCodecAttentionArgs& a, cudaStream_t stream) {
  const char* p = kv_codec_gpu_problem(a.k_fmt, a.v_fmt);
  if (*p != '\0') cuda_fatal(__FILE__, __LINE__, "launch_kv_codec_attention", p);
  if (a.n_splits < 1 || a.split_base < 0 || a.split_base + a.n_splits > kMaxSplits) {
    cuda_fatal(__FILE__, __LINE__, "launch_kv_codec_attention",
               "split_base " + std::to_string(a.split_base) + " + n_splits " + std::to_string(a.n_splits) + " (1..64)");
  }
  if (a.rotated_splits < 0 || a.rotated_splits > a.split_base) {
    cuda_fatal(__FILE__, __LINE__, "launch_kv_codec_attention", "rotated_splits must lie in [0, split_base]");
  }
  if (a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0) {
    cuda_fatal(__FILE__, __LINE__, "launch_kv_codec_attention", "n_heads % n_kv_heads != 0");
  }
  if (a.n_seqs == 0) return;
  const bool turbo = a.v_fmt.kind == Kind::kTurbo3 || (a.merge && a.rotated_splits > 0);
  if (turbo && int64_t(a.n_kv_heads) * a.v_fmt.dim > 32 * kMaxSignWords) {
    cuda_fatal(__FILE__, __LINE__, "launch_kv_codec_attention", "turbo3: n_kv_heads * head dim above 8192");
  }
  TurboConsts tc{};
  if (turbo) {
    tc = turbo_consts(a.seed_layer, a.n_kv_heads, a.v_fmt.dim);
  } else {
    for (int i = 0; i < 8; ++i) tc.levels[i] = kLloydMax3[i];
  }
  switch (a.v_fmt.kind) {
    case Kind::kF32:
      if (a.q_f32 == nullptr) cuda_fatal(__FILE__, __LINE__, "launch_kv_codec_attention", "f32 rows need q_f32");
      launch_pdl(kv_codec_f32_attention_kernel, dim3(unsigned(a.n_heads), unsigned(a.n_splits), unsigned(a.n_seqs)), kF32Warps * 32, 0,
                 stream, a);
      break;
    case Kind::kBf16: launch_pair<Kind::kBf16, Kind::kBf16>(a, tc, stream); break;
    case Kind::kFp8: launch_pair<Kind::kFp8, Kind::kFp8>(a, tc, stream); break;
    case Kind::kAffine8: launch_pair<Kind::kAffine8, Kind::kAffine8>(a, tc, stream); break;
    case Kind::kAffine4: launch_pair<Kind::kAffine4, Kind::kAffine4>(a, tc, stream); break;
    case Kind::kTurbo3: launch_pair<Kind::kAffine8, Kind::kTurbo3>(a, tc, stream); break;
  }
  if (a.merge) launch_pdl(kv_codec_combine_kernel, dim3(unsigned(a.n_seqs * a.n_heads)), unsigned(a.v_fmt.dim), 0, stream, a, tc);
}

}  // namespace strata::cuda
