// Device memory: everything a model needs is taken at load time, never inside a step.
//  - DeviceArena: one cudaMalloc carved by a bump pointer (weights, step scratch, the GEMM
//    workspace). Pieces are never freed one by one; the arena frees all at destruction.
//  - KvBlockPool: the paged KV cache, one allocation sized in bytes, split into blocks of
//    `block_size` tokens; per layer a K and a V region [n_blocks, block_size, n_kv_heads, head_dim] bf16.
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
  // Bytes of one block over all layers (K and V, bf16).
  int64_t bytes_per_block() const { return int64_t(n_layers) * 2 * block_size * n_kv_heads * head_dim * 2; }
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
  // Layer `layer`'s pools, [n_blocks, block_size, n_kv_heads, head_dim] bf16 bits.
  uint16_t* k(int layer) const { return base_ + size_t(layer) * 2 * layer_elems_; }
  uint16_t* v(int layer) const { return base_ + (size_t(layer) * 2 + 1) * layer_elems_; }

 private:
  KvPoolLayout layout_;
  int32_t n_blocks_ = 0;
  size_t layer_elems_ = 0;  // elements of one layer's K (or V) region
  uint16_t* base_ = nullptr;
};

}  // namespace strata::cuda
