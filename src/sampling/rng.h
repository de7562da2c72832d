// The sampler's random source: xoshiro256** (Blackman and Vigna), seeded through splitmix64.
// Both are fully specified integer recurrences, so a seed gives the same stream on every
// compiler, standard library and CPU. std::*_distribution is deliberately not used: its output
// is implementation-defined and would make a seeded request differ between builds.
#pragma once

#include <array>
#include <cstdint>

namespace strata {

// splitmix64: advances *state and returns the next output. Used to spread one 64-bit seed
// over the 256 bits of xoshiro state (never all zero in practice).
inline uint64_t splitmix64_next(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class Xoshiro256 {
 public:
  using State = std::array<uint64_t, 4>;

  explicit Xoshiro256(uint64_t seed = 0) {
    uint64_t sm = seed;
    for (auto& word : s_) word = splitmix64_next(&sm);
  }
  static Xoshiro256 from_state(const State& s) {
    Xoshiro256 r;
    r.s_ = s;
    return r;
  }
  const State& state() const { return s_; }

  uint64_t next_u64() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits: the top 53 bits of one output, scaled exactly.
  double next_double() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  State s_{};
};

}  // namespace strata
