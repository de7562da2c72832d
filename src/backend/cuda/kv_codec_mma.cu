// Tensor-core split-KV decode attention over KV codec rows (see kv_codec.h and kv_codec.cu, whose
// dispatch reaches it through launch_mma in kv_codec_common.cuh; kv_codec_combine_kernel there
// merges its split partials).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kv_codec.h"
#include "backend/cuda/kv_codec_common.cuh"
#include "backend/cuda/pdl.cuh"

namespace strata::cuda {

using namespace kv_codec_detail;

namespace {

// ---------------------------------------------------------------------------------------------
// Tensor-core decode attention (head dims 64 and 128, GQA groups up to 8)
//
// A block (4 warps) takes one KV head of one sequence and one split of its keys; warp w takes
// the split's tiles w, w + 4, ... of 16 keys and streams its own tiles through Stages
// cp.async stages (no block barrier until the end). A staged row keeps its encoded bytes: each
// is copied as the 16-byte aligned pieces that hold it (rows are only 4-byte aligned in the
// pool), and its offset in the first piece is kept next to the stage.
//
// Q K^T and P V run as bf16 m16n8k16 MMAs with f32 sums, rows = the group's query heads (rows
// past the group are zero). The codes are turned into bf16 "unit" values in registers, never
// written back: fp8 values and the affine integers (0..255, 0..15) are exact in bf16, so the
// key dots are the exact sums of q * u; the row scale (fp8), the group scale and bias (affine,
// s * (q . u) + b * sum(q) per group) are applied to the scores in f32. On the value side the
// per-key multiplier (fp8 scale, turbo3 rms, affine group scale) is folded into the bf16
// softmax weights P of that key, affine biases add sum(p * b) per row, and turbo3 levels are
// rounded to bf16 (relative error below 2^-9).
//
// The dot products may use any order of dims inside a 16-dim k-step (and inside a pair of
// k-steps of one affine group), so lane t4 of a quad takes 4 consecutive dims of each k-step
// (one 32-bit word of 8-bit codes) for both Q and K; int4 keys take 8 dims of a k-step pair
// (see key_frag).
// For P V, n-tile DPW m + i, column c holds dim DPW (8 m + c) + i (DPW: the dims one 32-bit
// word of codes holds, 4 for 8-bit codes): a lane loads one word per key and unit m and feeds
// DPW n-tiles from it.

constexpr int kMmaWarps = 4;
constexpr int kMmaKeys = 16;    // keys of a warp tile
// Occupancy variants (set_kv_codec_mma_blocks): registers capped for 3 blocks per multiprocessor
// with 3 stages per warp (2 tiles in flight while one is computed), or 4 blocks with 2 stages.
constexpr int kMmaMaxStages = 3;
constexpr int mma_stages(int min_blocks) { return min_blocks >= 4 ? 2 : 3; }
constexpr int kMmaRows = 8;     // query heads a block serves at most (rows of the A tile past 8 are zero)
constexpr float kLog2e = 1.4426950408889634f;

template <Kind K>
constexpr int kVdpw = K == Kind::kBf16 ? 2 : (K == Kind::kAffine4 || K == Kind::kTurbo3) ? 8 : 4;

// 16-byte pieces of a staged row: a 4-byte aligned row starts up to 12 bytes into its first
// piece; the count is odd, so the row stride in words is 4 mod 8 and the eight rows a fragment
// load touches start in different banks.
__host__ __device__ constexpr int staged_pieces(int bytes) { return ((bytes + 12 + 15) / 16) | 1; }

size_t mma_smem(const KvRowLayout& k, const KvRowLayout& v, int stages) {
  const size_t staging = size_t(kMmaWarps) * stages * kMmaKeys * 16 * (staged_pieces(k.bytes) + staged_pieces(v.bytes));
  const size_t merge = size_t(kMmaWarps) * kMmaRows * k.dim * sizeof(float);
  return staging > merge ? staging : merge;
}

__device__ __forceinline__ void cp_async16z(void* smem, const void* gmem, bool valid) {
  const uint32_t dst = uint32_t(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0));
}

// d (rows 0..7 of a 16x8 tile) += a (rows 0..7 of 16x16: a0 k 0..7 pairs, a2 k 8..15) * b.
__device__ __forceinline__ void mma_rows8(float& d0, float& d1, uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  float x2 = 0.0f, x3 = 0.0f;  // rows 8..15: zero queries, results dropped
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d0), "+f"(d1), "+f"(x2), "+f"(x3)
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// Byte i of w as an f32 (exact): the byte under the exponent of 2^23, minus 2^23.
template <int I>
__device__ __forceinline__ float byte_f32(uint32_t w) {
  return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540u | I)) - 8388608.0f;
}
// Two 4-bit codes at bits 0..3 and 16..19 of t as bf16 values (exact): 128 + code, minus 128.
__device__ __forceinline__ uint32_t nibbles_bf16x2(uint32_t t) {
  const uint32_t r = (t & 0x000F000Fu) | 0x43004300u;
  const __nv_bfloat162 x = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&r), __floats2bfloat162_rn(128.0f, 128.0f));
  return *reinterpret_cast<const uint32_t*>(&x);
}
__device__ __forceinline__ float2 fp8x2_to_f32(uint32_t v16) {
  const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(v16 & 0xffffu), __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&hr));
}

