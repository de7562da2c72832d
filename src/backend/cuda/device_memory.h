// Device memory: everything a model needs is taken at load time, never inside a step.
//  - DeviceArena: one cudaMalloc carved by a bump pointer (weights, step scratch, the GEMM
//    workspace). Pieces are never freed one by one; the arena frees all at destruction.
//  - KvBlockPool: the paged KV cache, one allocation sized in bytes, split into blocks of
//    `block_size` tokens; per layer a K and a V region [n_blocks, block_size, n_kv_heads] rows,
//    bf16 [head_dim] rows or the rows of a KV codec (kv_codec.h; KvPoolLayout::row_bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace strata::cuda {

class DeviceArena {
 public:
  DeviceArena() = default;
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // Takes `bytes` of device memory; `what` names the purpose in the error.
  static Result<std::unique_ptr<DeviceArena>> create(size_t bytes, const std::string& what);

  // `bytes` aligned to 256; an Error (kResourceExhausted) naming `what` when the arena is full.
  Result<void*> take(size_t bytes, const std::string& what);
  template <class T>
  Result<T*> take_array(size_t n, const std::string& what) {
    auto p = take(n * sizeof(T), what);
    if (!p.ok()) return p.error();
    return static_cast<T*>(*p);
  }

  size_t capacity() const { return capacity_; }
  size_t used() const { return used_; }

 private:
  char* base_ = nullptr;
  size_t capacity_ = 0;
  size_t used_ = 0;
};

struct KvPoolLayout {
  int32_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;  // tokens per block
  // Bytes of one (token, KV head) row of each part (part 2 l: layer l's K, 2 l + 1: its V);
  // empty: bf16 rows (head_dim * 2 bytes) in every part.
  std::vector<int32_t> row_bytes = {};
  // Bytes of one block of one part.
  int64_t part_bytes(int part) const {
    return int64_t(block_size) * n_kv_heads * (row_bytes.empty() ? int64_t(head_dim) * 2 : int64_t(row_bytes[size_t(part)]));
  }
  // Bytes of one block over all layers (K and V).
  int64_t bytes_per_block() const {
    int64_t b = 0;
    for (int p = 0; p < 2 * n_layers; ++p) b += part_bytes(p);
    return b;
  }
  // Every part's blocks have the same bytes (bf16, or one codec whose K and V rows match).
  bool uniform_parts() const {
    for (int p = 1; p < 2 * n_layers; ++p) {
      if (part_bytes(p) != part_bytes(0)) return false;
    }
    return true;
  }
};

class KvBlockPool {
 public:
  KvBlockPool() = default;
  ~KvBlockPool();
  KvBlockPool(const KvBlockPool&) = delete;
  KvBlockPool& operator=(const KvBlockPool&) = delete;

  // As many blocks as fit in `bytes` (at least one, else an Error naming the sizes).
  static Result<std::unique_ptr<KvBlockPool>> create(const KvPoolLayout& layout, int64_t bytes);

  const KvPoolLayout& layout() const { return layout_; }
  int32_t n_blocks() const { return n_blocks_; }
  // Layer `layer`'s pools, [n_blocks, block_size, n_kv_heads, head_dim] bf16 bits (bf16 rows).
  uint16_t* k(int layer) const { return reinterpret_cast<uint16_t*>(part(2 * layer)); }
  uint16_t* v(int layer) const { return reinterpret_cast<uint16_t*>(part(2 * layer + 1)); }
  // Part p's region (2 l: layer l's K, 2 l + 1: its V), [n_blocks, block_size, n_kv_heads] rows.
  uint8_t* part(int p) const { return base_ + part_offset_[size_t(p)]; }

 private:
  KvPoolLayout layout_;
  int32_t n_blocks_ = 0;
  std::vector<size_t> part_offset_;  // bytes from base_ to each part's region
  uint8_t* base_ = nullptr;
};

}  // namespace strata::cuda
