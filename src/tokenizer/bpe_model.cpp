#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <cstdio>
#include <mutex>

#include <nlohmann/json.hpp>

#include "tokenizer/unicode.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace strata::tokenizer {
namespace {

using json = nlohmann::json;

size_t hash_bytes(std::string_view s) { return static_cast<size_t>(XXH3_64bits(s.data(), s.size())); }

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

// Open-addressing (linear probing) map from an id pair to (rank, merged id): one probe
// per candidate pair in the hot loop, no per-entry allocation.
struct BpeModel::MergeTable {
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t new_id = 0;
  };
  static constexpr uint64_t kEmpty = ~0ull;
  std::vector<Slot> slots;
  uint64_t mask = 0;
  int shift = 64;

  void reserve(size_t n) {
    size_t cap = 16;
    shift = 60;
    while (cap < n * 2) {
      cap <<= 1;
      --shift;
    }
    slots.assign(cap, Slot{});
    mask = cap - 1;
  }
  size_t home(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift); }
  // Later entries replace earlier ones with the same pair, as a hash map built in file
  // order does.
  void insert(uint64_t key, int32_t rank, int32_t new_id) {
    size_t i = home(key);
    while (slots[i].key != kEmpty && slots[i].key != key) i = (i + 1) & mask;
    slots[i] = Slot{key, rank, new_id};
  }
  const Slot* find(uint64_t key) const {
    size_t i = home(key);
    while (true) {
      const Slot& s = slots[i];
      if (s.key == key) return &s;
      if (s.key == kEmpty) return nullptr;
      i = (i + 1) & mask;
    }
  }
};

// Word -> ids cache, split into shards so threads encoding at once rarely meet; a shard
// that is busy is skipped rather than waited for, and a full shard is cleared.
class WordCache {
 public:
  static constexpr size_t kShards = 16;
  static constexpr size_t kShardCapacity = 8192;
  static constexpr size_t kMaxWordBytes = 128;

  bool lookup(std::string_view word, std::vector<int32_t>& out) {
    Shard& s = shard(word);
    std::unique_lock lock(s.mu, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    auto it = s.map.find(word);
    if (it == s.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }
  void store(std::string_view word, const int32_t* ids, size_t n) {
    if (word.size() > kMaxWordBytes) return;
    Shard& s = shard(word);
    std::unique_lock lock(s.mu, std::try_to_lock);
    if (!lock.owns_lock()) return;
    if (s.map.size() >= kShardCapacity) s.map.clear();
    s.map.emplace(std::string(word), std::vector<int32_t>(ids, ids + n));
  }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return hash_bytes(s); }
  };
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> map;
  };
  Shard& shard(std::string_view word) { return shards_[(hash_bytes(word) >> 59) % kShards]; }
  Shard shards_[kShards];
};

BpeModel::BpeModel() : merges_(std::make_unique<MergeTable>()), cache_(std::make_unique<WordCache>()) {
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
  std::fill(std::begin(fallback_ids_), std::end(fallback_ids_), -1);
}
BpeModel::~BpeModel() = default;
BpeModel::BpeModel(BpeModel&&) noexcept = default;
BpeModel& BpeModel::operator=(BpeModel&&) noexcept = default;

Result<BpeModel> BpeModel::from_json(const json& model) {
  VocabEntries vocab;
  MergeEntries merges;
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return make_error(ErrorCode::kCorrupt, "tokenizer.json model.vocab: expected an object");
  }
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it.value().is_number_integer()) {
      return make_error(ErrorCode::kCorrupt, "tokenizer.json model.vocab['" + it.key() + "']: expected an integer id");
    }
    vocab.emplace_back(it.key(), it.value().get<int64_t>());
  }
  const json empty = json::array();
  const json& list = model.contains("merges") ? model["merges"] : empty;
  for (size_t rank = 0; rank < list.size(); ++rank) {
    const auto& entry = list[rank];
    if (entry.is_string()) {
      const std::string& s = entry.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos) {
        return make_error(ErrorCode::kCorrupt, "tokenizer.json model.merges[" + std::to_string(rank) + "] '" + s + "': expected 'a b'");
      }
      merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
      merges.emplace_back(entry[0].get<std::string>(), entry[1].get<std::string>());
    } else {
      return make_error(ErrorCode::kCorrupt, "tokenizer.json model.merges[" + std::to_string(rank) + "]: expected 'a b' or [a, b]");
    }
  }
  return build(model, std::move(vocab), std::move(merges));
}

