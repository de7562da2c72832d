// Sampler::save / Sampler::restore. Layout (all integers little-endian, floats as their IEEE
// bits):
//   "STRASMPL"  u32 version(1)
//   params: f32 temperature, i32 top_k, f32 top_p, f32 min_p, f32 repetition_penalty,
//           f32 presence_penalty, f32 frequency_penalty, i32 vocab_limit, u64 seed,
//           u8 has_seed, u32 n_bias, n_bias x (i32 id, f32 bias)
//   rng: 4 x u64 xoshiro256** state
//   i64 n_accepted
//   u32 n_seen, n_seen x i32 id           (first-seen order)
//   u32 n_counts, n_counts x (i32 id, i32 count)   (first-generated order)
// Written byte by byte so the bytes do not depend on the host's endianness.
#include <bit>
#include <cstring>
#include <limits>

#include "sampling/sampler.h"

namespace strata {
namespace {

constexpr char kMagic[8] = {'S', 'T', 'R', 'A', 'S', 'M', 'P', 'L'};
constexpr uint32_t kVersion = 1;

class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) {
    for (int b = 0; b < 4; ++b) u8(static_cast<uint8_t>(v >> (8 * b)));
  }
  void u64(uint64_t v) {
    for (int b = 0; b < 8; ++b) u8(static_cast<uint8_t>(v >> (8 * b)));
  }
  void i32(int32_t v) { u32(static_cast<uint32_t>(v)); }
  void f32(float v) { u32(std::bit_cast<uint32_t>(v)); }
  void bytes(const char* p, size_t n) { out_.append(p, n); }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool u8(uint8_t* v) {
    if (pos_ + 1 > in_.size()) return false;
    *v = static_cast<uint8_t>(in_[pos_++]);
    return true;
  }
  bool u32(uint32_t* v) {
    if (pos_ + 4 > in_.size()) return false;
    *v = 0;
    for (int b = 0; b < 4; ++b) *v |= static_cast<uint32_t>(static_cast<uint8_t>(in_[pos_++])) << (8 * b);
    return true;
  }
  bool u64(uint64_t* v) {
    if (pos_ + 8 > in_.size()) return false;
    *v = 0;
    for (int b = 0; b < 8; ++b) *v |= static_cast<uint64_t>(static_cast<uint8_t>(in_[pos_++])) << (8 * b);
    return true;
  }
  bool i32(int32_t* v) {
    uint32_t u;
    if (!u32(&u)) return false;
    *v = static_cast<int32_t>(u);
    return true;
  }
  bool f32(float* v) {
    uint32_t u;
    if (!u32(&u)) return false;
    *v = std::bit_cast<float>(u);
    return true;
  }
  // A count of entries of entry_size bytes each that must still fit in the input: checked
  // before anything is reserved, so a lying count cannot trigger a huge allocation.
  bool count(uint32_t* n, size_t entry_size) {
    return u32(n) && static_cast<uint64_t>(*n) * entry_size <= in_.size() - pos_;
  }
  bool match(const char* p, size_t n) {
    if (pos_ + n > in_.size() || std::memcmp(in_.data() + pos_, p, n) != 0) return false;
    pos_ += n;
    return true;
  }
  size_t remaining() const { return in_.size() - pos_; }

 private:
  std::string_view in_;
  size_t pos_ = 0;
};

Error corrupt(const std::string& what) { return make_error(ErrorCode::kCorrupt, "sampler state: " + what); }

}  // namespace

std::string Sampler::save() const { return save(rng_.state()); }

std::string Sampler::save(const Xoshiro256::State& rng) const {
  Writer w;
  w.bytes(kMagic, sizeof(kMagic));
  w.u32(kVersion);
  const SamplingParams& p = params_;
  w.f32(p.temperature);
  w.i32(p.top_k);
  w.f32(p.top_p);
  w.f32(p.min_p);
  w.f32(p.repetition_penalty);
  w.f32(p.presence_penalty);
  w.f32(p.frequency_penalty);
  w.i32(p.vocab_limit);
  w.u64(p.seed);
  w.u8(p.has_seed ? 1 : 0);
  w.u32(static_cast<uint32_t>(p.logit_bias.size()));
  for (const auto& [id, bias] : p.logit_bias) {
    w.i32(id);
    w.f32(bias);
  }
  for (uint64_t word : rng) w.u64(word);
  w.u64(static_cast<uint64_t>(n_accepted_));
  w.u32(static_cast<uint32_t>(seen_.size()));
  for (int32_t id : seen_) w.i32(id);
  w.u32(static_cast<uint32_t>(counts_.size()));
  for (const auto& [id, count] : counts_) {
    w.i32(id);
    w.i32(count);
  }
  return w.take();
}

