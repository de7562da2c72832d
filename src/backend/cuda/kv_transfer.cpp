#include "backend/cuda/kv_transfer.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_check.h"

namespace strata::cuda {

namespace {

// Host copy between the caller's bytes and pinned staging; large copies split over a few
// threads (one core's memcpy falls well short of the host-device link).
void host_copy(uint8_t* dst, const uint8_t* src, size_t n) {
  constexpr size_t kPiece = size_t(8) << 20;
  const size_t n_threads = std::min<size_t>(4, n / kPiece);
  if (n_threads <= 1) {
    std::memcpy(dst, src, n);
    return;
  }
  const size_t step = (n / n_threads + 63) & ~size_t(63);
  std::vector<std::thread> workers;
  for (size_t t = 1; t < n_threads; ++t) {
    const size_t b = std::min(n, t * step), e = std::min(n, (t + 1) * step);
    if (b < e) workers.emplace_back([=] { std::memcpy(dst + b, src + b, e - b); });
  }
  std::memcpy(dst, src, std::min(n, step));
  for (auto& w : workers) w.join();
}

}  // namespace

KvTransfer::~KvTransfer() {
  // Copies still in flight write into the caller's memory: they finish first.
  for (cudaStream_t s : {down_, up_, scatter_}) {
    if (s != nullptr) cudaStreamSynchronize(s);
  }
  for (const Demotion& d : demotions_) spare_events_.insert(spare_events_.end(), {d.gathered, d.landed});
  for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
  for (cudaEvent_t e : {done_[0], done_[1], copied_in_[0], copied_in_[1], scattered_[0], scattered_[1], mark_}) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  for (cudaStream_t s : {down_, up_, scatter_}) {
    if (s != nullptr) cudaStreamDestroy(s);
  }
  if (device_ != nullptr) cudaFree(device_);
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
}

Result<std::unique_ptr<KvTransfer>> KvTransfer::create(const KvBlockPool& pool, cudaStream_t stream, int64_t staging_bytes) {
  std::unique_ptr<KvTransfer> t(new KvTransfer());
  const KvPoolLayout& l = pool.layout();
  t->n_blocks_ = pool.n_blocks();
  t->block_bytes_ = l.bytes_per_block();
  // A block is its full-attention parts (sliding-window layers that page apart are not part of
  // it), whose regions lie back to back in the pool: one stride between them.
  const std::vector<int> parts = l.block_parts();
  if (parts.empty()) return make_error(ErrorCode::kUnsupported, "KV transfer: the pool has no full-attention parts");
  t->layout_.base = pool.part(parts[0]);
  // One gather kernel moves parts of one size (bf16, or one codec with K and V rows alike).
  if (!l.uniform_parts()) return make_error(ErrorCode::kUnsupported, "KV transfer: the pool's parts differ in size");
  t->layout_.part_bytes = l.part_bytes(parts[0]);
  t->layout_.part_stride = parts.size() > 1 ? int64_t(pool.part(parts[1]) - pool.part(parts[0])) : 0;
  t->layout_.n_parts = int32_t(parts.size());
  t->stream_ = stream;
  if (t->block_bytes_ <= 0) return make_error(ErrorCode::kInvalidArgument, "KV transfer: the pool's blocks have no bytes");
  t->chunk_blocks_ = int32_t(std::clamp<int64_t>(staging_bytes / 4 / t->block_bytes_, 1, kKvTransferMaxBlocks));
  const size_t bytes = size_t(2) * size_t(t->chunk_blocks_) * size_t(t->block_bytes_);
  // One allocation: the pool stream's two halves, then the demotions' two.
  STRATA_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&t->device_), 2 * bytes));
  t->demote_device_ = t->device_ + bytes;
  STRATA_CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&t->pinned_), bytes, cudaHostAllocDefault));
  for (cudaEvent_t* e : {&t->done_[0], &t->done_[1], &t->copied_in_[0], &t->copied_in_[1], &t->scattered_[0],
                         &t->scattered_[1], &t->mark_}) {
    STRATA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  }
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&t->down_, cudaStreamNonBlocking));
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&t->up_, cudaStreamNonBlocking));
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&t->scatter_, cudaStreamNonBlocking));
  t->gather_seq_.assign(size_t(t->n_blocks_), 0);
  return t;
}

