#include "engine/request_queue.h"

#include <algorithm>

namespace strata {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "?";
}

LatencyHistogram LatencyHistogram::with_default_bounds() {
  LatencyHistogram h;
  h.bounds_ms = {1, 2.5, 5, 10, 25, 50, 75, 100, 250, 500, 750, 1000, 2500, 5000, 7500, 10000, 30000, 60000};
  h.counts.assign(h.bounds_ms.size() + 1, 0);
  return h;
}

LatencyHistogram LatencyHistogram::with_mask_bounds() {
  LatencyHistogram h;
  h.bounds_ms = {0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2, 5, 10, 50};
  h.counts.assign(h.bounds_ms.size() + 1, 0);
  return h;
}

void LatencyHistogram::add(double ms) {
  const size_t i = size_t(std::lower_bound(bounds_ms.begin(), bounds_ms.end(), ms) - bounds_ms.begin());
  ++counts[i];
  sum_ms += ms;
  ++count;
}

void StreamChannel::push(StreamEvent event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = event.final;
    events_.push_back(std::move(event));
  }
  cv_.notify_all();
}

std::optional<StreamEvent> StreamChannel::pop(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [this] { return !events_.empty(); })) return std::nullopt;
  StreamEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

bool StreamChannel::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

RequestStream::RequestStream(std::string id, std::shared_ptr<StreamChannel> channel)
    : id_(std::move(id)), channel_(std::move(channel)) {}

RequestStream::~RequestStream() { channel_->request_cancel(); }

std::optional<StreamEvent> RequestStream::next(std::chrono::milliseconds timeout) {
  if (done_) return std::nullopt;
  auto e = channel_->pop(timeout);
  if (e && e->final) done_ = true;
  return e;
}

Status RequestQueue::push(PendingRequest request) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return make_error(ErrorCode::kUnsupported, "the engine is shut down");
    if (queued_.load() >= max_queued_) {
      return make_error(ErrorCode::kResourceExhausted,
                        "the request queue is full (" + std::to_string(max_queued_) + " waiting, max_queued)");
    }
    auto it = live_.find(request.request.id);
    if (it != live_.end() && !it->second.expired()) {
      return make_error(ErrorCode::kInvalidArgument, "request id '" + request.request.id + "' is already in use");
    }
    live_[request.request.id] = request.channel;
    queued_.fetch_add(1);
    inbound_.push_back(std::move(request));
  }
  cv_.notify_all();
  return Status();
}

bool RequestQueue::cancel(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(id);
  if (it == live_.end()) return false;
  auto channel = it->second.lock();
  if (!channel) return false;
  channel->request_cancel();
  return true;
}

std::vector<PendingRequest> RequestQueue::take(std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mu_);
  if (inbound_.empty() && !closed_ && wait.count() > 0) {
    cv_.wait_for(lock, wait, [this] { return !inbound_.empty() || closed_; });
  }
  std::vector<PendingRequest> out;
  out.swap(inbound_);
  return out;
}

void RequestQueue::forget(const std::string& id, const StreamChannel* channel) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(id);
  if (it == live_.end()) return;
  auto live = it->second.lock();
  if (!live || live.get() == channel) live_.erase(it);
}

void RequestQueue::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

bool RequestQueue::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

void RequestQueue::publish_stats(const EngineStats& stats) {
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_ = stats;
}

EngineStats RequestQueue::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  EngineStats s = stats_;
  s.queue_depth = queued_.load();
  return s;
}

}  // namespace strata
