// Helpers the engine tests share on the CPU and the GPU: read a request's stream to its end,
// greedy requests, deterministic prompt ids, the speculation tests' workload. Needs no test
// data paths.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace strata::test {

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;         // per generated token, when asked for
  std::vector<TokenLogprobs> prompt_logprobs;
  StreamEvent final;
};

// Reads a stream to its final event.
inline Outcome drain(RequestStream& s, std::chrono::seconds timeout = std::chrono::seconds(300)) {
  Outcome o;
  for (;;) {
    auto e = s.next(timeout);
    if (!e) {
      ADD_FAILURE() << "request " << s.id() << " timed out";
      return o;
    }
    o.tokens.insert(o.tokens.end(), e->tokens.begin(), e->tokens.end());
    o.logprobs.insert(o.logprobs.end(), e->logprobs.begin(), e->logprobs.end());
    if (!e->prompt_logprobs.empty()) o.prompt_logprobs = e->prompt_logprobs;
    if (e->final) {
      o.final = *e;
      return o;
    }
  }
}

// A greedy request that ignores EOS: exactly max_tokens tokens come back.
inline GenerationRequest greedy_request(const std::string& id, std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerationRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  r.ignore_eos = true;
  return r;
}

// splitmix64 finalizer: deterministic pseudo-random prompt ids.
inline uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A prompt that repeats itself (n-gram lookup finds continuations) or is random.
inline std::vector<int32_t> spec_prompt(int i, int32_t n, bool repeating, int32_t vocab) {
  std::vector<int32_t> p;
  const int32_t period = 5 + i % 7;
  for (int32_t k = 0; k < n; ++k) {
    const uint64_t key = repeating ? uint64_t(i) * 131 + uint64_t(k % period) : uint64_t(i) * 7919 + uint64_t(k);
    p.push_back(int32_t(3 + mix(key) % uint64_t(vocab - 3)));
  }
  return p;
}

// Request i of the speculation tests' mixed workload: greedy and seeded, repetition and
// frequency penalties, logprobs, one opted out; every fifth prompt long (long_prompt + 7 i
// tokens, prefilling in chunks beside decodes), the rest 8-47 tokens.
inline GenerationRequest spec_request(int i, int32_t vocab, int32_t long_prompt) {
  GenerationRequest r;
  r.id = "req-" + std::to_string(i);
  const int32_t n_prompt = i % 5 == 4 ? long_prompt + 7 * i : 8 + int32_t(mix(uint64_t(i)) % 40);
  r.prompt = spec_prompt(i, n_prompt, i % 3 != 2, vocab);
  r.max_tokens = 12 + (i * 7) % 29;
  r.ignore_eos = true;
  if (i % 2 == 0) {
    r.sampling.temperature = 0.0f;
  } else {
    r.sampling.temperature = 0.8f;
    r.sampling.top_p = 0.9f;
    r.sampling.seed = uint64_t(1000 + i);
    r.sampling.has_seed = true;
  }
  if (i % 4 == 1) r.sampling.repetition_penalty = 1.3f;  // penalties see every accepted token
  if (i % 6 == 3) r.sampling.frequency_penalty = 0.5f;
  if (i == 2 || i == 5) r.logprobs = 3;
  if (i % 7 == 6) r.speculative = false;  // opted out
  return r;
}

// n prompt ids in [3, vocab) from an xorshift stream seeded by salt (ids 0-2 are pad, bos, eos).
inline std::vector<int32_t> random_ids(uint64_t salt, int32_t n, int32_t vocab) {
  std::vector<int32_t> v;
  uint64_t x = salt * 0x9E3779B97F4A7C15ull + 1;
  for (int32_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v.push_back(int32_t(3 + x % uint64_t(vocab - 3)));
  }
  return v;
}

}  // namespace strata::test
