#include "engine/kv_tier_promoter.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <span>

#include "core/log.h"
#include "engine/scheduler.h"
#include "kv/prefix_index.h"

namespace strata {

TierPromoter::TierPromoter(KvCacheManager& kv, KvTiers& tiers, uint64_t prefix_salt, int64_t block_bytes,
                           InstallFn install, TierCompanions companions)
    : kv_(kv),
      tiers_(tiers),
      salt_(prefix_salt),
      block_bytes_(block_bytes),
      max_staged_(size_t(std::max<int64_t>(4, kStagingBytes / std::max<int64_t>(block_bytes, 1)))),
      install_(std::move(install)),
      companions_(std::move(companions)) {
  worker_ = std::thread([this] { worker_loop(); });
}

TierPromoter::~TierPromoter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  space_cv_.notify_all();
  worker_.join();
  for (auto& j : jobs_) {
    for (Batch& b : j->staged) release_leases(b);
  }
}

void TierPromoter::release_leases(Batch& b) {
  std::vector<const uint8_t*> leases;
  for (size_t i = 0; i < b.srcs.size(); ++i) {
    if (b.leased[i]) leases.push_back(b.srcs[i]);
  }
  if (!leases.empty()) tiers_.release(leases);
  b.leased.assign(b.leased.size(), 0);
}

bool TierPromoter::companions_at(std::span<const uint64_t> hashes, int32_t n) const {
  const TierCompanions& c = companions_;
  if (c.snapshots != nullptr) {
    const uint64_t h = hashes[size_t(n - 1)];
    if (!c.snapshots->contains(h) && (c.state_tiers == nullptr || !c.state_tiers->contains(h))) return false;
  }
  if (c.window_kv != nullptr) {
    for (int32_t j = window_first_block(n * kv_.block_size(), c.window, kv_.block_size()); j < n; ++j) {
      if (c.window_kv->count_cached(hashes.subspan(size_t(j), 1)) == 1) continue;
      if (c.window_tiers == nullptr || !c.window_tiers->contains(hashes[size_t(j)])) return false;
    }
  }
  return true;
}

void TierPromoter::release_hold(Hold& h, double now) {
  kv_.release(h.blocks, now);
  if (companions_.window_kv != nullptr) companions_.window_kv->release(h.window_blocks, now);
  h.blocks.clear();
  h.window_blocks.clear();
}

