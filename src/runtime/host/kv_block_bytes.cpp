#include "runtime/host/kv_block_bytes.h"

#include <cstring>

namespace strata {

namespace {

bool tiered(const KvStorage& kv, int l, bool window) {
  const KvLayerSpec& s = kv.spec(l);
  return s.has_kv && s.shares_with < 0 && (s.window > 0) == window;
}

// Bytes of one block of layer l's K (v = false) or V rows.
int64_t part_bytes(const KvStorage& kv, int l, bool v) {
  const KvLayerSpec& s = kv.spec(l);
  const int64_t row = v ? kv.v_format(l).bytes() : kv.k_format(l).bytes();
  return int64_t(kv.block_size()) * s.n_kv_heads * row;
}

}  // namespace

std::vector<int64_t> tier_tensor_bytes(const KvStorage& kv, int n_layers, bool window) {
  std::vector<int64_t> out;
  for (int l = 0; l < n_layers; ++l) {
    if (!tiered(kv, l, window)) continue;
    out.push_back(part_bytes(kv, l, false));
    out.push_back(part_bytes(kv, l, true));
  }
  return out;
}

void gather_tier_block(KvStorage& kv, int n_layers, int32_t block, uint8_t* out, bool window) {
  for (int l = 0; l < n_layers; ++l) {
    if (!tiered(kv, l, window)) continue;
    const int64_t k = part_bytes(kv, l, false), v = part_bytes(kv, l, true);
    std::memcpy(out, kv.k_rows(l) + int64_t(block) * k, size_t(k));
    out += k;
    std::memcpy(out, kv.v_rows(l) + int64_t(block) * v, size_t(v));
    out += v;
  }
}

void scatter_tier_block(KvStorage& kv, int n_layers, int32_t block, const uint8_t* in, bool window) {
  for (int l = 0; l < n_layers; ++l) {
    if (!tiered(kv, l, window)) continue;
    const int64_t k = part_bytes(kv, l, false), v = part_bytes(kv, l, true);
    std::memcpy(kv.k_rows(l) + int64_t(block) * k, in, size_t(k));
    in += k;
    std::memcpy(kv.v_rows(l) + int64_t(block) * v, in, size_t(v));
    in += v;
  }
}

}  // namespace strata