Result<BpeModel> BpeModel::build(const json& model, VocabEntries vocab, MergeEntries merges) {
  if (model.value("type", std::string("BPE")) != "BPE") {
    return make_error(ErrorCode::kUnsupported,
                      "tokenizer.json model type '" + model.value("type", std::string()) + "' (only BPE is supported)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && model[key].is_string() && !model[key].get_ref<const std::string&>().empty()) {
      return make_error(ErrorCode::kUnsupported, std::string("tokenizer.json model.") + key + " is not supported");
    }
  }
  BpeModel m;
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab) {
    if (id < 0 || id >= (int64_t{1} << 30)) {
      return make_error(ErrorCode::kCorrupt, "tokenizer.json model.vocab['" + token + "']: id " + std::to_string(id));
    }
    max_id = std::max(max_id, id);
  }
  m.pieces_.resize(static_cast<size_t>(max_id + 1));
  size_t cap = 16;
  while (cap < vocab.size() * 2) cap <<= 1;
  m.index_.assign(cap, -1);
  m.index_mask_ = cap - 1;
  for (auto& [token, id64] : vocab) {
    const auto id = static_cast<int32_t>(id64);
    size_t slot = hash_bytes(token) & m.index_mask_;
    bool duplicate = false;
    while (m.index_[slot] >= 0) {
      if (m.pieces_[static_cast<size_t>(m.index_[slot])] == token) {
        m.index_[slot] = id;  // a repeated key: the last one wins, as in a JSON object read into a map
        duplicate = true;
        break;
      }
      slot = (slot + 1) & m.index_mask_;
    }
    if (!duplicate) m.index_[slot] = id;
    m.pieces_[static_cast<size_t>(id)] = std::move(token);
  }

  for (int b = 0; b < 256; ++b) {
    std::string ch;
    append_utf8(ch, byte_to_unicode(static_cast<uint8_t>(b)));
    m.byte_ids_[b] = m.token_to_id(ch);
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    m.fallback_ids_[b] = m.token_to_id(name);
  }
  m.all_fallback_bytes_ = std::all_of(std::begin(m.fallback_ids_), std::end(m.fallback_ids_), [](int32_t id) { return id >= 0; });

  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const std::string& unk = model["unk_token"].get_ref<const std::string&>();
    m.unk_id_ = m.token_to_id(unk);
    if (m.unk_id_ < 0) return make_error(ErrorCode::kCorrupt, "tokenizer.json model.unk_token '" + unk + "' is not in the vocabulary");
  }
  m.byte_fallback_ = model.contains("byte_fallback") && model["byte_fallback"].is_boolean() && model["byte_fallback"].get<bool>();
  m.fuse_unk_ = model.contains("fuse_unk") && model["fuse_unk"].is_boolean() && model["fuse_unk"].get<bool>();
  m.ignore_merges_ = model.contains("ignore_merges") && model["ignore_merges"].is_boolean() && model["ignore_merges"].get<bool>();

  m.merges_->reserve(merges.size());
  std::string merged;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    merged.assign(left);
    merged.append(right);
    const int32_t l = m.token_to_id(left), r = m.token_to_id(right), n = m.token_to_id(merged);
    if (l < 0 || r < 0 || n < 0) {
      return make_error(ErrorCode::kCorrupt, "tokenizer.json model.merges[" + std::to_string(rank) + "] '" + left + " " +
                                                 right + "' names a token outside the vocabulary");
    }
    m.merges_->insert(pair_key(l, r), static_cast<int32_t>(rank), n);
  }
  return m;
}

int32_t BpeModel::token_to_id(std::string_view token) const {
  if (index_.empty()) return -1;
  size_t slot = hash_bytes(token) & index_mask_;
  while (true) {
    const int32_t id = index_[slot];
    if (id < 0) return -1;
    if (pieces_[static_cast<size_t>(id)] == token) return id;
    slot = (slot + 1) & index_mask_;
  }
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= pieces_.size()) return nullptr;
  const std::string& p = pieces_[static_cast<size_t>(id)];
  if (p.empty()) return nullptr;
  return &p;
}

int32_t BpeModel::char_id(std::string_view ch) const { return token_to_id(ch); }

