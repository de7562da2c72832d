// KvStorage: the memory behind the paged KV cache, one K and one V pool per layer that owns
// KV, indexed by block id. The block pool (src/kv) decides which ids a sequence holds; this
// owns only bytes. Each layer's pools hold rows in that layer's codec (KvLayerSpec::codec;
// row formats in backend/reference/kv_codec.h): [n_blocks, block_size, n_kv_heads] rows. StateStorage holds the per-slot recurrent state of linear-attention layers.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/reference/kv_codec.h"

namespace strata {

// What one layer needs in the KV pool (from Model::kv_layout()).
struct KvLayerSpec {
  int32_t n_kv_heads = 0;
  int32_t head_dim_k = 0;
  int32_t head_dim_v = 0;
  int32_t window = 0;        // 0: full attention; else sliding window in tokens
  int32_t shares_with = -1;  // >= 0: this layer reads that layer's KV and owns none
  bool has_kv = true;        // false for layers with no attention KV (linear attention)
  KvCodecSpec codec;         // how the layer's rows are stored (auto: f32)
};

// Recurrent state a layer keeps per sequence (from Model::state_layout()).
struct StateLayerSpec {
  int64_t conv_floats = 0;       // per slot: causal conv1d tail
  int64_t recurrent_floats = 0;  // per slot: recurrent matrix state
  bool has_state = false;
  // > 0: the layer's prefill arithmetic groups absolute positions in blocks of this many, so
  // prefill cut at multiples of it (or at the prompt's end) computes the same bits however cut.
  int32_t prefill_chunk = 0;
};

class KvStorage {
 public:
  KvStorage() = default;
  // n_window_blocks: blocks in the pools of sliding-window layers (window > 0), which page
  // apart from the full-attention layers (SeqSpan::window_block_table); < 0: n_blocks.
  KvStorage(const std::vector<KvLayerSpec>& layout, int32_t n_blocks, int32_t block_size,
            int32_t n_window_blocks = -1);

  int32_t n_blocks() const { return n_blocks_; }
  // Blocks in the pools `layer` reads (follows shares_with).
  int32_t n_blocks(int layer) const;
  // True when the pools `layer` reads belong to a sliding-window layer (follows shares_with).
  bool window_paged(int layer) const;
  int32_t block_size() const { return block_size_; }
  // Pools of the layer that physically holds layer `layer`'s KV (follows shares_with).
  // The f32 views need the f32 row format (codec auto).
  float* k_pool(int layer);  // [n_blocks, block_size, n_kv_heads, head_dim_k] f32
  float* v_pool(int layer);  // [n_blocks, block_size, n_kv_heads, head_dim_v] f32
  // Rows in any codec: [n_blocks, block_size, n_kv_heads] rows of k_format/v_format(layer).bytes().
  uint8_t* k_rows(int layer);
  uint8_t* v_rows(int layer);
  const KvLayerSpec& spec(int layer) const { return layout_[layer]; }
  // The layer that physically holds `layer`'s KV (itself unless it shares).
  int owner(int layer) const { return layout_[layer].shares_with >= 0 ? layout_[layer].shares_with : layer; }
  // Row formats of the pools `layer` reads (the owner's codec).
  KvRowFormat k_format(int layer) const;
  KvRowFormat v_format(int layer) const;
  // Bytes of KV one token takes over all layers that own KV, in their codecs.
  int64_t bytes_per_token() const;
  static int64_t bytes_per_token(const std::vector<KvLayerSpec>& layout);
  // Bytes of one token of one layer (K and V, all KV heads) in the layer's codec.
  static int64_t layer_bytes_per_token(const KvLayerSpec& s);

  // The storage holding sequences' converted blocks (SeqSpan::n_quant_blocks): the same layout
  // apart from each layer's codec and the block count. Not owned; nullptr: none.
  void set_quant(KvStorage* quant) { quant_ = quant; }
  KvStorage* quant() const { return quant_; }

 private:
  std::vector<KvLayerSpec> layout_;
  std::vector<std::vector<float>> k_, v_;  // per owning layer; f32 words holding the rows' bytes
  int32_t n_blocks_ = 0;
  int32_t n_window_blocks_ = 0;
  int32_t block_size_ = 16;
  KvStorage* quant_ = nullptr;
};

// Re-encodes block `src_block` of `layer` in `src` into block `dst_block` of the same layer in
// `dst` (K and V, every KV head), from src's codec for the layer to dst's. The work and scratch
// are one block of one layer. Both storages must describe the layer alike apart from the codec
// and share the block size; `layer` must own its KV; src and dst may be the same storage only
// when the two blocks differ.
void convert_kv_block(KvStorage& src, int layer, int32_t src_block, KvStorage& dst, int32_t dst_block);

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