// Key fragment of k-step ks: dims 16 ks + 4 t4 + {0, 1} (b0) and {2, 3} (b1) of a key row, as
// bf16 unit values. Affine4 pairs k-steps instead: lane t4 of k-steps 2 j and 2 j + 1 holds the
// 8 dims 32 j + 8 t4 + {0..7} (one word of codes) as b0 = {0, 4}, b1 = {1, 5} (k-step 2 j) and
// b0 = {2, 6}, b1 = {3, 7} (2 j + 1): codes 16 bits apart become a bf16 pair in two operations.
template <Kind K>
__device__ __forceinline__ void key_frag(const uint8_t* row, int ks, int t4, uint32_t& b0, uint32_t& b1) {
  if constexpr (K == Kind::kBf16) {
    const uint2 w = *reinterpret_cast<const uint2*>(row + 32 * ks + 8 * t4);
    b0 = w.x;
    b1 = w.y;
  } else if constexpr (K == Kind::kFp8) {
    const uint32_t w = ld_u32(row + 4 + 16 * ks + 4 * t4);
    const float2 lo = fp8x2_to_f32(w), hi = fp8x2_to_f32(w >> 16);
    b0 = pack_bf16x2(lo.x, lo.y);
    b1 = pack_bf16x2(hi.x, hi.y);
  } else if constexpr (K == Kind::kAffine8) {
    const uint32_t w = ld_u32(row + 16 * ks + 4 * t4);
    b0 = pack_bf16x2(byte_f32<0>(w), byte_f32<1>(w));
    b1 = pack_bf16x2(byte_f32<2>(w), byte_f32<3>(w));
  } else {  // affine4: low nibble first
    const uint32_t w = ld_u32(row + 16 * (ks >> 1) + 4 * t4) >> (8 * (ks & 1));
    b0 = nibbles_bf16x2(w);
    b1 = nibbles_bf16x2(w >> 4);
  }
}

// The code word of value unit m, column c of a value row (dims DPW (8 m + c) + i).
template <Kind K>
__device__ __forceinline__ uint32_t value_word(const uint8_t* row, int m, int c) {
  if constexpr (K == Kind::kFp8) {
    return ld_u32(row + 4 + 4 * (8 * m + c));
  } else if constexpr (K == Kind::kTurbo3) {  // 24 bits at byte 4 + 3 (8 m + c), 4-byte aligned row
    const int byte = 4 + 3 * (8 * m + c);
    const uint8_t* w = row + (byte & ~3);
    return __funnelshift_r(ld_u32(w), ld_u32(w + 4), 8 * (byte & 3));
  } else {
    return ld_u32(row + 4 * (8 * m + c));
  }
}