bool TierPromoter::start(Sequence* seq, double now) {
  if (!seq->reuse_prefix) return false;
  tiers_.settle(false);  // demotions whose copies landed become visible to the lookups below
  if (companions_.window_tiers != nullptr) companions_.window_tiers->settle(false);
  const int32_t bs = kv_.block_size();
  extend_block_hashes(seq->block_hashes, salt_ ^ seq->hash_salt, seq->tokens, bs);
  // As the scheduler's admission: the last token is always computed.
  const int32_t limit = int32_t(std::min(seq->block_hashes.size(), size_t((seq->n_tokens() - 1) / bs)));
  const std::span<const uint64_t> hashes(seq->block_hashes);
  Hold hold;
  hold.seq = seq;
  auto job = std::make_unique<Job>();
  job->seq = seq;
  job->t_start = std::chrono::steady_clock::now();
  // The shared tier is asked once, at the first block the local tiers lack, for the rest of
  // the chain (one round trip); blocks before remote_end are there.
  int32_t remote_end = -1;
  std::vector<uint8_t> pooled;  // per block of the chain: held from the pool (1) or the job's (0)
  for (int32_t i = 0; i < limit; ++i) {
    const auto h = hashes.subspan(size_t(i), 1);
    if (kv_.count_cached(h) == 1) {
      hold.blocks.push_back(kv_.acquire_cached(h).at(0));
      pooled.push_back(1);
      continue;
    }
    if (i >= remote_end && !tiers_.contains(h[0])) {
      // The block may be one whose demotion is still copying: wait for those and look again,
      // before this call allocated (its own evictions' demotions are not waited for).
      bool found = false;
      if (job->blocks.empty() && tiers_.unsettled() > 0) {
        tiers_.settle(true);
        found = tiers_.contains(h[0]);
      }
      if (!found) {
        if (remote_end >= 0) break;
        remote_end = i + tiers_.count_remote(hashes.subspan(size_t(i), size_t(limit - i)));
        if (i >= remote_end) break;
      }
    }
    const int32_t b = kv_.allocate(now);
    if (b < 0) break;
    job->hashes.push_back(h[0]);
    job->blocks.push_back(b);
    pooled.push_back(0);
  }
  if (has_companions()) {
    // The longest prefix whose companions are there too; the chain past it is not needed.
    int32_t n = int32_t(pooled.size());
    while (n > 0 && !companions_at(hashes, n)) --n;
    while (int32_t(pooled.size()) > n) {
      std::vector<int32_t>& from = pooled.back() ? hold.blocks : job->blocks;
      kv_.release(std::span<const int32_t>(&from.back(), 1), now);
      from.pop_back();
      if (!pooled.back()) job->hashes.pop_back();
      pooled.pop_back();
    }
    bool ok = n > 0;
    if (ok && companions_.window_kv != nullptr) {
      KvCacheManager& w = *companions_.window_kv;
      // Cached window blocks first (references), so the allocations below cannot evict them.
      std::vector<int32_t> from_tiers;
      for (int32_t j = window_first_block(n * bs, companions_.window, bs); j < n; ++j) {
        const auto h = hashes.subspan(size_t(j), 1);
        if (w.count_cached(h) == 1) {
          hold.window_blocks.push_back(w.acquire_cached(h).at(0));
        } else {
          from_tiers.push_back(j);
        }
      }
      for (int32_t j : from_tiers) {
        const int32_t b = w.allocate(now);
        if (b < 0) {
          ok = false;
          break;
        }
        job->window_hashes.push_back(hashes[size_t(j)]);
        job->window_blocks.push_back(b);
      }
    }
    if (ok && companions_.snapshots != nullptr && !companions_.snapshots->contains(hashes[size_t(n - 1)])) {
      job->state_hash = hashes[size_t(n - 1)];
      job->state_pos = n * bs;
    }
    if (!ok) {
      release_hold(hold, now);
      kv_.release(job->blocks, now);
      if (companions_.window_kv != nullptr) companions_.window_kv->release(job->window_blocks, now);
      return false;
    }
  }
  if (job->blocks.empty() && job->window_blocks.empty() && job->state_hash == 0) {
    release_hold(hold, now);
    return false;
  }
  job->start_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - job->t_start).count();
  holds_.emplace(seq->id, std::move(hold));
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(job.get());
  }
  jobs_.push_back(std::move(job));
  cv_.notify_one();
  return true;
}

