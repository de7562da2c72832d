// Recurrent state of hybrid families (gated DeltaNet, ...) as the engine keeps it: the slots
// of model/kv_storage.h's StateStorage handed to running sequences, and host-memory snapshots
// of a slot taken at block boundaries, keyed by the prefix-cache chain hash of the tokens the
// state covers. A prefix hit on a hybrid model needs both the attention layers' blocks and the
// snapshot at the same position: the recurrent layers have no per-token state to page.
// Metadata and host copies only; the engine thread alone drives these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <unordered_map>
#include <vector>

namespace strata {

// Which StateStorage slots are held by running sequences.
class StateSlotPool {
 public:
  explicit StateSlotPool(int32_t n_slots);
  int32_t n_slots() const { return n_slots_; }
  int32_t n_free() const { return int32_t(free_.size()); }
  // A free slot, -1 when every slot is held.
  int32_t allocate();
  void release(int32_t slot);

 private:
  int32_t n_slots_;
  std::vector<int32_t> free_;  // stack, lowest id on top at first
  std::vector<bool> held_;
};

struct StateSnapshot {
  int32_t position = 0;     // tokens the state covers (a block boundary)
  std::vector<float> data;  // every state layer's conv floats then recurrent floats, in layer order
};

struct StateSnapshotStats {
  int64_t count = 0;
  int64_t bytes = 0;           // held now
  int64_t capacity_bytes = 0;
  int64_t stores = 0;          // snapshots written, since start
  int64_t restores = 0;        // prefix hits served from a snapshot, since start
  int64_t evictions = 0;       // dropped for room, since start
};

// Snapshots by chain hash under a byte budget, least recently used dropped first.
class StateSnapshotStore {
 public:
  explicit StateSnapshotStore(int64_t capacity_bytes);

  bool contains(uint64_t hash) const { return map_.count(hash) != 0; }
  // The snapshot under `hash`, marked most recently used; nullptr when none.
  const StateSnapshot* find(uint64_t hash);
  // Room for the snapshot after the tokens `hash` covers: a buffer of n_floats for the caller to
  // fill before the next call, after dropping least recently used snapshots to fit. nullptr
  // when there is nothing to write: the hash is held already (refreshed instead; equal hashes
  // mean equal state), or one snapshot is larger than the whole budget.
  float* insert(uint64_t hash, int32_t position, size_t n_floats);
  void note_restore() { ++stats_.restores; }
  // Called with each snapshot insert() drops for room, before it goes (the lower tiers keep
  // a copy: engine/engine.cpp).
  void set_evict_hook(std::function<void(uint64_t hash, const StateSnapshot&)> hook) { evict_hook_ = std::move(hook); }
  // Every snapshot held, most recently used first.
  template <typename F>
  void for_each(F&& f) const {
    for (const Entry& e : lru_) f(e.hash, e.snapshot);
  }
  StateSnapshotStats stats() const { return stats_; }

 private:
  struct Entry {
    uint64_t hash;
    StateSnapshot snapshot;
  };
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<uint64_t, std::list<Entry>::iterator> map_;
  StateSnapshotStats stats_;
  std::function<void(uint64_t, const StateSnapshot&)> evict_hook_;
};

}  // namespace strata