// Value i of the code words of two keys (wa, wb) as a bf16 pair, for the 8- and 4-bit affine
// kinds (the others go through value_units).
template <Kind K, int I>
__device__ __forceinline__ uint32_t value_pair(uint32_t wa, uint32_t wb) {
  if constexpr (K == Kind::kAffine8) {
    return pack_bf16x2(byte_f32<I>(wa), byte_f32<I>(wb));
  } else {  // affine4: byte I / 2 of each word at bits 0..7 and 16..23, then its nibble
    const uint32_t t = __byte_perm(wa, wb, uint32_t(I >> 1) | (uint32_t(4 + (I >> 1)) << 8));
    return nibbles_bf16x2(I & 1 ? t >> 4 : t);
  }
}

template <Kind K, int I = 0>
__device__ __forceinline__ void value_mmas(float (*o)[2], uint32_t pf0, uint32_t pf2, const uint32_t (&w)[4]) {
  if constexpr (I < kVdpw<K>) {
    mma_rows8(o[I][0], o[I][1], pf0, pf2, value_pair<K, I>(w[0], w[1]), value_pair<K, I>(w[2], w[3]));
    value_mmas<K, I + 1>(o, pf0, pf2, w);
  }
}

// The DPW unit values of an fp8 or turbo3 code word.
template <Kind K>
__device__ __forceinline__ void value_units(uint32_t w, const float* levels, float (&u)[kVdpw<K>]) {
  if constexpr (K == Kind::kFp8) {
    const float2 lo = fp8x2_to_f32(w), hi = fp8x2_to_f32(w >> 16);
    u[0] = lo.x, u[1] = lo.y, u[2] = hi.x, u[3] = hi.y;
  } else if constexpr (K == Kind::kTurbo3) {
#pragma unroll
    for (int i = 0; i < 8; ++i) u[i] = levels[(w >> (3 * i)) & 7u];
  }
}

