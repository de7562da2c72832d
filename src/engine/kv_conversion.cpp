#include "engine/kv_conversion.h"

#include <algorithm>
#include <string>

#include "core/check.h"
#include "engine/engine.h"
#include "kv/prefix_index.h"

namespace strata {

Result<std::vector<KvLayerSpec>> kv_quant_layout(const Model& model, const EngineOptions& o) {
  const int32_t n = o.kv_codecs.quant_start;
  const std::string flag = "--kv-quant-start " + std::to_string(n);
  if (o.kv_host_bytes > 0 || !o.kv_disk_dir.empty()) {
    return make_error(ErrorCode::kUnsupported, flag + " with the lower KV tiers (kv_host_bytes " +
                                                   std::to_string(o.kv_host_bytes) + ", kv_disk_dir '" + o.kv_disk_dir +
                                                   "') is not supported; turn one of them off");
  }
  KvCodecConfig codecs = o.kv_codecs;
  codecs.quant_start = 0;
  auto layout = resolve_kv_layout(model, codecs);
  if (!layout.ok()) return layout.error();
  // Only full-attention layers convert: a sliding window's few blocks stay exact, and layers
  // reading another's KV read its converted blocks.
  bool full = false, lossy = false;
  for (const auto& s : *layout) {
    if (!converts(s)) continue;
    full = true;
    lossy = lossy || s.codec.codec != KvCodec::kAuto;
  }
  if (!full) return make_error(ErrorCode::kUnsupported, flag + ": no layer holds full-attention KV to convert");
  if (!lossy) {
    return make_error(ErrorCode::kInvalidArgument,
                      flag + ": no layer has a codec to convert to (set --kv-cache-dtype or --kv-config)");
  }
  return layout;
}

KvConversion::KvConversion(int32_t quant_start, int32_t n_quant_blocks, uint64_t codec_salt,
                           KvCacheManager& exact_pool, KvStorage& exact, const std::vector<KvLayerSpec>& quant_layout)
    : quant_start_(quant_start),
      codec_salt_(codec_salt),
      exact_pool_(exact_pool),
      exact_(&exact),
      pool_(n_quant_blocks, exact.block_size()),
      // Sliding-window layers never read converted blocks: their pools stay empty here.
      storage_(std::make_unique<KvStorage>(quant_layout, n_quant_blocks, exact.block_size(), 0)) {
  STRATA_CHECK(quant_start_ > 0, "delayed quantization needs a start");
  for (int l = 0; l < int(quant_layout.size()); ++l) {
    if (converts(quant_layout[size_t(l)])) layers_.push_back(l);
  }
  exact_->set_quant(storage_.get());
}

KvConversion::KvConversion(int32_t quant_start, uint64_t codec_salt, KvCacheManager& exact_pool, StepExecutor& executor)
    : quant_start_(quant_start),
      codec_salt_(codec_salt),
      exact_pool_(exact_pool),
      executor_(&executor),
      pool_(executor.n_kv_quant_blocks(), exact_pool.block_size()) {
  STRATA_CHECK(quant_start_ > 0, "delayed quantization needs a start");
  STRATA_CHECK(executor.n_kv_quant_blocks() > 0, "the executor keeps no codec pool");
}

void KvConversion::flush() {
  if (pending_src_.empty()) return;
  if (executor_ != nullptr) {
    executor_->convert_kv_blocks(pending_src_, pending_dst_);
  } else {
    for (size_t i = 0; i < pending_src_.size(); ++i) {
      for (int l : layers_) convert_kv_block(*exact_, l, pending_src_[i], *storage_, pending_dst_[i]);
    }
  }
  pending_src_.clear();
  pending_dst_.clear();
}

uint64_t KvConversion::codec_hash(uint64_t exact_hash) const {
  return chain_block_hash(exact_hash, codec_salt_, std::span<const int32_t>());
}

int32_t KvConversion::convert(Sequence* seq, double now, bool prefix_caching) {
  if (seq->n_computed <= quant_start_) return 0;
  const int32_t n_full = std::min(seq->n_computed / exact_pool_.block_size(), int32_t(seq->blocks.size()));
  int32_t moved = 0;
  for (int32_t i = seq->n_quant_blocks; i < n_full; ++i) {
    const bool hashed = prefix_caching && size_t(i) < seq->block_hashes.size();
    const uint64_t h = hashed ? codec_hash(seq->block_hashes[size_t(i)]) : 0;
    int32_t dst = -1;
    if (hashed) {
      const auto got = pool_.acquire_cached(std::span<const uint64_t>(&h, 1));
      if (!got.empty()) {
        dst = got[0];  // another sequence converted this prefix already: share its block
        ++shared_;
      }
    }
    if (dst < 0) {
      dst = pool_.allocate(now);
      if (dst < 0) break;  // the codec pool is full of referenced blocks: try again next step
      pending_src_.push_back(seq->blocks[size_t(i)]);
      pending_dst_.push_back(dst);
      if (hashed) pool_.publish(dst, h);
      ++converted_;
    }
    exact_pool_.release(std::span<const int32_t>(&seq->blocks[size_t(i)], 1), now);
    seq->blocks[size_t(i)] = dst;
    seq->n_quant_blocks = i + 1;
    ++moved;
  }
  return moved;
}

int32_t KvConversion::acquire_prefix(Sequence* seq, int32_t exact_hits, int32_t limit,
                                     const std::function<bool(int32_t)>& covered) {
  STRATA_CHECK(seq->blocks.empty() && seq->n_quant_blocks == 0, "admission starts from no blocks");
  const std::span<const uint64_t> hashes = std::span<const uint64_t>(seq->block_hashes).first(size_t(limit));
  int32_t quant_hits = 0;
  if (seq->n_tokens() > quant_start_) {
    while (quant_hits < limit) {
      if (pool_.index().find(codec_hash(hashes[size_t(quant_hits)])) < 0) break;
      ++quant_hits;
    }
    if (covered) {
      while (quant_hits > 0 && !covered(quant_hits)) --quant_hits;
    }
  }
  if (quant_hits == 0 || quant_hits < exact_hits) {
    seq->blocks = exact_pool_.acquire_cached(hashes.first(size_t(exact_hits)));
    STRATA_CHECK(int32_t(seq->blocks.size()) == exact_hits, "counted blocks could not be acquired");
    return exact_hits;
  }
  std::vector<uint64_t> codec_hashes;
  for (int32_t i = 0; i < quant_hits; ++i) codec_hashes.push_back(codec_hash(hashes[size_t(i)]));
  seq->blocks = pool_.acquire_cached(codec_hashes);
  STRATA_CHECK(int32_t(seq->blocks.size()) == quant_hits, "counted codec blocks could not be acquired");
  seq->n_quant_blocks = quant_hits;
  // Exact blocks of the same chain may follow (computed with exact KV before them).
  const int32_t more = covered ? 0 : exact_pool_.count_cached(hashes.subspan(size_t(quant_hits)));
  const auto tail = exact_pool_.acquire_cached(hashes.subspan(size_t(quant_hits), size_t(more)));
  seq->blocks.insert(seq->blocks.end(), tail.begin(), tail.end());
  return quant_hits + int32_t(tail.size());
}

void KvConversion::release(Sequence* seq, double now, double pin_until) {
  const size_t n = size_t(std::min<int32_t>(seq->n_quant_blocks, int32_t(seq->blocks.size())));
  pool_.release(std::span<const int32_t>(seq->blocks).first(n), now, pin_until);
  seq->blocks.erase(seq->blocks.begin(), seq->blocks.begin() + std::ptrdiff_t(n));
  seq->n_quant_blocks = 0;
}

}  // namespace strata
