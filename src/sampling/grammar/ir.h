// The grammar IR: a context-free grammar over bytes. A front end (JSON Schema, regex, GBNF,
// choice) describes each rule as an expression tree (byte-set terminals, rule references,
// sequences, alternatives, bounded and unbounded repetition); build() lowers every rule to an
// epsilon-free NFA whose edges read a byte set or call a rule, checks it, trims states that
// cannot reach the rule's end and returns an immutable Grammar shared by every matcher.
//
// Repetition stays a loop inside its rule's NFA (no stack growth for `x*`); a call in tail
// position is marked so the matcher does not grow its stack on right recursion. Left recursion
// (a rule reaching itself before reading a byte) is refused at build time.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace strata::grammar {

// 256 bits, one per byte value.
struct ByteSet {
  std::array<uint64_t, 4> w{};
  bool has(uint8_t b) const { return (w[b >> 6] >> (b & 63)) & 1; }
  void add(uint8_t b) { w[b >> 6] |= uint64_t{1} << (b & 63); }
  void add_range(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) add(static_cast<uint8_t>(b));
  }
  bool empty() const { return (w[0] | w[1] | w[2] | w[3]) == 0; }
  int count() const;
  bool operator==(const ByteSet&) const = default;
};

// Limits on what one compilation may produce; past them build() (and the front ends) answer
// kResourceExhausted naming the limit, so a hostile schema cannot exhaust the host.
struct Limits {
  int max_rules = 20000;
  int max_nodes = 400000;     // NFA states over all rules
  int max_repeat = 2000;      // the largest finite bound of {m,n} expanded into copies
  int max_depth = 128;        // nesting of schemas / regex groups / grammar expressions
  double max_compile_ms = 5000;
};

using ExprId = int32_t;
using RuleId = int32_t;

// One NFA state. Edges are a contiguous slice of Grammar::edges.
struct Node {
  RuleId rule = 0;
  bool final = false;       // the rule may end here
  bool has_bytes = false;   // at least one byte edge (a matcher stack may rest here)
  uint32_t edge_begin = 0, edge_end = 0;
};

struct Edge {
  uint32_t target = 0;
  RuleId call = -1;         // -1: a byte edge reading bytes[set]; else calls rule `call`
  uint32_t set = 0;         // index into Grammar::sets for byte edges
  bool tail = false;        // call edge whose target is final with no edges: return directly
};

class Grammar {
 public:
  RuleId root() const { return root_; }
  uint32_t start(RuleId r) const { return rule_start_[r]; }
  const std::string& rule_name(RuleId r) const { return rule_names_[r]; }
  int n_rules() const { return static_cast<int>(rule_start_.size()); }
  int n_nodes() const { return static_cast<int>(nodes_.size()); }
  const Node& node(uint32_t n) const { return nodes_[n]; }
  const Edge* edges_begin(uint32_t n) const { return edges_.data() + nodes_[n].edge_begin; }
  const Edge* edges_end(uint32_t n) const { return edges_.data() + nodes_[n].edge_end; }
  const ByteSet& set(uint32_t i) const { return sets_[i]; }
  // Union of the bytes node n reads directly.
  const ByteSet& first_bytes(uint32_t n) const { return first_bytes_[n]; }
  // For a state whose byte edges read disjoint sets: the target per byte (-1: none); else null.
  const int32_t* byte_table(uint32_t n) const { return table_of_[n] < 0 ? nullptr : tables_.data() + table_of_[n]; }
  // The state has no call edges (a stack resting on it never pushes).
  bool plain(uint32_t n) const { return plain_[n]; }
  // Readable dump (rules, states, edges), for tests and error reports.
  std::string to_string() const;

 private:
  friend class GrammarBuilder;
  RuleId root_ = 0;
  std::vector<uint32_t> rule_start_;
  std::vector<std::string> rule_names_;
  std::vector<Node> nodes_;
  std::vector<Edge> edges_;
  std::vector<ByteSet> sets_;
  std::vector<ByteSet> first_bytes_;
  std::vector<int32_t> table_of_;  // per node: offset into tables_, or -1
  std::vector<int32_t> tables_;    // 256 targets per tabled node
  std::vector<char> plain_;
};

// Builds a Grammar from expression trees. Not thread-safe; one per compilation.
class GrammarBuilder {
 public:
  explicit GrammarBuilder(Limits limits = {});

  RuleId add_rule(std::string name);          // body defaults to nothing()
  void set_rule(RuleId rule, ExprId body);
  bool rule_defined(RuleId rule) const;
  int n_rules() const { return static_cast<int>(rules_.size()); }

  ExprId bytes(const ByteSet& set);           // one byte from the set
  ExprId byte_range(uint8_t lo, uint8_t hi);
  ExprId literal(std::string_view text);      // the exact bytes
  ExprId ref(RuleId rule);
  ExprId seq(std::vector<ExprId> items);
  ExprId alt(std::vector<ExprId> items);
  ExprId empty();                             // the empty string
  ExprId nothing();                           // matches no string
  ExprId repeat(ExprId item, int min, int max);  // max < 0: unbounded
  ExprId star(ExprId item) { return repeat(item, 0, -1); }
  ExprId plus(ExprId item) { return repeat(item, 1, -1); }
  ExprId opt(ExprId item) { return repeat(item, 0, 1); }
  // Any one Unicode scalar value in [lo, hi], as its UTF-8 bytes.
  ExprId code_point_range(uint32_t lo, uint32_t hi);
  // Any one code point in the sorted, disjoint ranges.
  ExprId code_point_set(const std::vector<std::pair<uint32_t, uint32_t>>& ranges);

  // Errors past the limits or the compile deadline (kResourceExhausted).
  Status check_budget() const;
  const Limits& limits() const { return limits_; }

  Result<std::shared_ptr<const Grammar>> build(RuleId root);

 private:
  enum class Kind : uint8_t { kBytes, kRef, kSeq, kAlt, kEmpty, kNothing, kRepeat };
  struct Expr {
    Kind kind;
    int32_t a = 0, b = 0;        // kBytes: set index; kRef: rule; kRepeat: min, max
    std::vector<ExprId> items;   // kSeq / kAlt children; kRepeat: {item}
  };
  struct Rule {
    std::string name;
    ExprId body = -1;
  };
  ExprId add(Expr e);
  uint32_t set_index(const ByteSet& s);
  struct Thompson;

  Limits limits_;
  std::chrono::steady_clock::time_point started_;
  std::vector<Expr> exprs_;
  std::vector<Rule> rules_;
  std::vector<ByteSet> sets_;
  ExprId empty_ = -1, nothing_ = -1;
};

}  // namespace strata::grammar
