// PrefixIndex: full KV blocks by the chained hash of the tokens that produced them.
// hash_i = xxh3_64(hash_{i-1}, namespace salt, token ids of block i), with hash_{-1} = 0 and a
// salt that covers everything that changes the numbers in a block (model identity, adapter
// set, KV codec), so equal hashes mean interchangeable blocks. The index maps a hash to one
// block id; reference counts and eviction live in the pool and the KvCacheManager.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace strata {

// The salt for a namespace described by a string (e.g. "model=...;adapters=;codec=f32").
uint64_t prefix_namespace_salt(std::string_view identity);

uint64_t chain_block_hash(uint64_t prev_hash, uint64_t salt, std::span<const int32_t> block_tokens);

// Appends to `hashes` the chained hashes of the full blocks of `tokens` it does not cover yet.
void extend_block_hashes(std::vector<uint64_t>& hashes, uint64_t salt, std::span<const int32_t> tokens,
                         int32_t block_size);

class PrefixIndex {
 public:
  // Block published under `hash`, -1 when none.
  int32_t find(uint64_t hash) const;
  // False (and no change) when another block already holds `hash`.
  bool insert(uint64_t hash, int32_t block);
  // Removes `hash` if `block` holds it.
  void erase(uint64_t hash, int32_t block);
  size_t size() const { return map_.size(); }

 private:
  std::unordered_map<uint64_t, int32_t> map_;
};

}  // namespace strata
