// Everything HTTP threads and the engine thread share, and all the locking between them:
// the bounded inbound queue, the table of live requests (for cancel by id), each request's
// event stream, and the published statistics. The engine thread owns everything else.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "engine/request.h"
#include "sampling/sampler.h"

namespace strata {

// The event buffer between the engine (writer) and one reader.
class StreamChannel {
 public:
  void push(StreamEvent event);
  std::optional<StreamEvent> pop(std::chrono::milliseconds timeout);
  void request_cancel() { cancel_.store(true, std::memory_order_relaxed); }
  bool cancel_requested() const { return cancel_.load(std::memory_order_relaxed); }
  bool closed() const;  // the final event was pushed

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StreamEvent> events_;
  bool closed_ = false;
  std::atomic<bool> cancel_{false};
};

// What an HTTP thread holds for a submitted request. Dropping it cancels the request.
class RequestStream {
 public:
  RequestStream(std::string id, std::shared_ptr<StreamChannel> channel);
  ~RequestStream();
  RequestStream(const RequestStream&) = delete;
  RequestStream& operator=(const RequestStream&) = delete;

  const std::string& id() const { return id_; }
  // The next event, waiting up to `timeout`; nullopt on timeout or after the final event.
  std::optional<StreamEvent> next(std::chrono::milliseconds timeout);
  // Asks the engine to stop the request; a final event (cancelled) follows within a step.
  void cancel() { channel_->request_cancel(); }
  // True once the final event has been read.
  bool done() const { return done_; }

 private:
  std::string id_;
  std::shared_ptr<StreamChannel> channel_;
  bool done_ = false;
};

// A validated request on its way to the engine thread.
struct PendingRequest {
  GenerationRequest request;
  Sampler sampler;
  std::shared_ptr<StreamChannel> channel;
  std::chrono::steady_clock::time_point submitted;
  std::string checkpoint_key;  // engine/checkpoint.h; empty: not checkpointed
  int32_t adapter_slot = -1;   // the request's use of its LoRA adapter (LoraRegistry::acquire)
  uint64_t adapter_hash = 0;
};

class RequestQueue {
 public:
  explicit RequestQueue(int32_t max_queued) : max_queued_(max_queued) {}

  // HTTP side. kResourceExhausted when max_queued requests wait already; kInvalidArgument for a
  // duplicate live id; kUnsupported after close().
  Status push(PendingRequest request);
  bool cancel(const std::string& id);
  int32_t depth() const { return queued_.load(); }

  // Engine side. Takes every pushed request, waiting up to `wait` for one when there is none.
  std::vector<PendingRequest> take(std::chrono::milliseconds wait);
  // A request left the queue (admitted for the first time, or finished before that).
  void left_queue() { queued_.fetch_sub(1); }
  // A request finished: its id may be reused (unless a new request took it already).
  void forget(const std::string& id, const StreamChannel* channel);
  // Refuses further pushes; wakes the engine thread.
  void close();
  bool closed() const;

  void publish_stats(const EngineStats& stats);
  EngineStats stats() const;

 private:
  const int32_t max_queued_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<PendingRequest> inbound_;
  std::unordered_map<std::string, std::weak_ptr<StreamChannel>> live_;
  std::atomic<int32_t> queued_{0};
  bool closed_ = false;
  mutable std::mutex stats_mu_;
  EngineStats stats_;
};

}  // namespace strata
