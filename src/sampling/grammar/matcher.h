// Matcher: one sequence's position in a grammar, advanced token by token, with the next-token
// bitmask, rollback for speculative decoding and the forced continuation for token fill.
//
// Masks come from a TokenMaskCache shared by every matcher of one (grammar, vocabulary). For
// each NFA state a stack can rest on, it holds, computed once on first use, the tokens that
// state accepts whatever lies below it on the stack (a bitmask) and the few whose fate depends
// on the stack below (they return from the state's rule before their last byte). A mask is the
// OR of the cached bitmasks of the current stack tops plus a parse of only those
// context-dependent tokens, walked in byte order so shared prefixes are parsed once.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "sampling/grammar/ir.h"
#include "sampling/grammar/parser.h"
#include "sampling/grammar/vocabulary.h"

namespace strata::grammar {

class TokenMaskCache {
 public:
  TokenMaskCache(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocab);

  const Grammar& grammar() const { return *grammar_; }
  const Vocabulary& vocab() const { return *vocab_; }

  // Tokens accepted whatever the context: as a bitmask when many, else as a list of ids (a
  // state inside a literal accepts a handful; a bitmask is 19 KB at 151,936 ids).
  struct NodeMask {
    std::vector<uint32_t> accept;      // [mask_words] or empty when accept_ids is used
    std::vector<int32_t> accept_ids;   // ascending ids, when accept is empty
    std::vector<int32_t> uncertain;    // sorted vocabulary positions needing the full stack
    int32_t n_accept = 0;
  };
  // The entry for NFA state `node` (a state with byte edges); computed on first use, then
  // shared. Thread-safe.
  const NodeMask& node_mask(uint32_t node) const;
  // Computes every state's entry now (a compile-time cost instead of a first-token one).
  void precompute_all() const;
  int n_cached() const;
  size_t memory_bytes() const;  // held by the cached entries

 private:
  std::unique_ptr<NodeMask> compute(uint32_t node) const;

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const Vocabulary> vocab_;
  mutable std::mutex mu_;
  mutable std::vector<std::unique_ptr<NodeMask>> masks_;  // by node; owned here, never freed
};

class Matcher {
 public:
  // max_rollback: how many accepted tokens rollback() can undo.
  explicit Matcher(std::shared_ptr<const TokenMaskCache> masks, int max_rollback = 32);

  // Advances by one token; false (state unchanged) if the grammar does not allow it. A stop
  // id is accepted only where the grammar can end, and terminates the matcher.
  bool accept_token(int32_t id);
  // Advances by raw bytes (counts as one token for rollback); false, unchanged, if rejected.
  bool accept_bytes(std::string_view bytes);
  // Undoes the last n accepted tokens; false (unchanged) if n exceeds the kept history.
  bool rollback(int n_tokens);
  void reset();

  bool can_terminate() const { return state_.accepting && !terminated_; }
  bool is_terminated() const { return terminated_; }
  // Nothing but the end can follow: terminated, or at an accepting state that reads no byte.
  bool is_complete() const { return terminated_ || (state_.accepting && state_.tops.empty()); }
  // True if `bytes` could be accepted now (no state change).
  bool can_accept_bytes(std::string_view bytes);

  // words[mask_words]: bit id set iff token id is allowed next. Stop ids are set only where the
  // grammar can end; special ids never. After termination only the stop ids are set.
  void fill_next_token_bitmask(uint32_t* words);
  // The bytes the grammar forces next: while exactly one byte can follow and the grammar cannot
  // end, that byte (at most max_bytes).
  std::string forced_bytes(size_t max_bytes = 4096);
  // forced_bytes() tiled into tokens by longest match, dropping a tail that no whole token
  // covers; a tiling, not the tokenizer's own encoding of those bytes.
  std::vector<int32_t> forced_tokens(size_t max_bytes = 4096);

  int history_size() const { return static_cast<int>(history_.size()); }
  const TokenMaskCache& masks() const { return *masks_; }

 private:
  struct Snapshot {
    ParseState state;
    size_t mark;
    bool terminated;
  };
  bool advance(std::string_view bytes, ParseState& out);
  void push_history();

  std::shared_ptr<const TokenMaskCache> masks_;
  Parser parser_;
  ParseState state_;
  bool terminated_ = false;
  int max_rollback_;
  std::deque<Snapshot> history_;  // states before each of the last accepted tokens
  // scratch
  std::vector<ParseState> walk_;
  std::vector<int32_t> cand_;
  std::vector<uint32_t> seen_words_;
};

}  // namespace strata::grammar