void BpeModel::encode_word(std::string_view word, bool byte_level, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  // A one-character word has nothing to merge (digits, punctuation, single spaces).
  if (byte_level && word.size() == 1 && byte_ids_[static_cast<uint8_t>(word[0])] >= 0) {
    out.push_back(byte_ids_[static_cast<uint8_t>(word[0])]);
    return;
  }
  if (cache_->lookup(word, out)) return;
  const size_t before = out.size();
  merge_word(word, byte_level, out);
  cache_->store(word, out.data() + before, out.size() - before);
}

namespace {

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  int32_t len;  // bytes of input covered; 0 once merged into its left neighbour
};

struct Candidate {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
  // Min-heap on (rank, pos) through std::push_heap's max-heap.
  bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

struct MergeScratch {
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  std::string mapped;
};

MergeScratch& merge_scratch() {
  thread_local MergeScratch s;
  return s;
}

}  // namespace

void BpeModel::merge_word(std::string_view word, bool byte_level, std::vector<int32_t>& out) const {
  MergeScratch& scratch = merge_scratch();

  if (ignore_merges_) {
    std::string_view key = word;
    if (byte_level) {
      scratch.mapped.clear();
      for (char c : word) append_utf8(scratch.mapped, byte_to_unicode(static_cast<uint8_t>(c)));
      key = scratch.mapped;
    }
    const int32_t id = token_to_id(key);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }

  auto& symbols = scratch.symbols;
  symbols.clear();
  auto add = [&](int32_t id, int32_t len) {
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{id, n - 1, -1, len});
    if (n > 0) symbols[static_cast<size_t>(n - 1)].next = n;
  };
  // A pending run of unknown characters: (unk id, bytes), flushed before the next known
  // symbol (fuse_unk joins consecutive unknowns into one).
  int32_t pending_unk_len = 0;
  bool pending_unk = false;
  std::string ch;
  size_t pos = 0;
  while (pos < word.size()) {
    int32_t id;
    int32_t byte_len;
    if (byte_level) {
      const auto b = static_cast<uint8_t>(word[pos]);
      id = byte_ids_[b];
      byte_len = 1;
      if (id < 0) {
        ch.clear();
        append_utf8(ch, byte_to_unicode(b));
      }
      ++pos;
    } else {
      const size_t start = pos;
      pos += utf8_sequence_length(static_cast<unsigned char>(word[pos]));
      ch.assign(word.substr(start, pos - start));
      byte_len = static_cast<int32_t>(pos - start);
      id = char_id(ch);
    }
    if (id >= 0) {
      if (pending_unk) {
        add(unk_id_, pending_unk_len);
        pending_unk = false;
      }
      add(id, byte_len);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : ch) all = all && fallback_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        // Byte tokens go in at once, ahead of any pending unknown (the reference order).
        for (char c : ch) add(fallback_ids_[static_cast<uint8_t>(c)], 1);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (pending_unk && fuse_unk_) {
        pending_unk_len += byte_len;
      } else {
        if (pending_unk) add(unk_id_, pending_unk_len);
        pending_unk = true;
        pending_unk_len = byte_len;
      }
    }
    // Without an unk token the character is dropped.
  }
  if (pending_unk) add(unk_id_, pending_unk_len);

  auto& heap = scratch.heap;
  heap.clear();
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const auto* m = merges_->find(pair_key(symbols[i].id, symbols[i + 1].id))) {
      heap.push_back(Candidate{m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  std::make_heap(heap.begin(), heap.end());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& cur = symbols[static_cast<size_t>(top.pos)];
    if (cur.len == 0 || cur.next < 0) continue;
    const Symbol right = symbols[static_cast<size_t>(cur.next)];
    const auto* m = merges_->find(pair_key(cur.id, right.id));
    if (m == nullptr || m->new_id != top.new_id) continue;  // a stale candidate
    symbols[static_cast<size_t>(cur.next)].len = 0;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    if (cur.prev >= 0) {
      if (const auto* pm = merges_->find(pair_key(symbols[static_cast<size_t>(cur.prev)].id, cur.id))) {
        heap.push_back(Candidate{pm->rank, cur.prev, pm->new_id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
    if (cur.next >= 0) {
      if (const auto* nm = merges_->find(pair_key(cur.id, symbols[static_cast<size_t>(cur.next)].id))) {
        heap.push_back(Candidate{nm->rank, top.pos, nm->new_id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (s.len != 0) out.push_back(s.id);
  }
}

}  // namespace strata::tokenizer
