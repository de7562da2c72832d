#include "sampling/grammar/ir.h"

#include <algorithm>
#include <bit>
#include <functional>
#include <map>
#include <unordered_map>

namespace strata::grammar {

int ByteSet::count() const {
  return std::popcount(w[0]) + std::popcount(w[1]) + std::popcount(w[2]) + std::popcount(w[3]);
}

GrammarBuilder::GrammarBuilder(Limits limits)
    : limits_(limits), started_(std::chrono::steady_clock::now()) {
  empty_ = add(Expr{Kind::kEmpty, 0, 0, {}});
  nothing_ = add(Expr{Kind::kNothing, 0, 0, {}});
}

ExprId GrammarBuilder::add(Expr e) {
  exprs_.push_back(std::move(e));
  return static_cast<ExprId>(exprs_.size() - 1);
}

uint32_t GrammarBuilder::set_index(const ByteSet& s) {
  for (size_t i = sets_.size(); i-- > 0 && i + 64 >= sets_.size();)  // recent sets repeat
    if (sets_[i] == s) return static_cast<uint32_t>(i);
  sets_.push_back(s);
  return static_cast<uint32_t>(sets_.size() - 1);
}

RuleId GrammarBuilder::add_rule(std::string name) {
  rules_.push_back(Rule{std::move(name), -1});
  return static_cast<RuleId>(rules_.size() - 1);
}
void GrammarBuilder::set_rule(RuleId rule, ExprId body) { rules_[rule].body = body; }
bool GrammarBuilder::rule_defined(RuleId rule) const { return rules_[rule].body >= 0; }

ExprId GrammarBuilder::bytes(const ByteSet& set) {
  if (set.empty()) return nothing_;
  return add(Expr{Kind::kBytes, static_cast<int32_t>(set_index(set)), 0, {}});
}
ExprId GrammarBuilder::byte_range(uint8_t lo, uint8_t hi) {
  ByteSet s;
  s.add_range(lo, hi);
  return bytes(s);
}
ExprId GrammarBuilder::literal(std::string_view text) {
  if (text.empty()) return empty_;
  std::vector<ExprId> items;
  for (char c : text) items.push_back(byte_range(uint8_t(c), uint8_t(c)));
  return items.size() == 1 ? items[0] : seq(std::move(items));
}
ExprId GrammarBuilder::ref(RuleId rule) { return add(Expr{Kind::kRef, rule, 0, {}}); }
ExprId GrammarBuilder::seq(std::vector<ExprId> items) {
  std::erase(items, empty_);
  if (items.empty()) return empty_;
  if (std::find(items.begin(), items.end(), nothing_) != items.end()) return nothing_;
  if (items.size() == 1) return items[0];
  return add(Expr{Kind::kSeq, 0, 0, std::move(items)});
}
ExprId GrammarBuilder::alt(std::vector<ExprId> items) {
  std::erase(items, nothing_);
  if (items.empty()) return nothing_;
  if (items.size() == 1) return items[0];
  return add(Expr{Kind::kAlt, 0, 0, std::move(items)});
}
ExprId GrammarBuilder::empty() { return empty_; }
ExprId GrammarBuilder::nothing() { return nothing_; }
ExprId GrammarBuilder::repeat(ExprId item, int min, int max) {
  if (max == 0) return empty_;
  if (min == 1 && max == 1) return item;
  if (item == nothing_) return min == 0 ? empty_ : nothing_;
  return add(Expr{Kind::kRepeat, min, max, {item}});
}

// Splits [lo, hi] into runs whose UTF-8 encodings are products of byte ranges.
static void utf8_split(uint32_t lo, uint32_t hi,
                       std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  if (lo > hi) return;
  for (uint32_t b : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= b && b < hi) {
      utf8_split(lo, b, out);
      utf8_split(b + 1, hi, out);
      return;
    }
  }
  if (hi <= 0x7F) {
    out.push_back({{uint8_t(lo), uint8_t(hi)}});
    return;
  }
  const int n = hi <= 0x7FF ? 2 : hi <= 0xFFFF ? 3 : 4;
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_split(lo, lo | m, out);
        utf8_split((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_split(lo, (hi & ~m) - 1, out);
        utf8_split(hi & ~m, hi, out);
        return;
      }
    }
  }
  auto enc = [n](uint32_t c) {
    std::vector<uint8_t> b(n);
    for (int i = n - 1; i > 0; --i) {
      b[i] = uint8_t(0x80 | (c & 0x3F));
      c >>= 6;
    }
    b[0] = uint8_t((n == 2 ? 0xC0 : n == 3 ? 0xE0 : 0xF0) | c);
    return b;
  };
  const auto a = enc(lo), z = enc(hi);
  std::vector<std::pair<uint8_t, uint8_t>> run;
  for (int i = 0; i < n; ++i) run.push_back({a[i], z[i]});
  out.push_back(std::move(run));
}

