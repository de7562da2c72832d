// The byte-level pushdown parser behind a Matcher: a graph-structured stack of (NFA state,
// parent) frames in an append-only arena, so a parse state is just the list of stack tops that
// can read a byte, and forking for nondeterminism or trying a token costs no copies. A try is
// undone by truncating the arena to a mark. Internal to the grammar library.
#pragma once

#include <cstdint>
#include <vector>

#include "sampling/grammar/ir.h"

namespace strata::grammar {

constexpr int32_t kBottom = -1;    // the root rule's parent: popping it ends the grammar
constexpr int32_t kSentinel = -2;  // parent of a cache walk's start frame: popping it needs context

struct Frame {
  uint32_t node;   // for a top: where it reads next; below: where its rule resumes
  int32_t parent;  // frame id, kBottom or kSentinel
};

struct ParseState {
  std::vector<int32_t> tops;  // frames whose node has byte edges
  bool accepting = false;     // the root rule can end here
  bool popped = false;        // (cache walks) a path returned into the sentinel
  bool alive() const { return !tops.empty() || accepting; }
};

class Parser {
 public:
  explicit Parser(const Grammar* g) : g_(g) {}

  // The state before any byte: the root's start, closed over calls and returns.
  void initial(ParseState& out);
  // The state of a cache walk at node n: n's byte edges only, returns into the sentinel.
  void local_start(uint32_t n, ParseState& out);
  // Reads one byte. Returns out.alive() (for a cache walk: tops non-empty or popped).
  void step(const ParseState& in, uint8_t byte, ParseState& out);
  // The bytes any top of `s` can read next.
  ByteSet next_bytes(const ParseState& s) const;
  const Frame& frame(int32_t id) const { return frames_[id]; }

  size_t mark() const { return frames_.size(); }
  void truncate(size_t mark) { frames_.resize(mark); }

 private:
  int32_t intern(uint32_t node, int32_t parent);
  void close(ParseState& out);

  const Grammar* g_;
  std::vector<Frame> frames_;
  std::vector<int32_t> work_;
  std::vector<uint32_t> seen_;  // per frame: closure epoch that visited it
  uint32_t epoch_ = 0;
  // Per-step interning table: (node, parent) -> frame created in this step.
  struct Slot {
    uint64_t key;
    int32_t id;
    uint32_t epoch;
  };
  std::vector<Slot> table_ = std::vector<Slot>(256, Slot{0, 0, 0});
  uint32_t table_epoch_ = 1;
  size_t table_used_ = 0;
};

}  // namespace strata::grammar
