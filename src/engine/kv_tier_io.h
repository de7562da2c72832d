// The engine's side of the lower KV tiers (kv/host/kv_tiers.h): demoting evicted blocks and
// making the tiers for a KV layout. A tiered block's bytes are runtime/host/kv_block_bytes.h's
// (the engine runs tiers only for models without sliding-window layers).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "kv/host/kv_tiers.h"
#include "model/kv_storage.h"
#include "runtime/host/kv_block_bytes.h"
#include "runtime/step_executor.h"

namespace strata {

// Demotes pool blocks `blocks` (evicted, published under `hashes`) to the tiers: those host
// memory holds already are not copied again, those it has room for are copied straight into
// their host slots (StepExecutor::read_blocks_to: a device DMAs into them), the rest go through
// `scratch` and KvTiers::demote(). On a failed copy (the executor throws) nothing is demoted.
// Direct copies a device runs behind the caller (StepExecutor::read_blocks_to_async) are
// committed once they land (KvTiers::defer_commit; settled here, by the promoter and by
// KvTiers::flush), so a promotion's installs overlap the demotions that made room for them.
void demote_to_tiers(KvTiers& tiers, StepExecutor& exec, std::span<const int32_t> blocks,
                     std::span<const uint64_t> hashes, std::vector<uint8_t>& scratch);

// Host tier of host_bytes (0: none) and a disk tier in disk_dir (empty: none) under
// disk_bytes, for blocks of `kv` whose identity (what makes equal hashes interchangeable) is
// `identity`. disk_read_delay_s > 0 slows every disk read (tests of a slow device). Errors name
// the directory.
Result<std::unique_ptr<KvTiers>> make_kv_tiers(const KvStorage& kv, int n_layers, const std::string& identity,
                                               int64_t host_bytes, const std::string& disk_dir, int64_t disk_bytes,
                                               double disk_read_delay_s = 0.0);
// The same for blocks whose tensors have the given bytes (StepExecutor::block_tensor_bytes()),
// with the shared tier `redis` under them (null: none).
Result<std::unique_ptr<KvTiers>> make_kv_tiers(const std::vector<int64_t>& tensor_bytes, const std::string& identity,
                                               int64_t host_bytes, const std::string& disk_dir, int64_t disk_bytes,
                                               double disk_read_delay_s = 0.0, std::unique_ptr<RedisTier> redis = nullptr);

}  // namespace strata
