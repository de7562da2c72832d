// Device memory: everything a model needs is taken at load time, never inside a step.
//  - DeviceArena: one cudaMalloc carved by a bump pointer (weights, step scratch, the GEMM
//    workspace). Pieces are never freed one by one; the arena frees all at destruction.
//  - KvBlockPool: the paged KV cache, one allocation sized in bytes, split into blocks of
//    `block_size` tokens; per layer a K and a V region [n_blocks, block_size, n_kv_heads] rows,
//    bf16 [head_dim] rows or the rows of a KV codec (kv_codec.h; KvPoolLayout::row_bytes).
//    Sliding-window layers may page apart (KvPoolLayout::window_layers, as the engine's window
//    pool): their regions hold n_window_blocks() blocks, indexed by SeqSpan::window_block_table;
//    the others hold n_blocks(), indexed by SeqSpan::block_table. The full-attention regions lie
//    first, back to back, so a block copy (kv_transfer.h) strides over them alone.
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
  // Per layer: nonzero when the layer's parts page in the sliding-window pool; empty: none do.
  std::vector<uint8_t> window_layers = {};
  // Blocks of the window pool (the KV plan's, kv/kv_plan.h).
  int32_t window_blocks = 0;
  bool window_part(int part) const { return !window_layers.empty() && window_layers[size_t(part / 2)] != 0; }
  bool window_paged() const {
    for (uint8_t w : window_layers) {
      if (w != 0) return true;
    }
    return false;
  }
  // The parts a full-attention block id indexes, in order: what a block copy moves.
  std::vector<int> block_parts() const {
    std::vector<int> v;
    for (int p = 0; p < 2 * n_layers; ++p) {
      if (!window_part(p)) v.push_back(p);
    }
    return v;
  }
  // Bytes of one block of one part.
  int64_t part_bytes(int part) const {
    return int64_t(block_size) * n_kv_heads * (row_bytes.empty() ? int64_t(head_dim) * 2 : int64_t(row_bytes[size_t(part)]));
  }
  // Bytes of one full-attention block over its layers (K and V): block_parts().
  int64_t bytes_per_block() const {
    int64_t b = 0;
    for (int p = 0; p < 2 * n_layers; ++p) b += window_part(p) ? 0 : part_bytes(p);
    return b;
  }
  // Bytes of one window-pool block over the window layers (0: none page apart).
  int64_t window_bytes_per_block() const {
    int64_t b = 0;
    for (int p = 0; p < 2 * n_layers; ++p) b += window_part(p) ? part_bytes(p) : 0;
    return b;
  }
  // Every block part has the same bytes (bf16, or one codec whose K and V rows match).
  bool uniform_parts() const {
    const std::vector<int> parts = block_parts();
    for (int p : parts) {
      if (part_bytes(p) != part_bytes(parts[0])) return false;
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

  // As many blocks as fit in `bytes` (at least one, else an Error naming the sizes). With
  // window layers: the window pool takes layout.window_blocks and the full-attention parts the
  // rest.
  static Result<std::unique_ptr<KvBlockPool>> create(const KvPoolLayout& layout, int64_t bytes);

  const KvPoolLayout& layout() const { return layout_; }
  // Blocks of the full-attention parts (the ids of SeqSpan::block_table).
  int32_t n_blocks() const { return n_blocks_; }
  // Blocks of the window layers' parts (0: none page apart).
  int32_t n_window_blocks() const { return n_window_blocks_; }
  // Blocks in part p's region.
  int32_t n_blocks(int part) const { return layout_.window_part(part) ? n_window_blocks_ : n_blocks_; }
  // Layer `layer`'s pools, [n_blocks, block_size, n_kv_heads, head_dim] bf16 bits (bf16 rows).
  uint16_t* k(int layer) const { return reinterpret_cast<uint16_t*>(part(2 * layer)); }
  uint16_t* v(int layer) const { return reinterpret_cast<uint16_t*>(part(2 * layer + 1)); }
  // Part p's region (2 l: layer l's K, 2 l + 1: its V), [n_blocks, block_size, n_kv_heads] rows.
  uint8_t* part(int p) const { return base_ + part_offset_[size_t(p)]; }

 private:
  KvPoolLayout layout_;
  int32_t n_blocks_ = 0;
  int32_t n_window_blocks_ = 0;
  std::vector<size_t> part_offset_;  // bytes from base_ to each part's region
  uint8_t* base_ = nullptr;
};

}  // namespace strata::cuda
