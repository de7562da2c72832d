#include "server/response_store.h"

namespace strata::server {

void ResponseStore::drop_locked(std::list<Entry>::iterator it) {
  bytes_ -= it->bytes;
  by_id_.erase(it->id);
  entries_.erase(it);
}

void ResponseStore::expire_locked(Clock::time_point t) {
  const auto ttl = std::chrono::duration<double>(ttl_s_);
  while (!entries_.empty() && t - entries_.front().stored > ttl) {
    drop_locked(entries_.begin());
    ++expired_;
  }
}

void ResponseStore::put(const std::string& id, StoredResponse r) {
  // Model text may hold invalid UTF-8: it is measured (and later sent) with replacements.
  constexpr auto kReplace = nlohmann::json::error_handler_t::replace;
  const size_t bytes = id.size() + r.conversation.dump(-1, ' ', false, kReplace).size() +
                       r.response.dump(-1, ' ', false, kReplace).size();
  std::lock_guard<std::mutex> lock(mu_);
  const auto t = now();
  if (auto it = by_id_.find(id); it != by_id_.end()) drop_locked(it->second);
  expire_locked(t);
  if (bytes > max_bytes_) return;
  while (!entries_.empty() && bytes_ + bytes > max_bytes_) {
    drop_locked(entries_.begin());
    ++evicted_;
  }
  entries_.push_back(Entry{id, std::move(r), bytes, t});
  by_id_[id] = std::prev(entries_.end());
  bytes_ += bytes;
}

std::optional<StoredResponse> ResponseStore::get(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  expire_locked(now());
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return std::nullopt;
  return it->second->value;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  drop_locked(it->second);
  return true;
}

ResponseStoreStats ResponseStore::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  expire_locked(now());
  return {int64_t(entries_.size()), int64_t(bytes_), evicted_, expired_};
}

}  // namespace strata::server
