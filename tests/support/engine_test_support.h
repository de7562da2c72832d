// Helpers the engine tests share: start an engine over a model, run a request to its end
// (reading streams and making requests: stream_test_support.h).
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
#include "stream_test_support.h"

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

// Submits one request and reads it to its end.
inline Outcome run(Engine& e, const GenerationRequest& r) {
  auto s = e.submit(r);
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().to_string());
  if (!s.ok()) return {};
  return drain(**s);
}

}  // namespace strata::test
