// The gather/scatter kernels of KvTransfer (kv_transfer.h), C++17 for nvcc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::cuda {

// Most blocks one gather/scatter launch takes (their ids travel as a kernel argument).
inline constexpr int32_t kKvTransferMaxBlocks = 256;

// Where the parts of a block lie in the pool: part j (0 .. n_parts-1; layer l's K is 2l, its
// V 2l+1) of block b starts at base + j * part_stride + b * part_bytes.
struct KvPartLayout {
  uint8_t* base = nullptr;  // device
  int64_t part_stride = 0;  // bytes from one part's region to the next
  int64_t part_bytes = 0;   // bytes of one block in one part
  int32_t n_parts = 0;
};

struct KvBlockList {
  int32_t n = 0;
  int32_t ids[kKvTransferMaxBlocks];
};

// staging [n, n_parts, part_bytes] <- the listed blocks (gather) or -> them (scatter).
void launch_kv_gather(const KvPartLayout& pool, const KvBlockList& blocks, uint8_t* staging, cudaStream_t stream);
void launch_kv_scatter(const KvPartLayout& pool, const KvBlockList& blocks, const uint8_t* staging, cudaStream_t stream);

}  // namespace strata::cuda
