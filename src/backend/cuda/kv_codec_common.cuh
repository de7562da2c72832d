// Shared by the KV codec kernels of kv_codec.cu (encoder, CUDA-core split-KV attention, split
// merge, the public launchers) and kv_codec_mma.cu (tensor-core split-KV attention): the turbo3
// launch constants, the device helpers both kernels use, and the entry through which the
// attention dispatch reaches the tensor-core kernel. Private to those two files.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/kv_codec.h"

namespace strata::cuda::kv_codec_detail {

using Kind = KvRowKindGpu;

constexpr int kMaxSignWords = 256;  // rotation sign bits of all KV heads: n_kv_heads * dim <= 8,192
constexpr int kTableCache = 1024;  // block-table entries a block keeps in shared memory

// The turbo3 constants a launch passes by value: codebook and the rotation signs of each KV
// head (bit d of head h: bits[(h * dim + d) / 32], set for -1).
struct TurboConsts {
  float levels[8];
  uint32_t sign_bits[kMaxSignWords];
};

__device__ __forceinline__ float bf16_to_f32(uint32_t b) { return __uint_as_float(b << 16); }

// Code words are read from the shared-memory staging (both kernels stage rows with cp.async).
__device__ __forceinline__ uint32_t ld_u32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) {
  return uint32_t(*reinterpret_cast<const unsigned short*>(p));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// The keys [k_begin, k_end) of split `split` of query row `seq`: the row's keys (from
// key_begin, its last `window` with a window) cut into n_splits chunks.
__device__ __forceinline__ void split_keys(const KvCodecAttentionArgs& a, int seq, int split, int& k_begin, int& k_end) {
  const int n_keys = a.context_lens[seq];
  int k0 = a.window > 0 ? max(0, n_keys - a.window) : 0;
  if (a.key_begin != nullptr) k0 = min(n_keys, max(k0, a.key_begin[seq]));
  const int chunk = (n_keys - k0 + a.n_splits - 1) / a.n_splits;
  k_begin = min(n_keys, k0 + split * chunk);
  k_end = min(n_keys, k_begin + chunk);
}

// The tensor-core kernel (kv_codec_mma.cu). mma_supports: whether it takes this layout (head dims
// 64 and 128, GQA groups up to 8, affine groups its fragments can cover; the CUDA-core kernel
// takes the rest). launch_mma: launches it for the layout's key/value pair and head dim, in the
// occupancy variant set_kv_codec_mma_blocks chose; partial outputs as the CUDA-core kernel's.
bool mma_supports(const KvCodecAttentionArgs& a);
void launch_mma(const KvCodecAttentionArgs& a, const TurboConsts& tc, cudaStream_t stream);

}  // namespace strata::cuda::kv_codec_detail
