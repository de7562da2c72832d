#include "model/kv_storage.h"

#include <algorithm>

#include "core/check.h"

namespace strata {

KvStorage::KvStorage(const std::vector<KvLayerSpec>& layout, int32_t n_blocks, int32_t block_size)
    : layout_(layout), k_(layout.size()), v_(layout.size()), n_blocks_(n_blocks), block_size_(block_size) {
  for (size_t l = 0; l < layout_.size(); ++l) {
    const auto& s = layout_[l];
    if (!s.has_kv || s.shares_with >= 0) continue;
    const size_t per_block = size_t(block_size) * size_t(s.n_kv_heads);
    k_[l].assign(size_t(n_blocks) * per_block * size_t(s.head_dim_k), 0.0f);
    v_[l].assign(size_t(n_blocks) * per_block * size_t(s.head_dim_v), 0.0f);
  }
}

float* KvStorage::k_pool(int layer) {
  const int owner = layout_[layer].shares_with >= 0 ? layout_[layer].shares_with : layer;
  STRATA_CHECK(!k_[owner].empty(), "layer has no KV");
  return k_[owner].data();
}

float* KvStorage::v_pool(int layer) {
  const int owner = layout_[layer].shares_with >= 0 ? layout_[layer].shares_with : layer;
  STRATA_CHECK(!v_[owner].empty(), "layer has no KV");
  return v_[owner].data();
}

int64_t KvStorage::bytes_per_token() const { return bytes_per_token(layout_); }

int64_t KvStorage::bytes_per_token(const std::vector<KvLayerSpec>& layout) {
  int64_t bytes = 0;
  for (const auto& s : layout) {
    if (!s.has_kv || s.shares_with >= 0) continue;
    bytes += int64_t(s.n_kv_heads) * (s.head_dim_k + s.head_dim_v) * int64_t(sizeof(float));
  }
  return bytes;
}

StateStorage::StateStorage(const std::vector<StateLayerSpec>& layout, int32_t n_slots)
    : layout_(layout), conv_(layout.size()), rec_(layout.size()), n_slots_(n_slots) {
  for (size_t l = 0; l < layout_.size(); ++l) {
    if (!layout_[l].has_state) continue;
    conv_[l].assign(size_t(n_slots) * size_t(layout_[l].conv_floats), 0.0f);
    rec_[l].assign(size_t(n_slots) * size_t(layout_[l].recurrent_floats), 0.0f);
  }
}

float* StateStorage::conv(int layer, int32_t slot) {
  STRATA_CHECK(layout_[layer].has_state && slot >= 0 && slot < n_slots_);
  return conv_[layer].data() + size_t(slot) * size_t(layout_[layer].conv_floats);
}

float* StateStorage::recurrent(int layer, int32_t slot) {
  STRATA_CHECK(layout_[layer].has_state && slot >= 0 && slot < n_slots_);
  return rec_[layer].data() + size_t(slot) * size_t(layout_[layer].recurrent_floats);
}

void StateStorage::reset(int32_t slot) {
  for (size_t l = 0; l < layout_.size(); ++l) {
    if (!layout_[l].has_state) continue;
    std::fill_n(conv(int(l), slot), layout_[l].conv_floats, 0.0f);
    std::fill_n(recurrent(int(l), slot), layout_[l].recurrent_floats, 0.0f);
  }
}

}  // namespace strata