ExprId GrammarBuilder::code_point_set(const std::vector<std::pair<uint32_t, uint32_t>>& ranges) {
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> runs;
  for (auto [lo, hi] : ranges) {
    hi = std::min<uint32_t>(hi, 0x10FFFF);
    if (lo <= 0xDFFF && hi >= 0xD800) {  // surrogates are not scalar values
      if (lo < 0xD800) utf8_split(lo, 0xD7FF, runs);
      if (hi > 0xDFFF) utf8_split(0xE000, hi, runs);
    } else {
      utf8_split(lo, hi, runs);
    }
  }
  // Merge single-byte runs into one set; group multi-byte runs by their leading range.
  ByteSet ascii;
  std::vector<ExprId> alts;
  for (const auto& run : runs) {
    if (run.size() == 1) {
      ascii.add_range(run[0].first, run[0].second);
      continue;
    }
    std::vector<ExprId> items;
    for (auto [a, z] : run) items.push_back(byte_range(a, z));
    alts.push_back(seq(std::move(items)));
  }
  if (!ascii.empty()) alts.insert(alts.begin(), bytes(ascii));
  return alt(std::move(alts));
}

ExprId GrammarBuilder::code_point_range(uint32_t lo, uint32_t hi) {
  return code_point_set({{lo, hi}});
}

Status GrammarBuilder::check_budget() const {
  if (static_cast<int>(rules_.size()) > limits_.max_rules)
    return make_error(ErrorCode::kResourceExhausted,
                      "grammar: more than " + std::to_string(limits_.max_rules) + " rules");
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started_).count();
  if (ms > limits_.max_compile_ms)
    return make_error(ErrorCode::kResourceExhausted,
                      "grammar: compile time past the limit of " +
                          std::to_string(static_cast<int>(limits_.max_compile_ms)) + " ms");
  return {};
}

// Thompson construction with epsilon edges; states of every rule in one pool.
struct GrammarBuilder::Thompson {
  struct TEdge {
    uint32_t target;
    int32_t call;   // -2: epsilon, -1: bytes, else rule
    uint32_t set;
  };
  std::vector<std::vector<TEdge>> out;
  std::vector<RuleId> owner;
  RuleId rule = 0;
  size_t max_states = 0;
  bool overflow = false;

  uint32_t state() {
    if (out.size() >= max_states) overflow = true;
    out.emplace_back();
    owner.push_back(rule);
    return static_cast<uint32_t>(out.size() - 1);
  }
  void eps(uint32_t a, uint32_t b) { out[a].push_back({b, -2, 0}); }
};

