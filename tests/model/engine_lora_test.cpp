// LoRA adapters against the PEFT oracle (tests/data/reference/lora: PEFT 0.21.0, adapters applied
// unmerged, f32 on the CPU). Per adapter: prompt argmax at every position and the last logits
// (1e-4 max-norm) from one forward, and 16 greedy ids through the engine. Then every adapter of a
// base model and the base itself in one engine at once, the same prompts twice: each request
// matches its own oracle (adapters batch together), and the repeat is a prefix hit that never
// crosses between adapters (their blocks chain under salts of their own).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "../support/engine_test_support.h"
#include "golden_cases.h"

namespace strata {
namespace {

using nlohmann::json;
using namespace strata::test;

const json& lora_json() {
  static const json j = [] {
    std::ifstream in(std::string(STRATA_TEST_DATA) + "/reference/lora/lora_logits.json");
    return json::parse(in);
  }();
  return j;
}

std::string adapter_dir(const std::string& name) { return std::string(STRATA_TEST_DATA) + "/reference/lora/" + name; }

struct Key {
  std::string model, variant;  // e.g. llama3-tiny, a
};

std::vector<Key> keys() {
  std::vector<Key> out;
  for (const auto& [k, v] : lora_json().items()) {
    const auto colon = k.find(':');
    out.push_back({k.substr(0, colon), k.substr(colon + 1)});
  }
  return out;
}

std::vector<int32_t> argmax_rows(const std::vector<float>& logits, int32_t vocab) {
  std::vector<int32_t> out;
  for (size_t r = 0; r * size_t(vocab) < logits.size(); ++r) {
    const float* row = &logits[r * size_t(vocab)];
    out.push_back(int32_t(std::max_element(row, row + vocab) - row));
  }
  return out;
}

class LoraGolden : public ::testing::TestWithParam<Key> {};

TEST_P(LoraGolden, ForwardAndGreedyMatchPeft) {
  const Key k = GetParam();
  const json& ref = lora_json()[k.model + ":" + k.variant];
  ThreadPool pool(2);
  auto loaded = load_model(model_dir(k.model), pool);
  ASSERT_TRUE(loaded.ok()) << loaded.error().to_string();
  std::unique_ptr<Model> m = std::move(loaded).value();
  auto adapter = m->load_lora(adapter_dir(ref["adapter"].get<std::string>()), 0);
  ASSERT_TRUE(adapter.ok()) << adapter.error().to_string();
  const int32_t slot = m->add_lora(*adapter);
  const int32_t V = m->config().vocab_size;

  for (const json& c : ref["cases"]) {
    const auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    KvStorage kv(m->kv_layout(), 64, 16);
    StepBatch b;
    b.tokens = prompt;
    SeqSpan s;
    s.n_tokens = int32_t(prompt.size());
    for (int32_t i = 0; i * 16 < s.n_tokens; ++i) s.block_table.push_back(i);
    s.logits_all = true;
    s.adapter = slot;
    b.seqs = {s};
    std::vector<float> logits(size_t(b.n_logit_rows()) * size_t(V));
    m->forward(b, kv, nullptr, logits.data());
    EXPECT_EQ(argmax_rows(logits, V), c["prompt_argmax"].get<std::vector<int32_t>>()) << k.model << ":" << k.variant;
    const std::vector<float> last(logits.end() - V, logits.end());
    EXPECT_LE(golden::max_norm_rel(last.data(), c["last_logits"].get<std::vector<float>>()), 1e-4) << k.model << ":" << k.variant;
  }

  EngineOptions o;
  o.kv_blocks = 256;
  o.block_size = 4;
  o.max_batch_tokens = 24;
  o.lora_slots = {{"ad", slot}};
  auto e = start_engine(std::move(m), o, k.model + "+lora");
  ASSERT_TRUE(e);
  for (const json& c : ref["cases"]) {
    GenerationRequest r;
    r.id = "g";
    r.prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    r.max_tokens = int32_t(c["greedy_ids"].size());
    r.ignore_eos = true;
    r.sampling.temperature = 0.0f;
    r.adapter = "ad";
    EXPECT_EQ(run(*e, r).tokens, c["greedy_ids"].get<std::vector<int32_t>>()) << k.model << ":" << k.variant;
  }
}

INSTANTIATE_TEST_SUITE_P(Peft, LoraGolden, ::testing::ValuesIn(keys()), [](const auto& info) {
  std::string n = info.param.model + "_" + info.param.variant;
  for (char& ch : n) if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
});

// llama3-tiny with adapters a and b and the base model, all in flight at once, twice.
TEST(LoraEngine, AdaptersAndTheBaseBatchTogetherAndNeverShareBlocks) {
  ThreadPool pool(2);
  auto loaded = load_model(model_dir("llama3-tiny"), pool);
  ASSERT_TRUE(loaded.ok());
  std::unique_ptr<Model> m = std::move(loaded).value();
  EngineOptions o;
  o.kv_blocks = 512;
  o.block_size = 4;
  o.max_batch_tokens = 32;
  for (const char* v : {"a", "b"}) {
    auto a = m->load_lora(adapter_dir(std::string("llama3-tiny-") + v), 0);
    ASSERT_TRUE(a.ok()) << a.error().to_string();
    o.lora_slots[v] = m->add_lora(*a);
  }
  auto e = start_engine(std::move(m), o, "llama3-tiny+lora", /*start=*/false);
  ASSERT_TRUE(e);
  struct Want {
    std::string adapter;
    std::vector<int32_t> prompt, greedy;
  };
  std::vector<Want> wants;
  const auto base = golden::cases_for("llama3-tiny");
  for (size_t i = 0; i < 3; ++i) {
    for (const char* v : {"a", "b"}) {
      const json& c = lora_json()[std::string("llama3-tiny:") + v]["cases"][i];
      wants.push_back({v, c["prompt_ids"].get<std::vector<int32_t>>(), c["greedy_ids"].get<std::vector<int32_t>>()});
    }
    wants.push_back({"", base[i].prompt_ids, std::vector<int32_t>(base[i].greedy_ids.begin(), base[i].greedy_ids.begin() + 16)});
  }
  for (int wave = 0; wave < 2; ++wave) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (size_t i = 0; i < wants.size(); ++i) {
      GenerationRequest r;
      r.id = "w" + std::to_string(wave) + "-" + std::to_string(i);
      r.prompt = wants[i].prompt;
      r.max_tokens = 16;
      r.ignore_eos = true;
      r.sampling.temperature = 0.0f;
      r.adapter = wants[i].adapter;
      auto s = e->submit(r);
      ASSERT_TRUE(s.ok()) << s.error().to_string();
      streams.push_back(*s);
    }
    if (wave == 0) e->start();
    int64_t cached = 0;
    for (size_t i = 0; i < wants.size(); ++i) {
      const Outcome out = drain(*streams[i]);
      EXPECT_EQ(out.tokens, wants[i].greedy) << "wave " << wave << " adapter '" << wants[i].adapter << "' case " << i / 3;
      cached += out.final.usage.cached_tokens;
    }
    if (wave == 0) EXPECT_EQ(cached, 0) << "the first wave shares no block between adapters (same prompts, other KV)";
    if (wave == 1) EXPECT_GT(cached, 0) << "the repeat reuses each adapter's own blocks";
  }
  GenerationRequest bad;
  bad.id = "bad";
  bad.prompt = {1, 2};
  bad.adapter = "c";
  auto s = e->submit(bad);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("adapter 'c' is not loaded (loaded: a, b)"), std::string::npos) << s.error().message;
}

TEST(LoraLoad, RefusesWhatItDoesNotApply) {
  ThreadPool pool(1);
  auto m = load_model(model_dir("qwen3-tiny"), pool);
  ASSERT_TRUE(m.ok());
  // An adapter of another base model: its shapes do not fit.
  auto other = (*m)->load_lora(adapter_dir("llama3-tiny-a"), 0);
  ASSERT_FALSE(other.ok());
  // Rank past --max-lora-rank.
  auto big = (*m)->load_lora(adapter_dir("qwen3-tiny-a"), 4);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.error().message.find("--max-lora-rank 4"), std::string::npos) << big.error().message;
  auto missing = (*m)->load_lora(adapter_dir("nope"), 0);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("adapter_config.json"), std::string::npos);
}

}  // namespace
}  // namespace strata