Status KvTransfer::check_ids(std::span<const int32_t> blocks) const {
  for (int32_t b : blocks) {
    if (b < 0 || b >= n_blocks_) {
      return make_error(ErrorCode::kOutOfRange, "KV block " + std::to_string(b) + " outside the pool of " +
                                                    std::to_string(n_blocks_) + " blocks");
    }
  }
  return Status();
}

Status KvTransfer::read(std::span<const int32_t> blocks, uint8_t* out) {
  STRATA_RETURN_IF_ERROR(check_ids(blocks));
  const size_t n = blocks.size();
  const size_t half = size_t(chunk_blocks_) * size_t(block_bytes_);
  const size_t bb = size_t(block_bytes_);
  // Chunk c goes through half c % 2; its bytes are copied out while chunk c + 1 is on the device.
  size_t prev_begin = 0, prev_n = 0;
  int prev_h = -1;
  auto drain = [&]() -> Status {
    if (prev_h < 0) return Status();
    STRATA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(done_[prev_h]));
    host_copy(out + prev_begin * bb, pinned_ + size_t(prev_h) * half, prev_n * bb);
    return Status();
  };
  int h = 0;
  for (size_t begin = 0; begin < n; begin += size_t(chunk_blocks_), h ^= 1) {
    KvBlockList list;
    list.n = int32_t(std::min(n - begin, size_t(chunk_blocks_)));
    std::copy_n(blocks.begin() + begin, list.n, list.ids);
    uint8_t* dev = device_ + size_t(h) * half;
    launch_kv_gather(layout_, list, dev, stream_);
    STRATA_CUDA_CHECK(cudaMemcpyAsync(pinned_ + size_t(h) * half, dev, size_t(list.n) * bb, cudaMemcpyDeviceToHost, stream_));
    STRATA_CUDA_CHECK(cudaEventRecord(done_[h], stream_));
    STRATA_RETURN_IF_ERROR(drain());
    prev_begin = begin;
    prev_n = size_t(list.n);
    prev_h = h;
  }
  return drain();
}

Status KvTransfer::write(std::span<const int32_t> blocks, const uint8_t* in) {
  STRATA_RETURN_IF_ERROR(check_ids(blocks));
  const size_t n = blocks.size();
  const size_t half = size_t(chunk_blocks_) * size_t(block_bytes_);
  const size_t bb = size_t(block_bytes_);
  // The host fills pinned half c % 2 while the device copies and scatters the other one.
  bool used[2] = {false, false};
  int h = 0;
  for (size_t begin = 0; begin < n; begin += size_t(chunk_blocks_), h ^= 1) {
    KvBlockList list;
    list.n = int32_t(std::min(n - begin, size_t(chunk_blocks_)));
    std::copy_n(blocks.begin() + begin, list.n, list.ids);
    if (used[h]) STRATA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(done_[h]));
    uint8_t* pin = pinned_ + size_t(h) * half;
    uint8_t* dev = device_ + size_t(h) * half;
    host_copy(pin, in + begin * bb, size_t(list.n) * bb);
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dev, pin, size_t(list.n) * bb, cudaMemcpyHostToDevice, stream_));
    STRATA_CUDA_CHECK(cudaEventRecord(done_[h], stream_));
    used[h] = true;
    launch_kv_scatter(layout_, list, dev, stream_);
  }
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status();
}

namespace {

// Runs of list entries [k, k + r) whose places follow each other, each copied at once.
template <class P, class F>
Status for_each_run(std::span<P> places, size_t begin, int32_t n, size_t bb, F copy) {
  for (int32_t k = 0; k < n;) {
    int32_t r = 1;
    while (k + r < n && places[begin + size_t(k + r)] == places[begin + size_t(k)] + size_t(r) * bb) ++r;
    STRATA_RETURN_IF_ERROR(copy(places[begin + size_t(k)], size_t(k), size_t(r)));
    k += r;
  }
  return Status();
}

}  // namespace