Result<std::shared_ptr<const Grammar>> GrammarBuilder::build(RuleId root) {
  STRATA_RETURN_IF_ERROR(check_budget());
  for (size_t r = 0; r < rules_.size(); ++r)
    if (rules_[r].body < 0)
      return make_error(ErrorCode::kInvalidArgument, "grammar: rule '" + rules_[r].name + "' is not defined");

  Thompson t;
  t.max_states = static_cast<size_t>(limits_.max_nodes) * 4;
  std::vector<uint32_t> t_start(rules_.size()), t_end(rules_.size());
  std::function<std::pair<uint32_t, uint32_t>(ExprId)> frag = [&](ExprId id) -> std::pair<uint32_t, uint32_t> {
    if (t.overflow) return {0, 0};
    const Expr& e = exprs_[id];
    switch (e.kind) {
      case Kind::kBytes: {
        uint32_t s = t.state(), f = t.state();
        t.out[s].push_back({f, -1, static_cast<uint32_t>(e.a)});
        return {s, f};
      }
      case Kind::kRef: {
        uint32_t s = t.state(), f = t.state();
        t.out[s].push_back({f, e.a, 0});
        return {s, f};
      }
      case Kind::kEmpty: {
        uint32_t s = t.state();
        return {s, s};
      }
      case Kind::kNothing: return {t.state(), t.state()};
      case Kind::kSeq: {
        auto first = frag(e.items[0]);
        uint32_t end = first.second;
        for (size_t i = 1; i < e.items.size(); ++i) {
          auto f = frag(e.items[i]);
          if (t.overflow) return {0, 0};
          t.eps(end, f.first);
          end = f.second;
        }
        return {first.first, end};
      }
      case Kind::kAlt: {
        uint32_t s = t.state(), f = t.state();
        for (ExprId item : e.items) {
          auto g = frag(item);
          if (t.overflow) return {0, 0};
          t.eps(s, g.first);
          t.eps(g.second, f);
        }
        return {s, f};
      }
      case Kind::kRepeat: {
        const int min = e.a, max = e.b;
        uint32_t s = t.state(), cur = s;
        for (int i = 0; i < min && !t.overflow; ++i) {
          auto g = frag(e.items[0]);
          t.eps(cur, g.first);
          cur = g.second;
        }
        if (max < 0) {
          uint32_t hub = t.state();
          t.eps(cur, hub);
          auto g = frag(e.items[0]);
          if (t.overflow) return {0, 0};
          t.eps(hub, g.first);
          t.eps(g.second, hub);
          return {s, hub};
        }
        uint32_t f = t.state();
        t.eps(cur, f);
        for (int i = min; i < max && !t.overflow; ++i) {
          auto g = frag(e.items[0]);
          t.eps(cur, g.first);
          t.eps(g.second, f);
          cur = g.second;
        }
        return {s, f};
      }
    }
    return {0, 0};
  };
  // Repetition bounds are checked here, once, rather than at every call site.
  for (const Expr& e : exprs_)
    if (e.kind == Kind::kRepeat && std::max(e.a, e.b) > limits_.max_repeat)
      return make_error(ErrorCode::kResourceExhausted,
                        "grammar: repetition bound " + std::to_string(std::max(e.a, e.b)) +
                            " past the limit of " + std::to_string(limits_.max_repeat));
  for (size_t r = 0; r < rules_.size(); ++r) {
    t.rule = static_cast<RuleId>(r);
    auto [s, f] = frag(rules_[r].body);
    t_start[r] = s;
    t_end[r] = f;
    if (t.overflow) break;
  }
  if (t.overflow)
    return make_error(ErrorCode::kResourceExhausted,
                      "grammar: more than " + std::to_string(limits_.max_nodes) + " states");
  STRATA_RETURN_IF_ERROR(check_budget());

  // Epsilon removal: one node per rule start and per target of a non-epsilon edge.
  const size_t nt = t.out.size();
  std::vector<int32_t> keep(nt, -1);
  std::vector<uint32_t> order;
  auto mark = [&](uint32_t s) {
    if (keep[s] < 0) {
      keep[s] = static_cast<int32_t>(order.size());
      order.push_back(s);
    }
  };
  for (size_t r = 0; r < rules_.size(); ++r) mark(t_start[r]);
  for (size_t s = 0; s < nt; ++s)
    for (const auto& e : t.out[s])
      if (e.call != -2) mark(e.target);
  if (order.size() > static_cast<size_t>(limits_.max_nodes))
    return make_error(ErrorCode::kResourceExhausted,
                      "grammar: more than " + std::to_string(limits_.max_nodes) + " states");

  struct RawNode {
    RuleId rule;
    bool final = false;
    std::vector<Edge> edges;
  };
  std::vector<RawNode> raw(order.size());
  std::vector<uint32_t> stamp(nt, UINT32_MAX), stack;
  for (size_t i = 0; i < order.size(); ++i) {
    const uint32_t q = order[i];
    RawNode& n = raw[i];
    n.rule = t.owner[q];
    stack.assign(1, q);
    stamp[q] = static_cast<uint32_t>(i);
    std::map<uint32_t, ByteSet> byte_edges;  // target -> union of sets
    while (!stack.empty()) {
      uint32_t s = stack.back();
      stack.pop_back();
      if (s == t_end[n.rule]) n.final = true;
      for (const auto& e : t.out[s]) {
        if (e.call == -2) {
          if (stamp[e.target] != i) {
            stamp[e.target] = static_cast<uint32_t>(i);
            stack.push_back(e.target);
          }
        } else if (e.call == -1) {
          ByteSet& u = byte_edges[static_cast<uint32_t>(keep[e.target])];
          for (int k = 0; k < 4; ++k) u.w[k] |= sets_[e.set].w[k];
        } else {
          Edge ce{static_cast<uint32_t>(keep[e.target]), e.call, 0, false};
          bool dup = false;
          for (const Edge& x : n.edges) dup |= (x.call == ce.call && x.target == ce.target);
          if (!dup) n.edges.push_back(ce);
        }
      }
    }
    for (auto& [target, set] : byte_edges) n.edges.push_back(Edge{target, -1, set_index(set), false});
    if ((i & 1023) == 0) STRATA_RETURN_IF_ERROR(check_budget());
  }

  // Productive rules: a final node is reachable using bytes and calls to productive rules.
  const size_t nr = rules_.size();
  std::vector<uint32_t> start(nr);
  for (size_t r = 0; r < nr; ++r) start[r] = static_cast<uint32_t>(keep[t_start[r]]);
  std::vector<char> productive(nr, 0), nullable(nr, 0);
  std::vector<uint32_t> seen(raw.size(), 0);
  uint32_t epoch = 0;
  auto reach_final = [&](size_t r, bool bytes_ok, const std::vector<char>& ok_rule) {
    std::vector<uint32_t> st{start[r]};
    ++epoch;
    seen[start[r]] = epoch;
    while (!st.empty()) {
      uint32_t s = st.back();
      st.pop_back();
      if (raw[s].final) return true;
      for (const Edge& e : raw[s].edges) {
        if (e.call < 0 ? !bytes_ok : !ok_rule[e.call]) continue;
        if (seen[e.target] != epoch) {
          seen[e.target] = epoch;
          st.push_back(e.target);
        }
      }
    }
    return false;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < nr; ++r)
      if (!productive[r] && reach_final(r, true, productive)) productive[r] = changed = true;
    STRATA_RETURN_IF_ERROR(check_budget());
  }
  if (!productive[root])
    return make_error(ErrorCode::kInvalidArgument, "grammar: rule '" + rules_[root].name + "' matches no string");
  for (auto& n : raw)
    std::erase_if(n.edges, [&](const Edge& e) { return e.call >= 0 && !productive[e.call]; });
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < nr; ++r)
      if (productive[r] && !nullable[r] && reach_final(r, false, nullable)) nullable[r] = changed = true;
  }

  // Left recursion: rule A calls B before reading a byte (through nullable calls only).
  std::vector<std::vector<RuleId>> left_calls(nr);
  for (size_t r = 0; r < nr; ++r) {
    if (!productive[r]) continue;
    std::vector<uint32_t> st{start[r]};
    std::vector<uint32_t> seen{start[r]};
    while (!st.empty()) {
      uint32_t s = st.back();
      st.pop_back();
      for (const Edge& e : raw[s].edges) {
        if (e.call < 0) continue;
        left_calls[r].push_back(e.call);
        if (nullable[e.call] && std::find(seen.begin(), seen.end(), e.target) == seen.end()) {
          seen.push_back(e.target);
          st.push_back(e.target);
        }
      }
    }
  }
  {
    std::vector<int> color(nr, 0);  // 0 new, 1 on stack, 2 done
    std::string cycle_rule;
    std::function<bool(size_t)> dfs = [&](size_t r) {
      color[r] = 1;
      for (RuleId c : left_calls[r]) {
        if (color[c] == 1) {
          cycle_rule = rules_[c].name;
          return true;
        }
        if (color[c] == 0 && dfs(c)) return true;
      }
      color[r] = 2;
      return false;
    };
    for (size_t r = 0; r < nr; ++r)
      if (color[r] == 0 && productive[r] && dfs(r))
        return make_error(ErrorCode::kInvalidArgument,
                          "grammar: rule '" + cycle_rule + "' is left-recursive (it can call itself before reading a byte)");
  }

  // Trim: keep nodes reachable from their rule's start that can reach a final node.
  const size_t nn = raw.size();
  std::vector<char> fwd(nn, 0), bwd(nn, 0);
  std::vector<std::vector<uint32_t>> rev(nn);
  for (size_t s = 0; s < nn; ++s)
    for (const Edge& e : raw[s].edges) rev[e.target].push_back(static_cast<uint32_t>(s));
  std::vector<uint32_t> st;
  for (size_t r = 0; r < nr; ++r)
    if (productive[r]) {
      fwd[start[r]] = 1;
      st.push_back(start[r]);
    }
  while (!st.empty()) {
    uint32_t s = st.back();
    st.pop_back();
    for (const Edge& e : raw[s].edges)
      if (!fwd[e.target]) {
        fwd[e.target] = 1;
        st.push_back(e.target);
      }
  }
  for (size_t s = 0; s < nn; ++s)
    if (raw[s].final) {
      bwd[s] = 1;
      st.push_back(static_cast<uint32_t>(s));
    }
  while (!st.empty()) {
    uint32_t s = st.back();
    st.pop_back();
    for (uint32_t p : rev[s])
      if (!bwd[p]) {
        bwd[p] = 1;
        st.push_back(p);
      }
  }
  std::vector<int32_t> renum(nn, -1);
  {
    int32_t k = 0;
    for (size_t s = 0; s < nn; ++s) renum[s] = (fwd[s] && bwd[s]) ? k++ : -1;
  }
  // Compact nodes with their byte sets inlined, then merge states that behave the same (same
  // rule, finality and edges): epsilon removal leaves many copies of a loop state (one per
  // entry into it), and each copy would cost its own token-mask entry.
  struct MEdge {
    uint32_t target;
    int32_t call;
    ByteSet set;
  };
  struct MNode {
    RuleId rule;
    bool final;
    std::vector<MEdge> edges;
  };
  std::vector<MNode> cn;
  for (size_t s = 0; s < nn; ++s) {
    if (renum[s] < 0) continue;
    MNode m{raw[s].rule, raw[s].final, {}};
    for (const Edge& e : raw[s].edges) {
      if (renum[e.target] < 0) continue;
      if (e.call >= 0 && renum[start[e.call]] < 0) continue;
      m.edges.push_back(MEdge{static_cast<uint32_t>(renum[e.target]), e.call, e.call < 0 ? sets_[e.set] : ByteSet{}});
    }
    cn.push_back(std::move(m));
  }
  std::vector<uint32_t> starts(nr, UINT32_MAX);
  for (size_t r = 0; r < nr; ++r)
    if (renum[start[r]] >= 0) starts[r] = static_cast<uint32_t>(renum[start[r]]);
  auto canonical = [](std::vector<MEdge>& edges) {
    std::sort(edges.begin(), edges.end(), [](const MEdge& x, const MEdge& y) {
      return x.call != y.call ? x.call < y.call : x.target < y.target;
    });
    std::vector<MEdge> out;
    for (const MEdge& e : edges) {
      if (!out.empty() && out.back().call == e.call && out.back().target == e.target) {
        for (int k = 0; k < 4; ++k) out.back().set.w[k] |= e.set.w[k];  // same target: union
      } else {
        out.push_back(e);
      }
    }
    edges = std::move(out);
  };
  for (auto& m : cn) canonical(m.edges);
  for (int round = 0; round < 64; ++round) {
    std::unordered_map<std::string, uint32_t> sig;
    std::vector<uint32_t> rep(cn.size());
    for (size_t i = 0; i < cn.size(); ++i) {
      std::string key(reinterpret_cast<const char*>(&cn[i].rule), sizeof(RuleId));
      key += cn[i].final ? 'F' : 'N';
      for (const MEdge& e : cn[i].edges) {
        key.append(reinterpret_cast<const char*>(&e.target), sizeof e.target);
        key.append(reinterpret_cast<const char*>(&e.call), sizeof e.call);
        if (e.call < 0) key.append(reinterpret_cast<const char*>(e.set.w.data()), sizeof e.set.w);
      }
      rep[i] = sig.emplace(std::move(key), static_cast<uint32_t>(sig.size())).first->second;
    }
    if (sig.size() == cn.size()) break;
    std::vector<MNode> next(sig.size());
    std::vector<char> done(sig.size(), 0);
    for (size_t i = 0; i < cn.size(); ++i) {
      if (done[rep[i]]) continue;
      done[rep[i]] = 1;
      MNode m = std::move(cn[i]);
      for (MEdge& e : m.edges) e.target = rep[e.target];
      canonical(m.edges);
      next[rep[i]] = std::move(m);
    }
    for (auto& st : starts)
      if (st != UINT32_MAX) st = rep[st];
    cn = std::move(next);
    STRATA_RETURN_IF_ERROR(check_budget());
  }

  auto g = std::make_shared<Grammar>();
  g->root_ = root;
  g->rule_names_.reserve(nr);
  for (const auto& r : rules_) g->rule_names_.push_back(r.name);
  g->rule_start_ = starts;
  std::unordered_map<std::string, uint32_t> set_ids;
  auto set_id = [&](const ByteSet& b) {
    std::string k(reinterpret_cast<const char*>(b.w.data()), sizeof b.w);
    auto [it, inserted] = set_ids.emplace(k, static_cast<uint32_t>(g->sets_.size()));
    if (inserted) g->sets_.push_back(b);
    return it->second;
  };
  for (const MNode& m : cn) {
    Node n;
    n.rule = m.rule;
    n.final = m.final;
    n.edge_begin = static_cast<uint32_t>(g->edges_.size());
    ByteSet first;
    for (const MEdge& e : m.edges) {
      Edge x{e.target, e.call, 0, false};
      if (e.call < 0) {
        x.set = set_id(e.set);
        n.has_bytes = true;
        for (int k = 0; k < 4; ++k) first.w[k] |= e.set.w[k];
      } else {
        x.tail = cn[e.target].final && cn[e.target].edges.empty();
      }
      g->edges_.push_back(x);
    }
    n.edge_end = static_cast<uint32_t>(g->edges_.size());
    g->nodes_.push_back(n);
    g->first_bytes_.push_back(first);
  }
  // Byte tables for deterministic states: the cache walks step them without a stack.
  g->table_of_.assign(cn.size(), -1);
  g->plain_.assign(cn.size(), 1);
  for (size_t i = 0; i < cn.size(); ++i) {
    int total = 0;
    for (const MEdge& e : cn[i].edges) {
      if (e.call >= 0) g->plain_[i] = 0;
      else total += e.set.count();
    }
    ByteSet u = g->first_bytes_[i];
    if (total == 0 || u.count() != total) continue;  // no byte edges, or overlapping sets
    g->table_of_[i] = static_cast<int32_t>(g->tables_.size());
    g->tables_.resize(g->tables_.size() + 256, -1);
    int32_t* t = g->tables_.data() + g->table_of_[i];
    for (const MEdge& e : cn[i].edges)
      if (e.call < 0)
        for (int b = 0; b < 256; ++b)
          if (e.set.has(static_cast<uint8_t>(b))) t[b] = static_cast<int32_t>(e.target);
  }
  return std::shared_ptr<const Grammar>(std::move(g));
}

std::string Grammar::to_string() const {
  std::string out;
  for (int r = 0; r < n_rules(); ++r) {
    out += rule_names_[r] + " start=" + std::to_string(rule_start_[r]) + "\n";
  }
  for (int n = 0; n < n_nodes(); ++n) {
    out += "  " + std::to_string(n) + " [" + rule_names_[nodes_[n].rule] + "]" + (nodes_[n].final ? " final" : "") + ":";
    for (const Edge* e = edges_begin(n); e != edges_end(n); ++e) {
      if (e->call >= 0) {
        out += " call(" + rule_names_[e->call] + ")->" + std::to_string(e->target);
      } else {
        out += " {";
        int shown = 0;
        for (int b = 0; b < 256 && shown < 8; ++b)
          if (sets_[e->set].has(uint8_t(b))) {
            out += (b >= 33 && b < 127) ? std::string(1, char(b)) : "\\x" + std::to_string(b);
            ++shown;
          }
        if (sets_[e->set].count() > 8) out += "...";
        out += "}->" + std::to_string(e->target);
      }
    }
    out += "\n";
  }
  return out;
}

}  // namespace strata::grammar
