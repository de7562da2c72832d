// Helpers the engine tests share: start an engine over a model, run a request to its end.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "engine/engine.h"
#include "model/registry.h"

namespace strata::test {

// A reference model's directory: tests/data/reference/models/NAME, or the bundled models/NAME.
inline std::string model_dir(const std::string& name) {
  if (name.rfind("strata-demo", 0) == 0) return std::string(STRATA_SOURCE_DIR) + "/models/" + name;
  return std::string(STRATA_TEST_DATA) + "/reference/models/" + name;
}

// Creates and starts an engine; a failure is a test failure and returns null. With start
// false the caller starts it (requests submitted before then wait in the queue, so a test can
// have all of them there when the first step is planned).
inline std::unique_ptr<Engine> start_engine(std::unique_ptr<Model> model, EngineOptions o, const std::string& identity,
                                            bool start = true) {
  if (!model) return nullptr;
  o.model_identity = identity;
  auto e = Engine::create(std::move(model), o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().to_string());
  if (!e.ok()) return nullptr;
  if (start) (*e)->start();
  return std::move(e).value();
}

// Loads model NAME (see model_dir) and starts an engine over it (see start_engine for start).
inline std::unique_ptr<Engine> make_engine(const std::string& name, ThreadPool& pool, EngineOptions o,
                                           bool start = true) {
  auto m = load_model(model_dir(name), pool);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().to_string());
  if (!m.ok()) return nullptr;
  return start_engine(std::move(m).value(), std::move(o), name, start);
}

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

// Submits one request and reads it to its end.
inline Outcome run(Engine& e, const GenerationRequest& r) {
  auto s = e.submit(r);
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().to_string());
  if (!s.ok()) return {};
  return drain(**s);
}

// splitmix64 finalizer: deterministic pseudo-random prompt ids.
inline uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
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
