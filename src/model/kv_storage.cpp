#include "model/kv_storage.h"

#include <algorithm>

#include "backend/cpu/kv_codec.h"
#include "core/check.h"

namespace strata {

KvStorage::KvStorage(const std::vector<KvLayerSpec>& layout, int32_t n_blocks, int32_t block_size,
                     int32_t n_window_blocks)
    : layout_(layout),
      k_(layout.size()),
      v_(layout.size()),
      n_blocks_(n_blocks),
      n_window_blocks_(n_window_blocks < 0 ? n_blocks : n_window_blocks),
      block_size_(block_size) {
  for (size_t l = 0; l < layout_.size(); ++l) {
    const auto& s = layout_[l];
    if (!s.has_kv || s.shares_with >= 0) continue;
    const size_t per_block = size_t(block_size) * size_t(s.n_kv_heads);
    const size_t blocks = size_t(s.window > 0 ? n_window_blocks_ : n_blocks_);
    // Row bytes are multiples of 4: f32 words hold them exactly, aligned for every format.
    k_[l].assign(blocks * per_block * size_t(kv_key_format(s.codec, s.head_dim_k).bytes() / 4), 0.0f);
    v_[l].assign(blocks * per_block * size_t(kv_value_format(s.codec, s.head_dim_v).bytes() / 4), 0.0f);
  }
}

bool KvStorage::window_paged(int layer) const {
  const int owner = layout_[layer].shares_with >= 0 ? layout_[layer].shares_with : layer;
  return layout_[owner].window > 0;
}

int32_t KvStorage::n_blocks(int layer) const { return window_paged(layer) ? n_window_blocks_ : n_blocks_; }

float* KvStorage::k_pool(int layer) {
  STRATA_CHECK(k_format(layer).kind == KvRowKind::kF32, "f32 view of a layer stored in another codec");
  return reinterpret_cast<float*>(k_rows(layer));
}

float* KvStorage::v_pool(int layer) {
  STRATA_CHECK(v_format(layer).kind == KvRowKind::kF32, "f32 view of a layer stored in another codec");
  return reinterpret_cast<float*>(v_rows(layer));
}

uint8_t* KvStorage::k_rows(int layer) {
  STRATA_CHECK(!k_[owner(layer)].empty(), "layer has no KV");
  return reinterpret_cast<uint8_t*>(k_[owner(layer)].data());
}

uint8_t* KvStorage::v_rows(int layer) {
  STRATA_CHECK(!v_[owner(layer)].empty(), "layer has no KV");
  return reinterpret_cast<uint8_t*>(v_[owner(layer)].data());
}

KvRowFormat KvStorage::k_format(int layer) const {
  const KvLayerSpec& s = layout_[owner(layer)];
  return kv_key_format(s.codec, s.head_dim_k);
}

KvRowFormat KvStorage::v_format(int layer) const {
  const KvLayerSpec& s = layout_[owner(layer)];
  return kv_value_format(s.codec, s.head_dim_v);
}

int64_t KvStorage::bytes_per_token() const { return bytes_per_token(layout_); }

int64_t KvStorage::bytes_per_token(const std::vector<KvLayerSpec>& layout) {
  int64_t bytes = 0;
  for (const auto& s : layout) {
    if (!s.has_kv || s.shares_with >= 0) continue;
    bytes += layer_bytes_per_token(s);
  }
  return bytes;
}

int64_t KvStorage::layer_bytes_per_token(const KvLayerSpec& s) {
  return int64_t(s.n_kv_heads) * (kv_key_format(s.codec, s.head_dim_k).bytes() + kv_value_format(s.codec, s.head_dim_v).bytes());
}

void convert_kv_block(KvStorage& src, int layer, int32_t src_block, KvStorage& dst, int32_t dst_block) {
  const KvLayerSpec& a = src.spec(layer);
  const KvLayerSpec& b = dst.spec(layer);
  STRATA_CHECK(a.has_kv && a.shares_with < 0 && b.has_kv && b.shares_with < 0, "convert_kv_block: layer owns no KV");
  STRATA_CHECK(a.n_kv_heads == b.n_kv_heads && a.head_dim_k == b.head_dim_k && a.head_dim_v == b.head_dim_v &&
                   src.block_size() == dst.block_size(),
               "convert_kv_block: storages differ in more than the codec");
  STRATA_CHECK(src_block >= 0 && src_block < src.n_blocks(layer) && dst_block >= 0 && dst_block < dst.n_blocks(layer),
               "convert_kv_block: block id outside the pool");
  STRATA_CHECK(&src != &dst || src_block != dst_block, "convert_kv_block: a block onto itself");
  const int64_t rows = int64_t(src.block_size()) * a.n_kv_heads;
  const KvRowFormat kf = src.k_format(layer), kt = dst.k_format(layer);
  const KvRowFormat vf = src.v_format(layer), vt = dst.v_format(layer);
  cpu::kv_convert_rows(kf, layer, src.k_rows(layer) + src_block * rows * kf.bytes(), kt, layer,
                       dst.k_rows(layer) + dst_block * rows * kt.bytes(), rows, a.n_kv_heads);
  cpu::kv_convert_rows(vf, layer, src.v_rows(layer) + src_block * rows * vf.bytes(), vt, layer,
                       dst.v_rows(layer) + dst_block * rows * vt.bytes(), rows, a.n_kv_heads);
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
