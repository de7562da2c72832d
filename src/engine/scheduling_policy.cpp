#include "engine/scheduling_policy.h"

#include <string>

namespace strata {

const char* seq_state_name(SeqState s) {
  switch (s) {
    case SeqState::kWaiting: return "waiting";
    case SeqState::kPrefilling: return "prefilling";
    case SeqState::kDecoding: return "decoding";
    case SeqState::kPreempted: return "preempted";
    case SeqState::kFinished: return "finished";
  }
  return "?";
}

Result<std::unique_ptr<SchedulingPolicy>> make_scheduling_policy(std::string_view name) {
  if (name == "fcfs") return std::unique_ptr<SchedulingPolicy>(std::make_unique<FcfsPolicy>());
  if (name == "priority") return std::unique_ptr<SchedulingPolicy>(std::make_unique<PriorityPolicy>());
  return make_error(ErrorCode::kInvalidArgument,
                    "scheduling policy '" + std::string(name) + "' is unknown (use fcfs or priority)");
}

}  // namespace strata