Status KvTransfer::read_direct(std::span<const int32_t> blocks, std::span<uint8_t* const> outs) {
  STRATA_RETURN_IF_ERROR(check_ids(blocks));
  if (outs.size() != blocks.size()) return make_error(ErrorCode::kInvalidArgument, "KV transfer: one place per block");
  const size_t half = size_t(chunk_blocks_) * size_t(block_bytes_);
  const size_t bb = size_t(block_bytes_);
  // All on one stream: chunk c + 2's gather into half c % 2 waits for chunk c's copies out.
  int h = 0;
  for (size_t begin = 0; begin < blocks.size(); begin += size_t(chunk_blocks_), h ^= 1) {
    KvBlockList list;
    list.n = int32_t(std::min(blocks.size() - begin, size_t(chunk_blocks_)));
    std::copy_n(blocks.begin() + begin, list.n, list.ids);
    uint8_t* dev = device_ + size_t(h) * half;
    launch_kv_gather(layout_, list, dev, stream_);
    STRATA_RETURN_IF_ERROR(for_each_run(outs, begin, list.n, bb, [&](uint8_t* dst, size_t k, size_t r) -> Status {
      STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, dev + k * bb, r * bb, cudaMemcpyDeviceToHost, stream_));
      return Status();
    }));
  }
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status();
}

Status KvTransfer::write_direct(std::span<const int32_t> blocks, std::span<const uint8_t* const> ins) {
  STRATA_RETURN_IF_ERROR(check_ids(blocks));
  if (ins.size() != blocks.size()) return make_error(ErrorCode::kInvalidArgument, "KV transfer: one place per block");
  if (blocks.empty()) return Status();
  const size_t half = size_t(chunk_blocks_) * size_t(block_bytes_);
  const size_t bb = size_t(block_bytes_);
  std::lock_guard<std::mutex> lock(mu_);
  STRATA_RETURN_IF_ERROR(retire(0, false));
  // Chunk c: copied into half c % 2 on up_ (once scatter_ has scattered the chunk before it
  // out of that half, in this call or an earlier one), then scattered on scatter_ once its copy
  // landed, the work queued on the pool's stream so far is done (a step still in flight may
  // read or write a block given back since and now written here), and the gathers of the old
  // bytes of its blocks (demotions still in flight) are done. The copies in do not wait for
  // the pool's stream: the caller gets its places back without waiting for a step.
  STRATA_CUDA_RETURN_IF_ERROR(cudaEventRecord(mark_, stream_));
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(scatter_, mark_, 0));
  int h = 0;
  for (size_t begin = 0; begin < blocks.size(); begin += size_t(chunk_blocks_), h ^= 1) {
    KvBlockList list;
    list.n = int32_t(std::min(blocks.size() - begin, size_t(chunk_blocks_)));
    std::copy_n(blocks.begin() + begin, list.n, list.ids);
    uint8_t* dev = device_ + size_t(h) * half;
    STRATA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(up_, scattered_[h], 0));  // never recorded: no wait
    STRATA_RETURN_IF_ERROR(for_each_run(ins, begin, list.n, bb, [&](const uint8_t* src, size_t k, size_t r) -> Status {
      STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev + k * bb, src, r * bb, cudaMemcpyHostToDevice, up_));
      return Status();
    }));
    STRATA_CUDA_RETURN_IF_ERROR(cudaEventRecord(copied_in_[h], up_));
    STRATA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(scatter_, copied_in_[h], 0));
    uint64_t newest = 0;
    for (int32_t k = 0; k < list.n; ++k) newest = std::max(newest, gather_seq_[size_t(list.ids[k])]);
    if (newest > scatter_seq_ && newest > landed_seq_) {
      // Gathers run in order on down_: waiting for the newest covers the older ones.
      STRATA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(scatter_, gather_event(newest), 0));
      scatter_seq_ = newest;
    }
    launch_kv_scatter(layout_, list, dev, scatter_);
    STRATA_CUDA_RETURN_IF_ERROR(cudaEventRecord(scattered_[h], scatter_));
  }
  // Later work on the pool's stream reads the installed blocks; scatter_ waited for every copy
  // in, so its end covers them. The places may be reused once the copies in are done.
  STRATA_CUDA_RETURN_IF_ERROR(cudaEventRecord(mark_, scatter_));
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, mark_, 0));
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(up_));
  return Status();
}