template <Kind KK, Kind VK, int HD, int MinBlocks>
__global__ void __launch_bounds__(kMmaWarps * 32, MinBlocks) kv_codec_mma_kernel(KvCodecAttentionArgs a, TurboConsts tc) {
  constexpr int kMmaStages = mma_stages(MinBlocks);
  constexpr int kSteps = HD / 16;                 // k-steps of Q K^T
  constexpr int kDpw = kVdpw<VK>;
  constexpr int kUnits = HD / (8 * kDpw);         // value words per key row and lane
  constexpr bool kAffK = KK == Kind::kAffine8 || KK == Kind::kAffine4;
  constexpr bool kAffV = VK == Kind::kAffine8 || VK == Kind::kAffine4;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ float levels[8];
  __shared__ int s_table[kTableCache];
  __shared__ int s_mis[kMmaWarps][kMmaMaxStages][2][kMmaKeys];   // a staged row's byte offset in its first piece
  __shared__ const uint8_t* s_src[kMmaWarps][2][kMmaKeys];    // first piece of each row of the tile being issued
  __shared__ float red_m[kMmaWarps][kMmaRows], red_l[kMmaWarps][kMmaRows];

  const int kvh = blockIdx.x, split = blockIdx.y, seq = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int group = a.n_heads / a.n_kv_heads;
  if (tid < 8) levels[tid] = tc.levels[tid];

  int k_begin, k_end;
  split_keys(a, seq, split, k_begin, k_end);
  const int* table = a.block_tables + int64_t(a.query_seq != nullptr ? a.query_seq[seq] : seq) * a.max_blocks_per_seq;
  const int bs = a.block_size;
  const int first_b = k_begin / bs;
  const int n_b = k_end > k_begin ? (k_end - 1) / bs - first_b + 1 : 0;
  const bool cached = n_b <= kTableCache;
  if (cached) {
    for (int i = tid; i < n_b; i += blockDim.x) s_table[i] = table[first_b + i];
  }
  __syncthreads();  // s_table, levels

  const int kb = a.k_fmt.bytes, vb = a.v_fmt.bytes;
  const int pk = staged_pieces(kb), pv = staged_pieces(vb), pp = pk + pv;
  const int stage_bytes = kMmaKeys * 16 * pp;
  uint8_t* stage0 = smem_raw + size_t(warp) * kMmaStages * stage_bytes;
  const int first_kt = k_begin + warp * kMmaKeys, kt_step = kMmaWarps * kMmaKeys;
  const int n_tiles = first_kt < k_end ? (k_end - first_kt + kt_step - 1) / kt_step : 0;
  const int magic = (65536 + pp - 1) / pp;  // i / pp for i < 16 pp (pp < 120)
  const bool bs_pow2 = (bs & (bs - 1)) == 0;
  const int bs_shift = __ffs(bs) - 1;

  // Copies tile i's K and V rows into stage i % kMmaStages (an empty group past the end keeps
  // the wait counts uniform).
  auto issue = [&](int i) {
    if (i < n_tiles) {
      const int kt = first_kt + i * kt_step, st = i % kMmaStages;
      uint8_t* buf = stage0 + st * stage_bytes;
      __syncwarp();  // the previous tile's s_src reads are done
      if (lane < kMmaKeys) {
        const int p = kt + lane;
        const uint8_t* ks = a.k_pool;  // a key past the split copies nothing (zero-fill)
        const uint8_t* vs = a.v_pool;
        int mk = 0, mv = 0;
        if (p < k_end) {
          const int b = bs_pow2 ? p >> bs_shift : p / bs;
          const int blk = cached ? s_table[b - first_b] : table[b];
          const int64_t row = (int64_t(blk) * bs + (p - b * bs)) * a.n_kv_heads + kvh;
          const uintptr_t ka = reinterpret_cast<uintptr_t>(a.k_pool) + uintptr_t(row * kb);
          const uintptr_t va = reinterpret_cast<uintptr_t>(a.v_pool) + uintptr_t(row * vb);
          ks = reinterpret_cast<const uint8_t*>(ka & ~uintptr_t(15));
          vs = reinterpret_cast<const uint8_t*>(va & ~uintptr_t(15));
          mk = int(ka & 15);
          mv = int(va & 15);
        }
        s_src[warp][0][lane] = ks;
        s_src[warp][1][lane] = vs;
        s_mis[warp][st][0][lane] = mk;
        s_mis[warp][st][1][lane] = mv;
      }
      __syncwarp();
      for (int it = lane; it < kMmaKeys * pp; it += 32) {
        const int key = (it * magic) >> 16, c = it - key * pp;
        const bool is_k = c < pk;
        const int piece = is_k ? c : c - pk;
        if (16 * piece >= s_mis[warp][st][is_k ? 0 : 1][key] + (is_k ? kb : vb)) continue;  // past the row
        uint8_t* dst = buf + (is_k ? key * pk : kMmaKeys * pk + key * pv) * 16 + 16 * piece;
        cp_async16z(dst, s_src[warp][is_k ? 0 : 1][key] + 16 * piece, kt + key < k_end);
      }
    }
    cp_async_commit();
  };

  // Q (written by the kernel before) and the pools are read after the wait.
  pdl_wait();
  pdl_launch_dependents();
#pragma unroll
  for (int i = 0; i < kMmaStages - 1; ++i) issue(i);

  // Row g's q: dims 16 ks + 4 t4 + {0, 1} (qa[ks][0]) and {2, 3} (qa[ks][1]); qs[ks]: the sum
  // of q over the affine key group that ends at k-step ks (valid there).
  uint32_t qa[kSteps][2];
  float qs[kSteps];
  {
    const bool row_ok = g < group;
    const uint16_t* qrow = a.q + (int64_t(seq) * a.n_heads + kvh * group + (row_ok ? g : 0)) * HD;
    const int kpg = kAffK ? a.k_fmt.group / 16 : 1;
    float run = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      if constexpr (KK == Kind::kAffine4) {  // the k-step pairing of key_frag
        uint4 w = *reinterpret_cast<const uint4*>(qrow + 32 * (ks >> 1) + 8 * t4);
        if (!row_ok) w = make_uint4(0u, 0u, 0u, 0u);
        const uint32_t lo = ks & 1 ? w.y : w.x, hi = ks & 1 ? w.w : w.z;
        qa[ks][0] = __byte_perm(lo, hi, 0x5410);
        qa[ks][1] = __byte_perm(lo, hi, 0x7632);
      } else {
        uint2 w = *reinterpret_cast<const uint2*>(qrow + 16 * ks + 4 * t4);
        if (!row_ok) w = make_uint2(0u, 0u);
        qa[ks][0] = w.x;
        qa[ks][1] = w.y;
      }
      const uint32_t x = qa[ks][0], y = qa[ks][1];
      float part = (bf16_to_f32(x & 0xffffu) + bf16_to_f32(x >> 16)) + (bf16_to_f32(y & 0xffffu) + bf16_to_f32(y >> 16));
      part += __shfl_xor_sync(0xffffffffu, part, 1);
      part += __shfl_xor_sync(0xffffffffu, part, 2);
      run += part;
      qs[ks] = run;
      if (((ks + 1) & (kpg - 1)) == 0) run = 0.0f;
    }
  }

  const bool capped = a.softcap > 0.0f;
  const float s_scale = a.scale * kLog2e;
  const float cap_in = capped ? a.scale / a.softcap : 0.0f, cap_out = a.softcap * kLog2e;
  const bool row_ok = g < group;
  float o[kDpw * kUnits][2];  // n-tile DPW m + i, columns 2 t4 and 2 t4 + 1 of row g
  float bacc[kUnits];         // sum of p * bias for unit m's group (affine values)
