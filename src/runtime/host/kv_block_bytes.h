// The flat bytes of one full-attention KV block of a host KvStorage, as the lower KV tiers
// (kv/host/kv_tiers.h) keep them: the K rows then the V rows of every layer that owns
// full-attention KV, in layer order, each [block_size, n_kv_heads] rows in the layer's codec.
// Sliding-window layers page apart: `window` picks their pool's blocks instead (the same layout
// over the layers with a window).
#pragma once

#include <cstdint>
#include <vector>

#include "model/kv_storage.h"

namespace strata {

// Bytes of each tensor of a tiered block, in order.
std::vector<int64_t> tier_tensor_bytes(const KvStorage& kv, int n_layers, bool window = false);
void gather_tier_block(KvStorage& kv, int n_layers, int32_t block, uint8_t* out, bool window = false);
void scatter_tier_block(KvStorage& kv, int n_layers, int32_t block, const uint8_t* in, bool window = false);

}  // namespace strata
