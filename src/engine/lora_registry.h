// LoraRegistry: the LoRA adapters an engine serves by name, loaded at start or at run time.
// HTTP threads resolve names (each request holds a use of its adapter's slot until it ends),
// load and unload; the engine thread installs new adapters into the model's slots and clears
// the slot of an unloaded adapter once no request uses it. Slots are never reused, so a slot
// id always means one adapter. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/lora.h"

namespace strata {

class LoraRegistry {
 public:
  struct Ref {
    int32_t slot = -1;
    uint64_t hash = 0;  // the adapter's content hash (LoraAdapter::content_hash)
  };
  struct Change {
    int32_t slot = -1;
    std::shared_ptr<const LoraAdapter> adapter;  // null: clear the slot
  };

  // An adapter the model already holds in `slot` (loaded before the engine started).
  void add_installed(const std::string& name, int32_t slot, uint64_t hash);
  // Slots below `n` are taken (the model's slots at start).
  void reserve_slots(int32_t n);

  // A use of name's slot for one request; kNotFound naming the loaded adapters.
  Result<Ref> acquire(const std::string& name);
  void release(int32_t slot);
  // Run-time load: a new slot for `a` under `name`, installed by the engine thread's next
  // take_changes(); kInvalidArgument when the name is taken.
  Status add(const std::string& name, std::shared_ptr<const LoraAdapter> a);
  // Run-time unload: the name is gone at once; the slot is cleared when its last request ends.
  Status remove(const std::string& name);
  std::vector<std::string> names() const;
  // Engine thread: installs and clears since the last call, in order.
  std::vector<Change> take_changes();

 private:
  struct Slot {
    int32_t uses = 0;
    bool removed = false;
  };
  mutable std::mutex mu_;
  std::map<std::string, Ref> by_name_;
  std::map<int32_t, Slot> slots_;
  std::vector<Change> changes_;
  int32_t next_slot_ = 0;
};

}  // namespace strata
