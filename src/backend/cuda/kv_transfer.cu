// Gather / scatter of KV blocks between the pool and a contiguous staging area (kv_transfer.h).
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kv_transfer_kernels.h"

namespace strata::cuda {

namespace {

constexpr int kThreads = 256;

// One CTA per (part, listed block): copies part_bytes as T words. blockIdx.x: part,
// blockIdx.y: index in the list.
template <class T, bool kGather>
__global__ void kv_move_kernel(KvPartLayout pool, KvBlockList blocks, uint8_t* staging) {
  const int64_t part = blockIdx.x;
  const int64_t i = blockIdx.y;
  uint8_t* pool_p = pool.base + part * pool.part_stride + int64_t(blocks.ids[i]) * pool.part_bytes;
  uint8_t* stage_p = staging + (i * pool.n_parts + part) * pool.part_bytes;
  const int64_t n = pool.part_bytes / int64_t(sizeof(T));
  T* dst = reinterpret_cast<T*>(kGather ? stage_p : pool_p);
  const T* src = reinterpret_cast<const T*>(kGather ? pool_p : stage_p);
  for (int64_t k = threadIdx.x; k < n; k += kThreads) dst[k] = src[k];
}

template <bool kGather>
void launch(const KvPartLayout& pool, const KvBlockList& blocks, uint8_t* staging, cudaStream_t stream) {
  if (blocks.n <= 0) return;
  const dim3 grid(unsigned(pool.part_bytes > 0 ? pool.n_parts : 0), unsigned(blocks.n));
  // 16-byte words when every part offset and the pool stride allow it (cudaMalloc bases are
  // 256-byte aligned); else 2-byte words (bf16 rows are always even).
  const bool wide = pool.part_bytes % 16 == 0 && pool.part_stride % 16 == 0;
  if (wide) {
    kv_move_kernel<uint4, kGather><<<grid, kThreads, 0, stream>>>(pool, blocks, staging);
  } else {
    kv_move_kernel<uint16_t, kGather><<<grid, kThreads, 0, stream>>>(pool, blocks, staging);
  }
  STRATA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_kv_gather(const KvPartLayout& pool, const KvBlockList& blocks, uint8_t* staging, cudaStream_t stream) {
  launch<true>(pool, blocks, staging, stream);
}

void launch_kv_scatter(const KvPartLayout& pool, const KvBlockList& blocks, const uint8_t* staging, cudaStream_t stream) {
  launch<false>(pool, blocks, const_cast<uint8_t*>(staging), stream);
}

}  // namespace strata::cuda