void TierPromoter::worker_loop() {
  {
    const size_t batch_bytes = std::max<size_t>(1, max_staged_ / 2) * size_t(block_bytes_);
    std::vector<std::vector<uint8_t>> buffers(2, std::vector<uint8_t>(batch_bytes));  // zeroed: touched
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& b : buffers) spare_.push_back(std::move(b));
  }
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) break;
    Job* job = queue_.front();
    queue_.pop_front();
    if (!job->window_hashes.empty() || job->state_hash != 0) {
      // The companions first: a few blocks and a snapshot, read whole.
      lock.unlock();
      bool ok = true;
      if (!job->window_hashes.empty()) {
        const size_t wb = size_t(companions_.window_tiers->block_bytes());
        job->window_bytes.resize(job->window_hashes.size() * wb);
        for (size_t k = 0; ok && k < job->window_hashes.size(); ++k) {
          ok = companions_.window_tiers->fetch(job->window_hashes[k], job->window_bytes.data() + k * wb);
        }
      }
      if (ok && job->state_hash != 0) {
        job->state.resize(size_t(companions_.state_floats));
        ok = companions_.state_tiers != nullptr &&
             companions_.state_tiers->block_bytes() == int64_t(job->state.size() * sizeof(float)) &&
             companions_.state_tiers->fetch(job->state_hash, reinterpret_cast<uint8_t*>(job->state.data()));
      }
      lock.lock();
      job->companions_read = ok;
    } else {
      job->companions_read = true;
    }
    // Batches of up to half the staging allowance in disk blocks (host blocks are leased, not
    // copied: any number): large sequential disk reads, and the next batch is read while the
    // engine installs the previous one.
    const size_t batch_max = std::max<size_t>(1, max_staged_ / 2);
    const size_t bb = static_cast<size_t>(block_bytes_);
    for (size_t i = 0; i < job->hashes.size();) {
      const size_t want = std::min(batch_max, job->hashes.size() - i);
      space_cv_.wait(lock, [&] { return stop_ || job->seq == nullptr || job->staged_blocks + want <= max_staged_; });
      if (stop_ || job->seq == nullptr) break;  // ended meanwhile: the rest is not needed
      lock.unlock();
      // The device starts on this batch's small files at once and on the next batch while this
      // one is read and installed (host-memory blocks are left out).
      tiers_.prefetch(std::span<const uint64_t>(job->hashes).subspan(i, want));
      const size_t next = i + want;
      if (next < job->hashes.size()) {
        tiers_.prefetch(std::span<const uint64_t>(job->hashes).subspan(next, std::min(batch_max, job->hashes.size() - next)));
      }
      Batch b;
      {
        std::lock_guard<std::mutex> relock(mu_);
        if (!spare_.empty()) {
          b.bytes = std::move(spare_.back());
          spare_.pop_back();
        }
      }
      b.bytes.resize(batch_max * bb);
      const size_t got = size_t(std::max(
          tiers_.fetch_batch(std::span<const uint64_t>(job->hashes).subspan(i), int32_t(batch_max), b.bytes.data(), b.srcs, b.leased),
          0));
      size_t disk = 0;
      for (uint8_t l : b.leased) disk += l ? 0 : 1;
      lock.lock();
      if (disk == 0) {  // host blocks only: the buffer goes back at once
        if (spare_.size() < 2) spare_.push_back(std::move(b.bytes));
        b.bytes = {};
      }
      if (got > 0) {
        job->staged.push_back(std::move(b));
        job->staged_blocks += disk;
      }
      i += got;
      // The chain ends at a miss (fewer disk blocks than the batch allows, short of the end).
      if (got == 0 || (disk < batch_max && i < job->hashes.size())) break;
    }
    job->finished = true;
  }
}

