// Logging goes to stderr through spdlog; stdout belongs to command output (token ids,
// rendered prompts) so scripts can read it.
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace strata::log {

// Sets the process-wide level from a name ("trace".."off"); unknown names keep "info".
void set_level(const std::string& level);

using spdlog::debug;
using spdlog::error;
using spdlog::info;
using spdlog::warn;

// A line that may repeat every step while a fault lasts (a disk gone): the first occurrence
// is logged, then at most one per interval, each with the count held back since (the
// metrics count every one).
class Throttle {
 public:
  explicit Throttle(std::chrono::steady_clock::duration interval = std::chrono::seconds(10)) : interval_(interval) {}
  // Whether this occurrence is logged; *held_back: the occurrences not logged since the last
  // one that was.
  bool take(int64_t* held_back) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (logged_ && now - last_ < interval_) {
      ++held_;
      return false;
    }
    *held_back = held_;
    held_ = 0;
    last_ = now;
    logged_ = true;
    return true;
  }
  // What a logged line appends for held_back occurrences: "" for none.
  static std::string held_note(int64_t held_back) {
    return held_back > 0 ? " (" + std::to_string(held_back) + " more since the last line)" : std::string();
  }

 private:
  std::mutex mu_;
  std::chrono::steady_clock::duration interval_;
  std::chrono::steady_clock::time_point last_{};
  bool logged_ = false;
  int64_t held_ = 0;
};

}  // namespace strata::log
