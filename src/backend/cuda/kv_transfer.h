// KvTransfer: many KV blocks between the device pool and host bytes in a few large copies.
// One block's host bytes are per layer the K rows then the V rows (CudaDecoder::read_kv_block's
// layout); block i of a list sits at i * bytes_per_block. Copying a block part by part costs
// 2 x n_layers small copies per block (a 32k-token prompt of a 32-layer model: 131k copies),
// so instead a kernel gathers the listed blocks' parts of every layer into a contiguous device
// staging area (scatters out of it on the way in), and one copy moves the staging area to or
// from pinned host memory. Staging is allocated once; a list longer than it goes in chunks,
// two in flight: the host copies one chunk between the caller's bytes and pinned memory while
// the device moves the other.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>

#include "backend/cuda/device_memory.h"
#include "backend/cuda/kv_transfer_kernels.h"
#include "core/status.h"

namespace strata::cuda {

class KvTransfer {
 public:
  // Default staging: this many bytes of device memory and as many of pinned host memory.
  static constexpr int64_t kDefaultStagingBytes = int64_t(256) << 20;

  ~KvTransfer();
  KvTransfer(const KvTransfer&) = delete;
  KvTransfer& operator=(const KvTransfer&) = delete;

  // Staging of `staging_bytes` (raised to hold at least one block per half) for `pool`; copies
  // run on `stream` (the decoder's, so they stay ordered with the steps).
  static Result<std::unique_ptr<KvTransfer>> create(const KvBlockPool& pool, cudaStream_t stream, int64_t staging_bytes);

  // Blocks `blocks` (any order, repeats allowed when reading) to / from host bytes
  // [blocks.size(), bytes_per_block]. Returns when the copies are done.
  Status read(std::span<const int32_t> blocks, uint8_t* out);
  Status write(std::span<const int32_t> blocks, const uint8_t* in);

  // The same with block i at outs[i] / ins[i], places in page-locked host memory (allocated
  // pinned or registered with cudaHostRegister): the copy engine moves the bytes straight
  // between the device staging and those places (one copy per run of adjacent places), with no
  // copy through the pinned staging on the host. Unpinned places work too, slowly.
  Status read_direct(std::span<const int32_t> blocks, std::span<uint8_t* const> outs);
  Status write_direct(std::span<const int32_t> blocks, std::span<const uint8_t* const> ins);

  int32_t chunk_blocks() const { return chunk_blocks_; }

 private:
  KvTransfer() = default;
  Status check_ids(std::span<const int32_t> blocks) const;

  KvPartLayout layout_;
  int32_t n_blocks_ = 0;
  int64_t block_bytes_ = 0;
  int32_t chunk_blocks_ = 0;  // blocks of one staging half
  cudaStream_t stream_ = nullptr;
  uint8_t* device_ = nullptr;  // [2, chunk_blocks, block_bytes]
  uint8_t* pinned_ = nullptr;  // [2, chunk_blocks, block_bytes] host, cudaHostAlloc
  cudaEvent_t done_[2] = {nullptr, nullptr};  // the copy through pinned half h finished
};

}  // namespace strata::cuda
