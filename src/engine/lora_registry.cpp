#include "engine/lora_registry.h"

#include <algorithm>

namespace strata {

void LoraRegistry::add_installed(const std::string& name, int32_t slot, uint64_t hash) {
  std::lock_guard<std::mutex> lock(mu_);
  by_name_[name] = Ref{slot, hash};
  slots_[slot];
  next_slot_ = std::max(next_slot_, slot + 1);
}

void LoraRegistry::reserve_slots(int32_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  next_slot_ = std::max(next_slot_, n);
}

Result<LoraRegistry::Ref> LoraRegistry::acquire(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    std::string names;
    for (const auto& [k, v] : by_name_) names += (names.empty() ? "" : ", ") + k;
    return make_error(ErrorCode::kNotFound,
                      "adapter '" + name + "' is not loaded (loaded: " + (names.empty() ? std::string("none") : names) + ")");
  }
  ++slots_[it->second.slot].uses;
  return it->second;
}

void LoraRegistry::release(int32_t slot) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(slot);
  if (it == slots_.end()) return;
  if (--it->second.uses == 0 && it->second.removed) {
    changes_.push_back(Change{slot, nullptr});
    slots_.erase(it);
  }
}

Status LoraRegistry::add(const std::string& name, std::shared_ptr<const LoraAdapter> a) {
  std::lock_guard<std::mutex> lock(mu_);
  if (by_name_.count(name)) return make_error(ErrorCode::kInvalidArgument, "adapter '" + name + "' is already loaded");
  const int32_t slot = next_slot_++;
  by_name_[name] = Ref{slot, a->content_hash};
  slots_[slot];
  changes_.push_back(Change{slot, std::move(a)});
  return Status();
}

Status LoraRegistry::remove(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return make_error(ErrorCode::kNotFound, "adapter '" + name + "' is not loaded");
  const int32_t slot = it->second.slot;
  by_name_.erase(it);
  Slot& s = slots_[slot];
  s.removed = true;
  if (s.uses == 0) {
    changes_.push_back(Change{slot, nullptr});
    slots_.erase(slot);
  }
  return Status();
}

std::vector<std::string> LoraRegistry::names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> v;
  for (const auto& [k, r] : by_name_) v.push_back(k);
  return v;
}

std::vector<LoraRegistry::Change> LoraRegistry::take_changes() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(changes_, {});
}

}  // namespace strata
