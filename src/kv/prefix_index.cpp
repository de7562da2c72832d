#include "kv/prefix_index.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

namespace strata {

uint64_t prefix_namespace_salt(std::string_view identity) {
  return XXH3_64bits(identity.data(), identity.size());
}

uint64_t chain_block_hash(uint64_t prev_hash, uint64_t salt, std::span<const int32_t> block_tokens) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, &prev_hash, sizeof(prev_hash));
  XXH3_64bits_update(&state, &salt, sizeof(salt));
  XXH3_64bits_update(&state, block_tokens.data(), block_tokens.size_bytes());
  return XXH3_64bits_digest(&state);
}

void extend_block_hashes(std::vector<uint64_t>& hashes, uint64_t salt, std::span<const int32_t> tokens,
                         int32_t block_size) {
  const size_t n_full = tokens.size() / size_t(block_size);
  for (size_t i = hashes.size(); i < n_full; ++i) {
    const uint64_t prev = i == 0 ? 0 : hashes[i - 1];
    hashes.push_back(chain_block_hash(prev, salt, tokens.subspan(i * size_t(block_size), size_t(block_size))));
  }
}

int32_t PrefixIndex::find(uint64_t hash) const {
  auto it = map_.find(hash);
  return it == map_.end() ? -1 : it->second;
}

bool PrefixIndex::insert(uint64_t hash, int32_t block) { return map_.emplace(hash, block).second; }

void PrefixIndex::erase(uint64_t hash, int32_t block) {
  auto it = map_.find(hash);
  if (it != map_.end() && it->second == block) map_.erase(it);
}

}  // namespace strata
