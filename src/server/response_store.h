// ResponseStore: the Responses API's stored responses, for previous_response_id and
// GET /v1/responses/{id}. Bounded in memory: an entry lives for the TTL after it was stored and
// the oldest entries go first when the bytes pass the limit. Thread-safe (HTTP threads share it).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace strata::server {

struct StoredResponse {
  nlohmann::ordered_json conversation;  // chat messages, input and output, without instructions
  nlohmann::json response;              // the response object as the client received it
};

struct ResponseStoreStats {
  int64_t entries = 0;
  int64_t bytes = 0;
  int64_t evicted = 0;  // by the byte limit
  int64_t expired = 0;  // by the TTL
};

class ResponseStore {
 public:
  using Clock = std::chrono::steady_clock;

  ResponseStore(double ttl_s, size_t max_bytes) : ttl_s_(ttl_s), max_bytes_(max_bytes) {}

  // Stores (or replaces) id; an entry larger than the whole limit is not kept.
  void put(const std::string& id, StoredResponse r);
  // nullopt when id was never stored, expired or was evicted.
  std::optional<StoredResponse> get(const std::string& id);
  bool erase(const std::string& id);
  ResponseStoreStats stats();

  // For tests: the clock the TTL is measured on.
  void set_now_for_test(Clock::time_point now) { test_now_ = now; }

 private:
  struct Entry {
    std::string id;
    StoredResponse value;
    size_t bytes = 0;
    Clock::time_point stored;
  };
  Clock::time_point now() const { return test_now_ ? *test_now_ : Clock::now(); }
  void expire_locked(Clock::time_point now);
  void drop_locked(std::list<Entry>::iterator it);

  const double ttl_s_;      // seconds
  const size_t max_bytes_;  // bytes
  std::mutex mu_;
  std::list<Entry> entries_;  // oldest first
  std::unordered_map<std::string, std::list<Entry>::iterator> by_id_;
  size_t bytes_ = 0;
  int64_t evicted_ = 0, expired_ = 0;
  std::optional<Clock::time_point> test_now_;
};

}  // namespace strata::server