Result<cudaEvent_t> KvTransfer::take_event() {
  if (!spare_events_.empty()) {
    cudaEvent_t e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  STRATA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

cudaEvent_t KvTransfer::gather_event(uint64_t seq) const {
  if (demotions_.empty() || seq < demotions_.front().seq || seq > demotions_.back().seq) return nullptr;
  return demotions_[size_t(seq - demotions_.front().seq)].gathered;
}

Status KvTransfer::retire(uint64_t upto, bool wait) {
  while (!demotions_.empty()) {
    Demotion& d = demotions_.front();
    if (wait && d.seq <= upto) {
      STRATA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(d.landed));
    } else {
      const cudaError_t e = cudaEventQuery(d.landed);
      if (e == cudaErrorNotReady) break;
      STRATA_CUDA_RETURN_IF_ERROR(e);
    }
    landed_seq_ = d.seq;
    spare_events_.push_back(d.gathered);
    spare_events_.push_back(d.landed);
    demotions_.pop_front();
  }
  return Status();
}

Result<uint64_t> KvTransfer::read_direct_async(std::span<const int32_t> blocks, std::span<uint8_t* const> outs,
                                               bool order_pool) {
  STRATA_RETURN_IF_ERROR(check_ids(blocks));
  if (outs.size() != blocks.size()) return make_error(ErrorCode::kInvalidArgument, "KV transfer: one place per block");
  if (blocks.empty()) return uint64_t(0);
  const size_t half = size_t(chunk_blocks_) * size_t(block_bytes_);
  const size_t bb = size_t(block_bytes_);
  std::lock_guard<std::mutex> lock(mu_);
  STRATA_RETURN_IF_ERROR(retire(0, false));
  // Gathers see every earlier write of the pool stream. On down_, in order: chunk c's gather
  // into demotion half h waits for the copies out of the chunk before it in that half.
  STRATA_CUDA_RETURN_IF_ERROR(cudaEventRecord(mark_, stream_));
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(down_, mark_, 0));
  uint64_t seq = 0;
  for (size_t begin = 0; begin < blocks.size(); begin += size_t(chunk_blocks_)) {
    KvBlockList list;
    list.n = int32_t(std::min(blocks.size() - begin, size_t(chunk_blocks_)));
    std::copy_n(blocks.begin() + begin, list.n, list.ids);
    auto gathered = take_event();
    if (!gathered.ok()) return gathered.error();
    auto landed = take_event();
    if (!landed.ok()) {
      spare_events_.push_back(*gathered);
      return landed.error();
    }
    Demotion d{next_seq_, *gathered, *landed};
    uint8_t* dev = demote_device_ + size_t(demote_half_) * half;
    launch_kv_gather(layout_, list, dev, down_);
    Status st = [&]() -> Status {
      STRATA_CUDA_RETURN_IF_ERROR(cudaEventRecord(d.gathered, down_));
      STRATA_RETURN_IF_ERROR(for_each_run(outs, begin, list.n, bb, [&](uint8_t* dst, size_t k, size_t r) -> Status {
        STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, dev + k * bb, r * bb, cudaMemcpyDeviceToHost, down_));
        return Status();
      }));
      STRATA_CUDA_RETURN_IF_ERROR(cudaEventRecord(d.landed, down_));
      return Status();
    }();
    if (!st.ok()) {
      // Nothing of this call may land after it failed: earlier chunks finish first.
      cudaStreamSynchronize(down_);
      spare_events_.push_back(d.gathered);
      spare_events_.push_back(d.landed);
      return st.error();
    }
    for (int32_t k = 0; k < list.n; ++k) gather_seq_[size_t(list.ids[k])] = d.seq;
    demotions_.push_back(d);
    seq = next_seq_++;
    demote_half_ ^= 1;
  }
  // Whatever the pool's stream runs next (a step writing into these blocks) waits for their
  // gather, not for the copies out; blocks the caller holds are written by no step.
  if (order_pool) STRATA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, demotions_.back().gathered, 0));
  return seq;
}

Result<bool> KvTransfer::reads_done(uint64_t ticket, bool wait) {
  std::lock_guard<std::mutex> lock(mu_);
  STRATA_RETURN_IF_ERROR(retire(ticket, wait));
  return landed_seq_ >= ticket || demotions_.empty() || demotions_.front().seq > ticket;
}

}  // namespace strata::cuda
