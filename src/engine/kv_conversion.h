// KvConversion: delayed KV quantization (--kv-quant-start N). A sequence keeps exact KV until
// it passes N tokens; from then on, after every step, its full blocks are re-encoded into a
// second block pool held in the configured codec, one layer at a time (each block of each
// layer straight from its exact block into its codec block, no other scratch), and read from
// there (Sequence::n_quant_blocks, SeqSpan::n_quant_blocks). The exact blocks go back to their
// pool, cached if published. The block a sequence is writing always stays exact, so with
// N = one block (what --kv-quant-start auto gives) every full block is in the codec and the
// few newest tokens, which attention weighs most, are exact.
//
// Where the pools live: the host (the runner's KvStorage and a codec KvStorage made here) or
// an executor that keeps both (StepExecutor::n_kv_quant_blocks, convert_kv_blocks). convert()
// only books the moves; flush() encodes them, all sequences' at once, before the next step.
//
// Prefix cache: the exact pool publishes under the exact namespace (the scheduler's salt, the
// codec part "kv:auto") and only blocks computed while the sequence read nothing converted; the
// codec pool publishes converted blocks under the codec namespace: hash = chain_block_hash(the
// block's exact-namespace hash, codec salt, no tokens), so the two never meet. Published blocks
// are never written: conversion always writes a fresh codec block (or takes the one another
// sequence already converted under the same hash). A sequence whose tokens pass N may start
// from converted blocks; one that stays within N reads exact blocks only.
//
// Other attention kinds: only full-attention layers that own their KV convert. Sliding-window
// layers page apart and keep their few blocks exact; layers reading another layer's KV read its
// converted blocks; recurrent state never converts. A sequence's window blocks and state
// snapshots depend on the converted KV it read, so once it reads any they go under the codec
// namespace too (Scheduler::publish_hash), and a codec-chain hit of such a model is cut to the
// longest chain whose window blocks and snapshot exist (Scheduler::prefix_covered).
//
// Budget split: kv/kv_plan.h (plan_kv_pools) sizes the exact and the codec pool.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "kv/kv_cache_manager.h"
#include "model/kv_storage.h"
#include "model/model.h"
#include "runtime/sequence.h"
#include "runtime/step_executor.h"

namespace strata {

struct EngineOptions;

// Checks that --kv-quant-start (options.kv_codecs.quant_start > 0) can run with these options
// and this model and returns the model's layout in the codecs (the codec pool's rows; the pools
// are sized by kv/kv_plan.h): the codecs must store something other than exact f32
// (kInvalidArgument), some layer must hold full-attention KV (sliding-window layers keep their
// few blocks exact; recurrent state is never converted) and the lower KV tiers must be off
// (kUnsupported); errors name the flag and value.
Result<std::vector<KvLayerSpec>> kv_quant_layout(const Model& model, const EngineOptions& options);

// Whether delayed quantization converts this layer's blocks: full attention with KV of its own.
inline bool converts(const KvLayerSpec& s) { return s.has_kv && s.shares_with < 0 && s.window == 0; }

class KvConversion {
 public:
  // exact: the runner's storage (the exact pool's bytes); quant_layout: the model's layout with
  // each layer's codec (the codec pool's row formats). The codec storage is attached to `exact`
  // (KvStorage::set_quant) so attention finds it.
  KvConversion(int32_t quant_start, int32_t n_quant_blocks, uint64_t codec_salt, KvCacheManager& exact_pool,
               KvStorage& exact, const std::vector<KvLayerSpec>& quant_layout);
  // Both pools on `executor` (its n_kv_quant_blocks() codec blocks); no host storage.
  KvConversion(int32_t quant_start, uint64_t codec_salt, KvCacheManager& exact_pool, StepExecutor& executor);

  int32_t quant_start() const { return quant_start_; }
  KvCacheManager& pool() { return pool_; }
  const KvCacheManager& pool() const { return pool_; }
  KvStorage& storage() { return *storage_; }  // host pools only
  int64_t converted_blocks() const { return converted_; }
  int64_t shared_blocks() const { return shared_; }

  // The codec-namespace hash of a block whose exact-namespace hash is `exact_hash`.
  uint64_t codec_hash(uint64_t exact_hash) const;

  // After a step: once seq has passed quant_start tokens, moves its full blocks past
  // n_quant_blocks into the codec pool (while the pool has blocks to give; the rest wait for a
  // later step). Publishes the new blocks when prefix caching is on (seq->block_hashes cover
  // them). Returns the blocks moved. Their bytes are encoded by the next flush(), which must
  // come before the next step (the exact blocks are back in their pool already).
  int32_t convert(Sequence* seq, double now, bool prefix_caching);
  // Encodes every block moved since the last flush.
  void flush();

  // Admission: seq holds nothing yet and block_hashes covers its prompt's full blocks. When
  // its tokens pass quant_start and the codec pool holds a longer chain of its leading blocks
  // than the exact pool's `exact_hits`, takes that chain (references held) as seq->blocks[0,
  // n) with n_quant_blocks = n, then continues with exact-pool blocks after it; else takes the
  // exact chain. Returns the leading blocks seq now holds, at most `limit`. covered (set for
  // models with sliding windows or recurrent state): whether a codec chain of n blocks has the window
  // blocks and snapshot its end needs; the chain is cut to the longest that has, with no exact
  // blocks after it.
  int32_t acquire_prefix(Sequence* seq, int32_t exact_hits, int32_t limit,
                         const std::function<bool(int32_t)>& covered = {});

  // Whether the exact block completed now may be published under the exact namespace: only
  // while the sequence reads nothing converted (its KV is then exactly what exact KV gives).
  static bool exact_publishable(const Sequence* seq) { return seq->n_quant_blocks == 0; }

  // Releases seq's codec blocks (blocks[0, n_quant_blocks)) and drops them from seq->blocks;
  // the exact ones after them stay for the caller to release.
  void release(Sequence* seq, double now, double pin_until);

 private:
  int32_t quant_start_;
  uint64_t codec_salt_;
  KvCacheManager& exact_pool_;
  KvStorage* exact_ = nullptr;         // host pools: the runner's storage
  StepExecutor* executor_ = nullptr;   // else the executor's
  KvCacheManager pool_;
  std::unique_ptr<KvStorage> storage_;  // host pools: the codec blocks
  std::vector<int> layers_;  // layers converted: own their KV and read block_table
  std::vector<int32_t> pending_src_, pending_dst_;  // moves flush() encodes
  int64_t converted_ = 0;
  int64_t shared_ = 0;
};

}  // namespace strata