Result<Sampler> Sampler::restore(std::string_view bytes) {
  Reader r(bytes);
  if (!r.match(kMagic, sizeof(kMagic))) return corrupt("bad magic (not a sampler state)");
  uint32_t version = 0;
  if (!r.u32(&version)) return corrupt("truncated before the version");
  if (version != kVersion) {
    return corrupt("version " + std::to_string(version) + ", expected " + std::to_string(kVersion));
  }

  SamplingParams p;
  uint8_t has_seed = 0;
  uint32_t n_bias = 0;
  if (!(r.f32(&p.temperature) && r.i32(&p.top_k) && r.f32(&p.top_p) && r.f32(&p.min_p) &&
        r.f32(&p.repetition_penalty) && r.f32(&p.presence_penalty) && r.f32(&p.frequency_penalty) &&
        r.i32(&p.vocab_limit) && r.u64(&p.seed) && r.u8(&has_seed) && r.count(&n_bias, 8))) {
    return corrupt("truncated in the sampling params");
  }
  if (has_seed > 1) return corrupt("has_seed byte " + std::to_string(has_seed));
  p.has_seed = has_seed == 1;
  p.logit_bias.resize(n_bias);
  for (auto& [id, bias] : p.logit_bias) {
    if (!(r.i32(&id) && r.f32(&bias))) return corrupt("truncated in logit_bias");
  }
  // The model's width is not part of the state: check the params against the widest
  // vocabulary they allow.
  const int32_t vocab = p.vocab_limit > 0 ? p.vocab_limit : std::numeric_limits<int32_t>::max();
  if (Status st = validate_sampling_params(p, vocab); !st.ok()) return corrupt(st.error().message);

  Xoshiro256::State state;
  for (uint64_t& word : state) {
    if (!r.u64(&word)) return corrupt("truncated in the RNG state");
  }
  if (state[0] == 0 && state[1] == 0 && state[2] == 0 && state[3] == 0) return corrupt("all-zero RNG state");

  Sampler s(p);
  s.rng_ = Xoshiro256::from_state(state);
  uint64_t n_accepted = 0;
  if (!r.u64(&n_accepted) || n_accepted > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return corrupt("bad accepted-token count");
  }
  s.n_accepted_ = static_cast<int64_t>(n_accepted);

  uint32_t n_seen = 0;
  if (!r.count(&n_seen, 4)) return corrupt("truncated in the seen ids");
  if (n_seen > 0 && p.repetition_penalty == 1.0f) return corrupt("seen ids without a repetition penalty");
  s.seen_.reserve(n_seen);
  for (uint32_t i = 0; i < n_seen; ++i) {
    int32_t id = 0;
    if (!r.i32(&id)) return corrupt("truncated in the seen ids");
    if (id < 0) return corrupt("negative seen id " + std::to_string(id));
    if (!s.seen_index_.insert(id).second) return corrupt("duplicate seen id " + std::to_string(id));
    s.seen_.push_back(id);
  }
  uint32_t n_counts = 0;
  if (!r.count(&n_counts, 8)) return corrupt("truncated in the token counts");
  s.counts_.reserve(n_counts);
  uint64_t total = 0;
  for (uint32_t i = 0; i < n_counts; ++i) {
    int32_t id = 0, count = 0;
    if (!(r.i32(&id) && r.i32(&count))) return corrupt("truncated in the token counts");
    if (id < 0 || count <= 0) {
      return corrupt("token count entry (" + std::to_string(id) + ", " + std::to_string(count) + ")");
    }
    if (!s.count_index_.emplace(id, s.counts_.size()).second) {
      return corrupt("duplicate counted id " + std::to_string(id));
    }
    s.counts_.emplace_back(id, count);
    total += static_cast<uint64_t>(count);
  }
  if (total != n_accepted) {
    return corrupt("token counts sum to " + std::to_string(total) + " but " + std::to_string(n_accepted) +
                   " tokens were accepted");
  }
  if (r.remaining() != 0) return corrupt(std::to_string(r.remaining()) + " trailing bytes");
  return s;
}

}  // namespace strata