#pragma unroll
  for (int n = 0; n < kDpw * kUnits; ++n) o[n][0] = o[n][1] = 0.0f;
#pragma unroll
  for (int m = 0; m < kUnits; ++m) bacc[m] = 0.0f;
  float m0 = -INFINITY, l0 = 0.0f;
  const int k_packed = KK == Kind::kAffine4 ? HD / 2 : HD, v_packed = VK == Kind::kAffine4 ? HD / 2 : HD;
  const int k_ng = kAffK ? HD / a.k_fmt.group : 1, v_group = kAffV ? a.v_fmt.group : HD;
  const int v_ng = HD / v_group;
  const int v_upg = v_group / (8 * kDpw);  // value units per affine group
  (void)k_packed, (void)v_packed, (void)k_ng, (void)v_ng, (void)v_upg;

  for (int ti = 0; ti < n_tiles; ++ti) {
    issue(ti + kMmaStages - 1);
    cp_async_wait<kMmaStages - 1>();  // tile ti has landed (this lane's copies)
    __syncwarp();                     // and every lane's
    const int st = ti % kMmaStages, kt = first_kt + ti * kt_step;
    const uint8_t* kbuf = stage0 + st * stage_bytes;
    const uint8_t* vbuf = kbuf + kMmaKeys * pk * 16;
    // Rows of the fragment keys (g, g + 8) and of the score keys 2 t4 + (q & 1) + 8 (q >> 1).
    const uint8_t* kf0 = kbuf + g * pk * 16 + s_mis[warp][st][0][g];
    const uint8_t* kf1 = kbuf + (g + 8) * pk * 16 + s_mis[warp][st][0][g + 8];
    const uint8_t* krow[4];
    const uint8_t* vrow[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int key = 2 * t4 + (q & 1) + 8 * (q >> 1);
      krow[q] = kbuf + key * pk * 16 + s_mis[warp][st][0][key];
      vrow[q] = vbuf + key * pv * 16 + s_mis[warp][st][1][key];
    }

    // Scores of row g for the four keys (s[q]); f32 sums over the k-steps.
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    {
      float c0[2] = {0.0f, 0.0f}, c1[2] = {0.0f, 0.0f};  // keys 2 t4 + {0, 1}, and + 8
      const int kpg = kAffK ? a.k_fmt.group / 16 : kSteps;
#pragma unroll
      for (int ks = 0; ks < kSteps; ++ks) {
        uint32_t b0, b1;
        key_frag<KK>(kf0, ks, t4, b0, b1);
        mma_rows8(c0[0], c0[1], qa[ks][0], qa[ks][1], b0, b1);
        key_frag<KK>(kf1, ks, t4, b0, b1);
        mma_rows8(c1[0], c1[1], qa[ks][0], qa[ks][1], b0, b1);
        if constexpr (kAffK) {
          if (((ks + 1) & (kpg - 1)) == 0) {  // the end of key group gi: s += scale * dot + bias * sum(q)
            const int gi = ks / kpg;
            const float cur[4] = {c0[0], c0[1], c1[0], c1[1]};
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const float sc = bf16_to_f32(ld_u16(krow[q] + k_packed + 2 * gi));
              const float bi = bf16_to_f32(ld_u16(krow[q] + k_packed + 2 * (k_ng + gi)));
              s[q] = fmaf(sc, cur[q], fmaf(bi, qs[ks], s[q]));
            }
            c0[0] = c0[1] = c1[0] = c1[1] = 0.0f;
          }
        }
      }
      if constexpr (!kAffK) {
        s[0] = c0[0], s[1] = c0[1], s[2] = c1[0], s[3] = c1[1];
        if constexpr (KK == Kind::kFp8) {
#pragma unroll
          for (int q = 0; q < 4; ++q) s[q] *= __uint_as_float(ld_u32(krow[q]));
        }
      }
    }
    // Online softmax of row g in the log2 domain (the quad's lanes share the row).
    float mx = -INFINITY;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float x = s[q];
      x = capped ? cap_out * tanhf(x * cap_in) : x * s_scale;
      const int p = kt + 2 * t4 + (q & 1) + 8 * (q >> 1);
      s[q] = row_ok && p < k_end ? x : -INFINITY;
      mx = fmaxf(mx, s[q]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mn = fmaxf(m0, mx);
    const float base = mn == -INFINITY ? 0.0f : mn;  // a row with nothing visible yet: no inf - inf
    const float corr = exp2_approx(m0 - base);
    m0 = mn;
    float p[4], psum = 0.0f;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      p[q] = exp2_approx(s[q] - base);
      psum += p[q];
    }
    l0 = l0 * corr + psum;
    // Most tiles raise no row's max (rows past the group, and a row before its first visible
    // key, hold zeros: no rescale needed).
    if (__any_sync(0xffffffffu, row_ok && corr != 1.0f)) {
#pragma unroll
      for (int n = 0; n < kDpw * kUnits; ++n) o[n][0] *= corr, o[n][1] *= corr;
    }

    // O += P V; the per-key multiplier rides in P.
    uint32_t pf0 = 0u, pf2 = 0u;
    if constexpr (!kAffV) {
      float pm[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) pm[q] = VK == Kind::kBf16 ? p[q] : p[q] * __uint_as_float(ld_u32(vrow[q]));
      pf0 = pack_bf16x2(pm[0], pm[1]);
      pf2 = pack_bf16x2(pm[2], pm[3]);
    }
