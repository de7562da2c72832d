// DraftModelProposer: a second, smaller model with its own paged KV drafts greedily for every
// speculating sequence in batched forwards (k steps for a draft of k: the first catches each
// sequence up to its pending token, the rest decode one token each). It mirrors each target
// sequence as a sequence of its own; before drafting, the mirror keeps only the KV of the
// longest prefix it shares with the target's committed tokens, so rejected drafts roll back by
// forgetting, as in the target.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>

#include "core/status.h"
#include "engine/proposer.h"
#include "kv/kv_cache_manager.h"
#include "model/model.h"
#include "runtime/host/model_runner.h"
#include "runtime/sequence.h"

namespace strata {

class DraftModelProposer final : public Proposer {
 public:
  // Refuses (kInvalidArgument, naming --draft-model and `dir`) a draft whose vocabulary differs
  // from the target's, whose context is shorter than max_model_len, or that has recurrent state.
  static Status check(const Model* draft, const std::string& dir, const ModelConfig& target, int32_t max_model_len);
  static Result<std::unique_ptr<DraftModelProposer>> create(std::shared_ptr<Model> draft, const std::string& dir,
                                                            const ModelConfig& target, int32_t max_model_len,
                                                            int32_t n_blocks, int32_t block_size);
  DraftModelProposer(std::shared_ptr<Model> draft, const std::vector<KvLayerSpec>& layout, int32_t n_blocks,
                     int32_t block_size);

  const char* name() const override { return "draft"; }
  void propose(std::span<const DraftRow> rows, std::vector<std::vector<int32_t>>* drafts) override;
  void forget(uint64_t seq_id) override;

  int32_t n_kv_blocks() const { return kv_.n_blocks(); }
  int32_t n_free_blocks() const { return kv_.n_available(); }
  int64_t forwards() const { return n_forwards_; }

 private:
  // Gives `seq` blocks for n_tokens tokens, evicting mirrors not in this batch (their KV is
  // recomputed when they draft again); false when the pool cannot.
  bool reserve(Sequence& seq, int32_t n_tokens, std::span<const DraftRow> batch);
  void release(Sequence& seq);

  std::shared_ptr<Model> model_;
  KvCacheManager kv_;  // block metadata; no prefix cache
  ModelRunner runner_;
  std::unordered_map<uint64_t, Sequence> mirrors_;  // by the target's Sequence::id
  int64_t n_forwards_ = 0;
};

}  // namespace strata
