// SchedulingPolicy: the order in which waiting sequences are admitted and in which running
// ones keep their blocks (the last in order is preempted first). Small objects, swapped by
// EngineOptions; the scheduler owns the mechanism.
#pragma once

#include <memory>
#include <string_view>

#include "core/status.h"
#include "runtime/sequence.h"

namespace strata {

class SchedulingPolicy {
 public:
  virtual ~SchedulingPolicy() = default;
  virtual const char* name() const = 0;
  // Strict weak order: true when `a` goes before `b`.
  virtual bool before(const Sequence& a, const Sequence& b) const = 0;
};

// First come, first served: by arrival.
class FcfsPolicy final : public SchedulingPolicy {
 public:
  const char* name() const override { return "fcfs"; }
  bool before(const Sequence& a, const Sequence& b) const override { return a.arrival < b.arrival; }
};

// Lower priority value first, then arrival.
class PriorityPolicy final : public SchedulingPolicy {
 public:
  const char* name() const override { return "priority"; }
  bool before(const Sequence& a, const Sequence& b) const override {
    return a.priority != b.priority ? a.priority < b.priority : a.arrival < b.arrival;
  }
};

// "fcfs" or "priority".
Result<std::unique_ptr<SchedulingPolicy>> make_scheduling_policy(std::string_view name);

}  // namespace strata