#pragma unroll
    for (int m = 0; m < kUnits; ++m) {
      if (kAffV && m % v_upg == 0) {  // the first unit of a value group: its P and bias sum
        const int gi = m / v_upg;
        float pm[4];
        float bsum = 0.0f;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          pm[q] = p[q] * bf16_to_f32(ld_u16(vrow[q] + v_packed + 2 * gi));
          bsum = fmaf(p[q], bf16_to_f32(ld_u16(vrow[q] + v_packed + 2 * (v_ng + gi))), bsum);
        }
        bacc[m] = fmaf(bacc[m], corr, bsum);
        pf0 = pack_bf16x2(pm[0], pm[1]);
        pf2 = pack_bf16x2(pm[2], pm[3]);
      }
      uint32_t w[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) w[q] = value_word<VK>(vrow[q], m, g);
      if constexpr (kAffV) {
        value_mmas<VK>(o + kDpw * m, pf0, pf2, w);
      } else if constexpr (VK == Kind::kBf16) {
        mma_rows8(o[2 * m][0], o[2 * m][1], pf0, pf2, __byte_perm(w[0], w[1], 0x5410), __byte_perm(w[2], w[3], 0x5410));
        mma_rows8(o[2 * m + 1][0], o[2 * m + 1][1], pf0, pf2, __byte_perm(w[0], w[1], 0x7632),
                  __byte_perm(w[2], w[3], 0x7632));
      } else {
        float u[4][kDpw];
#pragma unroll
        for (int q = 0; q < 4; ++q) value_units<VK>(w[q], levels, u[q]);
#pragma unroll
        for (int i = 0; i < kDpw; ++i) {
          mma_rows8(o[kDpw * m + i][0], o[kDpw * m + i][1], pf0, pf2, pack_bf16x2(u[0][i], u[1][i]),
                    pack_bf16x2(u[2][i], u[3][i]));
        }
      }
    }
    __syncwarp();  // the stage is read before a later issue overwrites it
  }
  cp_async_wait<0>();

  // Merge: the quad's sums, then the warps through shared memory (the staging is free once
  // every warp is past the barrier).
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
#pragma unroll
  for (int m = 0; m < kUnits; ++m) {
    bacc[m] += __shfl_xor_sync(0xffffffffu, bacc[m], 1);
    bacc[m] += __shfl_xor_sync(0xffffffffu, bacc[m], 2);
  }
  if (t4 == 0) {
    red_m[warp][g] = m0;
    red_l[warp][g] = l0;
  }
  __syncthreads();
  auto row_max = [&](int r) {
    float x = -INFINITY;
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) x = fmaxf(x, red_m[w][r]);
    return x;
  };
  float* ob = reinterpret_cast<float*>(smem_raw);  // [kMmaWarps, kMmaRows, HD]
  if (row_ok) {
    const float f = m0 == -INFINITY ? 0.0f : exp2_approx(m0 - row_max(g));
    float* dst = ob + (warp * kMmaRows + g) * HD;
    float bias = 0.0f;  // the bias sum of unit m's group (kept by its first unit)
#pragma unroll
    for (int m = 0; m < kUnits; ++m) {
      if (m % v_upg == 0) bias = bacc[m];
#pragma unroll
      for (int i = 0; i < kDpw; ++i) {
#pragma unroll
        for (int e = 0; e < 2; ++e) dst[kDpw * (8 * m + 2 * t4 + e) + i] = (o[kDpw * m + i][e] + bias) * f;
      }
    }
  }
  __syncthreads();
  const int64_t stride = int64_t(a.n_seqs) * a.n_heads;
  for (int idx = tid; idx < group * HD; idx += kMmaWarps * 32) {
    const int r = idx / HD, d = idx % HD;
    const float mx = row_max(r);
    float sum = 0.0f, l = 0.0f;
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) {
      sum += ob[(w * kMmaRows + r) * HD + d];
      l += red_m[w][r] == -INFINITY ? 0.0f : red_l[w][r] * exp2_approx(red_m[w][r] - mx);
    }
    const int64_t prow = int64_t(a.split_base + split) * stride + int64_t(seq) * a.n_heads + kvh * group + r;
    a.partial_out[prow * HD + d] = sum;
    if (d == 0) {
      a.partial_ml[prow * 2] = mx == -INFINITY ? -INFINITY : mx / kLog2e;  // natural log, as the merge expects
      a.partial_ml[prow * 2 + 1] = l;
    }
  }
}