std::vector<Sequence*> TierPromoter::poll(double now) {
  tiers_.settle(false);
  // References of sequences the scheduler has admitted (they hold their own now).
  for (auto it = holds_.begin(); it != holds_.end();) {
    Hold& h = it->second;
    if (h.handed_over && h.seq->state != SeqState::kWaiting) {
      release_hold(h, now);
      it = holds_.erase(it);
    } else {
      ++it;
    }
  }
  std::vector<Sequence*> ready;
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    Job& j = **it;
    std::deque<Batch> staged;
    bool finished = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      staged.swap(j.staged);
      j.staged_blocks = 0;
      finished = j.finished;  // read with the swap: nothing is staged after it is set
    }
    if (!staged.empty()) space_cv_.notify_all();
    for (Batch& b : staged) {
      const size_t n = b.srcs.size();
      if (j.seq != nullptr && !j.failed) {
        try {
          const auto t0 = std::chrono::steady_clock::now();
          if (j.n_installed == 0) j.first_install_s = std::chrono::duration<double>(t0 - j.t_start).count();
          install_(std::span<const int32_t>(j.blocks).subspan(size_t(j.n_installed), n), b.srcs);
          j.install_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          j.n_installed += int32_t(n);
          for (uint8_t l : b.leased) j.host_blocks += l;
        } catch (const std::exception& e) {  // the rest of the chain is recomputed
          log::warn("KV tier promotion: installing {} blocks from block {} failed: {}", n,
                    j.blocks[size_t(j.n_installed)], e.what());
          j.failed = true;
        }
      }
      release_leases(b);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (Batch& b : staged) {
        if (spare_.size() < 2 && !b.bytes.empty()) spare_.push_back(std::move(b.bytes));
      }
    }
    if (!finished) {
      ++it;
      continue;
    }
    if (j.seq == nullptr) {  // ended while reading: nothing was published
      kv_.release(j.blocks, now);
      if (companions_.window_kv != nullptr) companions_.window_kv->release(j.window_blocks, now);
      it = jobs_.erase(it);
      continue;
    }
    Hold& hold = holds_.at(j.seq->id);
    for (int32_t i = 0; i < int32_t(j.blocks.size()); ++i) {
      const int32_t b = j.blocks[size_t(i)];
      if (i < j.n_installed && kv_.publish(b, j.hashes[size_t(i)])) {
        hold.blocks.push_back(b);
        ++promoted_blocks_;
        continue;
      }
      // Not read, or another block was published under the hash meanwhile (that one serves).
      kv_.release(std::span<const int32_t>(&b, 1), now);
    }
    install_companions(j, hold, now);
    hold.handed_over = true;
    ready.push_back(hold.seq);
    if (int64_t(j.n_installed) * block_bytes_ >= (int64_t(256) << 20)) {
      tiers_.settle(false);
      log::info("KV tier promotion: {} blocks ({} from host memory) in {:.1f} ms: allocation and demotions {:.1f} ms, "
                "installs {:.1f} ms (first batch staged {:.1f} ms after the start); demotion batches still copying "
                "after the installs: {}",
                j.n_installed, j.host_blocks,
                1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - j.t_start).count(), 1e3 * j.start_s,
                1e3 * j.install_s, 1e3 * j.first_install_s, tiers_.unsettled());
    }
    it = jobs_.erase(it);
  }
  return ready;
}

void TierPromoter::install_companions(Job& j, Hold& hold, double now) {
  // Only with the whole full chain in: a shorter one has no use for them.
  bool ok = j.companions_read && !j.failed && j.n_installed == int32_t(j.blocks.size());
  if (!j.window_blocks.empty()) {
    KvCacheManager& w = *companions_.window_kv;
    if (ok) {
      try {
        companions_.install_window(j.window_blocks, j.window_bytes.data());
      } catch (const std::exception& e) {
        log::warn("KV tier promotion: installing {} window blocks failed: {}", j.window_blocks.size(), e.what());
        ok = false;
      }
    }
    for (size_t k = 0; k < j.window_blocks.size(); ++k) {
      const int32_t b = j.window_blocks[k];
      if (ok && w.publish(b, j.window_hashes[k])) {
        hold.window_blocks.push_back(b);
      } else {
        w.release(std::span<const int32_t>(&b, 1), now);
      }
    }
  }
  if (ok && j.state_hash != 0) {
    if (float* dst = companions_.snapshots->insert(j.state_hash, j.state_pos, j.state.size()); dst != nullptr) {
      std::memcpy(dst, j.state.data(), j.state.size() * sizeof(float));
    }
  }
}

void TierPromoter::forget(const Sequence* seq, double now) {
  auto it = holds_.find(seq->id);
  if (it == holds_.end() || it->second.seq != seq) return;
  release_hold(it->second, now);
  holds_.erase(it);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& j : jobs_) {
      if (j->seq == seq) j->seq = nullptr;
    }
  }
  space_cv_.notify_all();
}

int32_t TierPromoter::in_flight() const {
  int32_t n = 0;
  for (const auto& [id, h] : holds_) n += h.handed_over ? 0 : 1;
  return n;
}

}  // namespace strata
