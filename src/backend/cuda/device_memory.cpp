#include "backend/cuda/device_memory.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>

#include "backend/cuda/cuda_check.h"

namespace strata::cuda {

DeviceArena::~DeviceArena() {
  if (base_ != nullptr) cudaFree(base_);
}

Result<std::unique_ptr<DeviceArena>> DeviceArena::create(size_t bytes, const std::string& what) {
  auto a = std::make_unique<DeviceArena>();
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return make_error(err == cudaErrorMemoryAllocation ? ErrorCode::kResourceExhausted : ErrorCode::kInternal,
                      "cannot allocate " + std::to_string(bytes) + " bytes of device memory for " + what + ": " +
                          cudaGetErrorString(err));
  }
  a->base_ = static_cast<char*>(p);
  a->capacity_ = bytes;
  return a;
}

Result<void*> DeviceArena::take(size_t bytes, const std::string& what) {
  const size_t start = (used_ + 255) & ~size_t(255);
  if (start + bytes > capacity_) {
    return make_error(ErrorCode::kResourceExhausted, "device arena full: " + what + " needs " + std::to_string(bytes) +
                                                         " bytes, " + std::to_string(capacity_ - std::min(capacity_, start)) +
                                                         " of " + std::to_string(capacity_) + " left");
  }
  used_ = start + bytes;
  return static_cast<void*>(base_ + start);
}

KvBlockPool::~KvBlockPool() {
  if (base_ != nullptr) cudaFree(base_);
}

Result<std::unique_ptr<KvBlockPool>> KvBlockPool::create(const KvPoolLayout& layout, int64_t bytes) {
  if (!layout.row_bytes.empty() && layout.row_bytes.size() != size_t(2 * layout.n_layers)) {
    return make_error(ErrorCode::kInvalidArgument, "KV pool layout: " + std::to_string(layout.row_bytes.size()) +
                                                       " row sizes for " + std::to_string(layout.n_layers) + " layers");
  }
  if (!layout.window_layers.empty() && layout.window_layers.size() != size_t(layout.n_layers)) {
    return make_error(ErrorCode::kInvalidArgument, "KV pool layout: " + std::to_string(layout.window_layers.size()) +
                                                       " window flags for " + std::to_string(layout.n_layers) + " layers");
  }
  const int64_t per_block = layout.bytes_per_block();
  const int64_t per_window_block = layout.window_bytes_per_block();
  if (per_block <= 0) return make_error(ErrorCode::kInvalidArgument, "KV pool layout has no bytes per block");
  int64_t n_window = 0;
  if (per_window_block > 0) {
    if (layout.window_blocks < 1) return make_error(ErrorCode::kInvalidArgument, "KV pool layout: window layers without window blocks");
    n_window = layout.window_blocks;
    if (n_window * per_window_block >= bytes) {
      return make_error(ErrorCode::kInvalidArgument, "KV cache bytes " + std::to_string(bytes) + " hold no full-attention block beside " +
                                                         std::to_string(n_window) + " sliding-window blocks of " +
                                                         std::to_string(per_window_block) + " bytes");
    }
  }
  const int64_t n_blocks = (bytes - n_window * per_window_block) / per_block;
  if (n_blocks < 1) {
    return make_error(ErrorCode::kInvalidArgument, "KV cache bytes " + std::to_string(bytes) +
                                                       " hold no block (one block takes " + std::to_string(per_block) + ")");
  }
  if (n_blocks > INT32_MAX) return make_error(ErrorCode::kInvalidArgument, "KV cache bytes " + std::to_string(bytes) + " give too many blocks");
  auto pool = std::make_unique<KvBlockPool>();
  pool->layout_ = layout;
  pool->n_blocks_ = int32_t(n_blocks);
  pool->n_window_blocks_ = int32_t(n_window);
  // Full-attention regions first, back to back in part order, then the window layers'.
  pool->part_offset_.assign(size_t(2 * layout.n_layers), 0);
  size_t total = 0;
  for (int window = 0; window < 2; ++window) {
    for (int part = 0; part < 2 * layout.n_layers; ++part) {
      if (int(layout.window_part(part)) != window) continue;
      pool->part_offset_[size_t(part)] = total;
      total += size_t(pool->n_blocks(part)) * size_t(layout.part_bytes(part));
    }
  }
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, total);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return make_error(ErrorCode::kResourceExhausted, "cannot allocate the KV block pool (" + std::to_string(total) +
                                                         " bytes): " + cudaGetErrorString(err));
  }
  pool->base_ = static_cast<uint8_t*>(p);
  return pool;
}

}  // namespace strata::cuda