int32_t g_mma_blocks = 3;  // set_kv_codec_mma_blocks

template <Kind KK, Kind VK, int HD, int MinBlocks>
void launch_mma_mb(const KvCodecAttentionArgs& a, const TurboConsts& tc, cudaStream_t stream) {
  const size_t smem = mma_smem(a.k_fmt, a.v_fmt, mma_stages(MinBlocks));
  static size_t raised = 0;  // the attribute is per kernel and process-wide
  if (smem > raised) {
    STRATA_CUDA_CHECK(cudaFuncSetAttribute(kv_codec_mma_kernel<KK, VK, HD, MinBlocks>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    raised = smem;
  }
  const dim3 grid(a.n_kv_heads, a.n_splits, a.n_seqs);
  launch_pdl(kv_codec_mma_kernel<KK, VK, HD, MinBlocks>, grid, kMmaWarps * 32, smem, stream, a, tc);
}

template <Kind KK, Kind VK, int HD>
void launch_mma_hd(const KvCodecAttentionArgs& a, const TurboConsts& tc, cudaStream_t stream) {
  if (g_mma_blocks == 4) {
    launch_mma_mb<KK, VK, HD, 4>(a, tc, stream);
  } else {
    launch_mma_mb<KK, VK, HD, 3>(a, tc, stream);
  }
}

template <Kind KK, Kind VK>
void launch_mma_pair(const KvCodecAttentionArgs& a, const TurboConsts& tc, cudaStream_t stream) {
  if (a.k_fmt.dim == 64) {
    launch_mma_hd<KK, VK, 64>(a, tc, stream);
  } else {
    launch_mma_hd<KK, VK, 128>(a, tc, stream);
  }
}

}  // namespace

namespace kv_codec_detail {

// Layouts the tensor-core kernel takes (the CUDA-core one takes the rest).
bool mma_supports(const KvCodecAttentionArgs& a) {
  if (a.k_fmt.dim != 64 && a.k_fmt.dim != 128) return false;
  if (a.n_heads / a.n_kv_heads > kMmaRows) return false;
  if (a.k_fmt.kind == Kind::kAffine4 && a.k_fmt.group % 32 != 0) return false;  // key_frag's k-step pairs
  if (a.v_fmt.kind == Kind::kAffine8 && a.v_fmt.group % (8 * kVdpw<Kind::kAffine8>) != 0) return false;
  if (a.v_fmt.kind == Kind::kAffine4 && a.v_fmt.group % (8 * kVdpw<Kind::kAffine4>) != 0) return false;
  return true;
}

void launch_mma(const KvCodecAttentionArgs& a, const TurboConsts& tc, cudaStream_t stream) {
  switch (a.v_fmt.kind) {  // the pairs launch_kv_codec_attention accepts
    case Kind::kF32: break;  // never here: f32 rows take kv_codec_f32_attention_kernel
    case Kind::kBf16: launch_mma_pair<Kind::kBf16, Kind::kBf16>(a, tc, stream); break;
    case Kind::kFp8: launch_mma_pair<Kind::kFp8, Kind::kFp8>(a, tc, stream); break;
    case Kind::kAffine8: launch_mma_pair<Kind::kAffine8, Kind::kAffine8>(a, tc, stream); break;
    case Kind::kAffine4: launch_mma_pair<Kind::kAffine4, Kind::kAffine4>(a, tc, stream); break;
    case Kind::kTurbo3: launch_mma_pair<Kind::kAffine8, Kind::kTurbo3>(a, tc, stream); break;
  }
}

}  // namespace kv_codec_detail

void set_kv_codec_mma_blocks(int32_t blocks) {
  if (blocks != 3 && blocks != 4) {
    cuda_fatal(__FILE__, __LINE__, "set_kv_codec_mma_blocks", std::to_string(blocks) + " (3 or 4)");
  }
  g_mma_blocks = blocks;
}
int32_t kv_codec_mma_blocks() { return g_mma_blocks; }

}  // namespace strata::cuda
