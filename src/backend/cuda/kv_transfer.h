// KvTransfer: many KV blocks between the device pool and host bytes in a few large copies.
// One block's host bytes are per layer the K rows then the V rows (CudaDecoder::read_kv_block's
// layout); block i of a list sits at i * bytes_per_block. Copying a block part by part costs
// 2 x n_layers small copies per block (a 32k-token prompt of a 32-layer model: 131k copies),
// so instead a kernel gathers the listed blocks' parts of every layer into a contiguous device
// staging area (scatters out of it on the way in), and one copy moves the staging area to or
// from pinned host memory. Staging is allocated once; a list longer than it goes in chunks,
// two in flight: the host copies one chunk between the caller's bytes and pinned memory while
// the device moves the other.
//
// Demotions and installs overlap (the link is full duplex): read_direct_async() gathers on a
// stream of its own into staging of its own and copies out behind the caller, each chunk
// marking its blocks with a sequence number; the pool's stream waits for the gathers only
// (later steps may overwrite the blocks once their bytes are in the staging). write_direct()
// copies in on a stream of its own and scatters on a third one, chunk by chunk, each scatter
// waiting for the steps queued before it (one still in flight may use a block given back since)
// and the gather of the old bytes of its blocks, so a promotion that evicts
// (demotes) and then installs into the freed blocks moves its bytes down and up at the same
// time, and the copy of chunk i + 1 runs while chunk i is scattered; the pool's stream then
// waits for the scatters.
//
// Threads: every call but reads_done() comes from one thread (the engine's); reads_done() may
// come from another (a flush of the lower tiers).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "backend/cuda/device_memory.h"
#include "backend/cuda/kv_transfer_kernels.h"
#include "core/status.h"

namespace strata::cuda {

class KvTransfer {
 public:
  // Default staging: this many bytes of device memory (half for the pool stream's copies, half
  // for the demotions behind the caller) and half as many of pinned host memory.
  static constexpr int64_t kDefaultStagingBytes = int64_t(256) << 20;

  ~KvTransfer();
  KvTransfer(const KvTransfer&) = delete;
  KvTransfer& operator=(const KvTransfer&) = delete;

  // Staging of `staging_bytes` (raised to hold at least one block per quarter) for `pool`;
  // copies are ordered with the work on `stream` (the decoder's, which runs the steps).
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

  // read_direct() that returns once the copies are queued: a ticket (> 0; 0 for an empty list)
  // for reads_done(). The places must stay untouched until then. The blocks may be written
  // meanwhile: work queued later on the pool's stream waits (on the device) for their gather,
  // write_direct() for the gathers of the blocks it writes; neither waits for the copies out.
  // order_pool false: the caller keeps the blocks from being written until the ticket lands,
  // and the pool's stream does not wait for the gathers either.
  Result<uint64_t> read_direct_async(std::span<const int32_t> blocks, std::span<uint8_t* const> outs,
                                     bool order_pool = true);
  // Whether the copies of `ticket` (and of every earlier one) have landed in host memory;
  // wait: blocks until they have. An error: a copy failed (the places hold no valid bytes).
  Result<bool> reads_done(uint64_t ticket, bool wait);

  int32_t chunk_blocks() const { return chunk_blocks_; }

 private:
  KvTransfer() = default;
  Status check_ids(std::span<const int32_t> blocks) const;
  struct Demotion {
    uint64_t seq = 0;
    cudaEvent_t gathered = nullptr;  // the chunk's blocks are in the staging (the pool may change)
    cudaEvent_t landed = nullptr;    // the chunk's bytes are in host memory
  };
  Result<cudaEvent_t> take_event();
  // Under mu_: drops the leading demotions that have landed (wait: all up to `upto`).
  Status retire(uint64_t upto, bool wait);
  // Under mu_: the gather event of demotion `seq` (not landed yet), null when none is pending.
  cudaEvent_t gather_event(uint64_t seq) const;

  KvPartLayout layout_;
  int32_t n_blocks_ = 0;
  int64_t block_bytes_ = 0;
  int32_t chunk_blocks_ = 0;  // blocks of one staging half
  cudaStream_t stream_ = nullptr;  // the pool's (the decoder's)
  cudaStream_t down_ = nullptr;    // demotions: gathers and copies out
  cudaStream_t up_ = nullptr;      // write_direct's copies in
  cudaStream_t scatter_ = nullptr; // write_direct's scatters
  uint8_t* device_ = nullptr;  // [2, chunk_blocks, block_bytes]
  uint8_t* demote_device_ = nullptr;  // [2, chunk_blocks, block_bytes], the demotions' halves
  uint8_t* pinned_ = nullptr;  // [2, chunk_blocks, block_bytes] host, cudaHostAlloc
  cudaEvent_t done_[2] = {nullptr, nullptr};  // the copy through pinned half h finished
  cudaEvent_t copied_in_[2] = {nullptr, nullptr};  // write_direct: half h's copy in finished
  cudaEvent_t scattered_[2] = {nullptr, nullptr};  // write_direct: half h's scatter finished
  cudaEvent_t mark_ = nullptr;  // a point on the pool's stream or on scatter_
  int demote_half_ = 0;         // the demotion half the next chunk gathers into

  std::mutex mu_;  // what follows
  std::deque<Demotion> demotions_;     // queued, not known to have landed; oldest first
  std::vector<cudaEvent_t> spare_events_;
  std::vector<uint64_t> gather_seq_;   // [n_blocks] the demotion that last gathered the block
  uint64_t next_seq_ = 1;
  uint64_t landed_seq_ = 0;    // demotions up to this one have landed
  uint64_t scatter_seq_ = 0;   // scatter_ waits for the gathers up to this one
};

}  // namespace strata::cuda
