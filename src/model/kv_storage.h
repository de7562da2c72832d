// KvStorage: the memory behind the paged KV cache, one K and one V pool per layer that owns
// KV, indexed by block id. The block pool (src/kv) decides which ids a sequence holds; this
// owns only bytes. StateStorage holds the per-slot recurrent state of linear-attention layers.
#pragma once

#include <cstdint>
#include <vector>

namespace strata {

// What one layer needs in the KV pool (from Model::kv_layout()).
struct KvLayerSpec {
  int32_t n_kv_heads = 0;
  int32_t head_dim_k = 0;
  int32_t head_dim_v = 0;
  int32_t window = 0;        // 0: full attention; else sliding window in tokens
  int32_t shares_with = -1;  // >= 0: this layer reads that layer's KV and owns none
  bool has_kv = true;        // false for layers with no attention KV (linear attention)
};

// Recurrent state a layer keeps per sequence (from Model::state_layout()).
struct StateLayerSpec {
  int64_t conv_floats = 0;       // per slot: causal conv1d tail
  int64_t recurrent_floats = 0;  // per slot: recurrent matrix state
  bool has_state = false;
};

class KvStorage {
 public:
  KvStorage() = default;
  KvStorage(const std::vector<KvLayerSpec>& layout, int32_t n_blocks, int32_t block_size);

  int32_t n_blocks() const { return n_blocks_; }
  int32_t block_size() const { return block_size_; }
  // Pools of the layer that physically holds layer `layer`'s KV (follows shares_with).
  float* k_pool(int layer);  // [n_blocks, block_size, n_kv_heads, head_dim_k] f32
  float* v_pool(int layer);  // [n_blocks, block_size, n_kv_heads, head_dim_v] f32
  const KvLayerSpec& spec(int layer) const { return layout_[layer]; }
  // Bytes of KV one token takes over all layers that own KV.
  int64_t bytes_per_token() const;
  static int64_t bytes_per_token(const std::vector<KvLayerSpec>& layout);

 private:
  std::vector<KvLayerSpec> layout_;
  std::vector<std::vector<float>> k_, v_;  // per owning layer
  int32_t n_blocks_ = 0;
  int32_t block_size_ = 16;
};

class StateStorage {
 public:
  StateStorage() = default;
  StateStorage(const std::vector<StateLayerSpec>& layout, int32_t n_slots);

  int32_t n_slots() const { return n_slots_; }
  float* conv(int layer, int32_t slot);       // [conv_floats]
  float* recurrent(int layer, int32_t slot);  // [recurrent_floats]
  // Zeroes a slot's state in every layer (a new sequence starts from zero state).
  void reset(int32_t slot);

 private:
  std::vector<StateLayerSpec> layout_;
  std::vector<std::vector<float>> conv_, rec_;
  int32_t n_slots_ = 0;
};

}  // namespace strata
