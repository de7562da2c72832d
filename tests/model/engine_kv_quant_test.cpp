// --kv-quant-start in the engine on the trained strata-demo model: greedy output with int8
// after the conversion stays that of exact KV; converted blocks are shared through the prefix
// cache under the codec namespace while a request within quant_start reads exact blocks only
// (bit-identical logprobs to an exact engine, no hit once the exact blocks are gone); bad
// values and unsupported combinations are refused naming the flag and value.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "../support/engine_test_support.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "model/registry.h"
#include "tokenizer/tokenizer.h"

namespace strata {
namespace {

using namespace strata::test;

std::vector<int32_t> license_ids(size_t n) {
  const std::string dir = model_dir("strata-demo");
  auto tok = tokenizer::Tokenizer::load(dir);
  EXPECT_TRUE(tok.ok());
  if (!tok.ok()) return {};
  std::ifstream f(std::string(STRATA_SOURCE_DIR) + "/LICENSE");
  std::stringstream ss;
  ss << f.rdbuf();
  auto ids = tok->encode(ss.str(), false);
  EXPECT_TRUE(ids.ok());
  if (!ids.ok() || ids->size() < n) return {};
  return std::vector<int32_t>(ids->begin(), ids->begin() + std::ptrdiff_t(n));
}

GenerationRequest greedy(const std::string& id, std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerationRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.sampling.temperature = 0.0f;
  r.logprobs = 2;
  return r;
}

EngineOptions quant_options(const char* codec, int32_t start) {
  EngineOptions o;
  auto c = make_kv_codec_config(codec, "", start);
  EXPECT_TRUE(c.ok());
  if (c.ok()) o.kv_codecs = *c;
  return o;
}

int32_t same_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return int32_t(i);
}

// (a) Greedy ids over 64 tokens after a 96-token prompt with --kv-quant-start 64: int8 gives
// the exact cache's ids; the other codecs are measured and printed.
TEST(EngineKvQuant, GreedyIdsStayThoseOfExactKv) {
  ThreadPool pool(2);
  const auto prompt = license_ids(96);
  ASSERT_EQ(prompt.size(), 96u);
  EngineOptions exact_o;
  exact_o.kv_blocks = 64;
  auto exact = make_engine("strata-demo", pool, exact_o);
  ASSERT_TRUE(exact);
  const Outcome want = run(*exact, greedy("exact", prompt, 64));
  ASSERT_EQ(want.tokens.size(), 64u);
  for (const char* codec : {"int8", "fp8", "int4", "turbo"}) {
    EngineOptions o = quant_options(codec, 64);
    o.kv_blocks = 16;
    o.kv_quant_blocks = 64;
    auto e = make_engine("strata-demo", pool, o);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->n_kv_blocks(), 16);
    EXPECT_EQ(e->n_kv_quant_blocks(), 64);
    const Outcome got = run(*e, greedy(codec, prompt, 64));
    ASSERT_EQ(got.tokens.size(), 64u);
    const int32_t agree = same_prefix(got.tokens, want.tokens);
    double max_dlp = 0;
    for (size_t i = 0; i < size_t(agree); ++i) {
      max_dlp = std::max(max_dlp, std::fabs(double(got.logprobs[i].chosen.logprob) - want.logprobs[i].chosen.logprob));
    }
    std::printf("%-6s quant_start 64: %d of 64 greedy ids equal exact KV's, max |logprob diff| %.3e, %lld blocks converted\n",
                codec, agree, max_dlp, static_cast<long long>(e->stats().kv_converted_blocks));
    if (agree < 64) {
      // Where they part: the exact cache's two best tokens there, and the codec's.
      const auto& w = want.logprobs[size_t(agree)].top;
      const auto& g = got.logprobs[size_t(agree)].top;
      std::printf("       token %d: exact top-2 %d (%.4f) %d (%.4f); %s top-2 %d (%.4f) %d (%.4f)\n", agree, w[0].token,
                  w[0].logprob, w[1].token, w[1].logprob, codec, g[0].token, g[0].logprob, g[1].token, g[1].logprob);
    }
    {
      // The same codec from the first token, for comparison.
      EngineOptions o0 = quant_options(codec, 0);
      o0.kv_blocks = 64;
      auto e0 = make_engine("strata-demo", pool, o0);
      ASSERT_TRUE(e0);
      const Outcome from0 = run(*e0, greedy(std::string(codec) + "-0", prompt, 64));
      const auto& t = from0.logprobs[1].top;
      std::printf("       the codec from token 0: %d of 64 equal exact KV's; token 1 top-2 %d (%.4f) %d (%.4f)\n",
                  same_prefix(from0.tokens, want.tokens), t[0].token, t[0].logprob, t[1].token, t[1].logprob);
    }
    // 96 + 63 computed tokens: 9 full blocks, all converted (none shared within one request).
    EXPECT_EQ(e->stats().kv_converted_blocks, 9) << codec;
    // The first token comes from the exact prefill; the second reads the converted blocks.
    EXPECT_NE(got.logprobs[1].chosen.logprob, want.logprobs[1].chosen.logprob) << codec;
    if (std::string(codec) == "int8") {
      EXPECT_EQ(agree, 64);
    }
  }
}

// (b, c) Prefix hits on either pool under its own namespace.
TEST(EngineKvQuant, ConvertedBlocksServeLongPromptsOnlyAndExactRequestsStayExact) {
  ThreadPool pool(2);
  const auto a_prompt = license_ids(96);
  ASSERT_EQ(a_prompt.size(), 96u);
  const std::vector<int32_t> short_prompt(a_prompt.begin(), a_prompt.begin() + 40);  // within quant_start
  std::vector<int32_t> other;
  for (int32_t i = 0; i < 128; ++i) other.push_back(int32_t(5 + mix(uint64_t(i)) % 500));

  EngineOptions exact_o;
  exact_o.kv_blocks = 64;
  auto exact = make_engine("strata-demo", pool, exact_o);
  ASSERT_TRUE(exact);
  const Outcome short_exact = run(*exact, greedy("short-exact", short_prompt, 8));

  EngineOptions o = quant_options("int8", 64);
  o.kv_blocks = 9;  // small: another request evicts the exact prefix
  o.kv_quant_blocks = 64;
  auto e = make_engine("strata-demo", pool, o);
  ASSERT_TRUE(e);
  const Outcome a = run(*e, greedy("a", a_prompt, 4));
  EXPECT_EQ(a.final.usage.cached_tokens, 0);
  // Within quant_start, the exact blocks a published first: a hit, and exactly exact KV.
  const Outcome s1 = run(*e, greedy("short-1", short_prompt, 8));
  EXPECT_EQ(s1.final.usage.cached_tokens, 32);
  ASSERT_EQ(s1.tokens, short_exact.tokens);
  for (size_t i = 0; i < s1.logprobs.size(); ++i) EXPECT_EQ(s1.logprobs[i].chosen.logprob, short_exact.logprobs[i].chosen.logprob);
  // A long unrelated prompt takes every exact block.
  run(*e, greedy("other", other, 4));
  // a's prompt again: 5 converted blocks (the last token is computed).
  const Outcome a2 = run(*e, greedy("a-again", a_prompt, 4));
  EXPECT_EQ(a2.final.usage.cached_tokens, 80);
  EXPECT_EQ(same_prefix(a2.tokens, a.tokens), 4);
  // Within quant_start again: the converted blocks are not for it, and the exact ones are gone.
  const Outcome s2 = run(*e, greedy("short-2", short_prompt, 8));
  EXPECT_EQ(s2.final.usage.cached_tokens, 0);
  ASSERT_EQ(s2.tokens, short_exact.tokens);
  for (size_t i = 0; i < s2.logprobs.size(); ++i) EXPECT_EQ(s2.logprobs[i].chosen.logprob, short_exact.logprobs[i].chosen.logprob);
  // Stats are published after the step that ended the request: wait for them.
  EngineStats st = e->stats();
  for (int i = 0; i < 200 && (st.kv.used != 0 || st.kv_quant.used != 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    st = e->stats();
  }
  EXPECT_EQ(st.kv.used, 0);
  EXPECT_EQ(st.kv_quant.used, 0);
  EXPECT_GT(st.kv_quant.cached, 0);
  // The namespace says the engine converts.
  EXPECT_NE(e->prefix_namespace().find("quant_start=64"), std::string::npos) << e->prefix_namespace();
}

// (d) Refusals name the flag and the value.
TEST(EngineKvQuant, BadValuesAreRefused) {
  ThreadPool pool(2);
  auto create = [&](const char* model, EngineOptions o) -> Error {
    auto m = load_model(model_dir(model), pool);
    EXPECT_TRUE(m.ok());
    auto e = Engine::create(std::move(m).value(), o);
    EXPECT_FALSE(e.ok());
    return e.ok() ? Error{} : e.error();
  };
  auto c = make_kv_codec_config("int8", "", -4);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("--kv-quant-start"), std::string::npos) << c.error().message;
  EXPECT_NE(c.error().message.find("-4"), std::string::npos) << c.error().message;

  EngineOptions o = quant_options("int8", 64);
  o.kv_codecs.quant_start = -4;  // set directly, past the flag parser
  Error e = create("strata-demo", o);
  EXPECT_EQ(e.code, ErrorCode::kInvalidArgument);
  EXPECT_NE(e.message.find("--kv-quant-start must be >= 0, got -4"), std::string::npos) << e.message;

  e = create("strata-demo", quant_options("auto", 64));
  EXPECT_EQ(e.code, ErrorCode::kInvalidArgument);
  EXPECT_NE(e.message.find("--kv-quant-start 64"), std::string::npos) << e.message;

  o = quant_options("int8", 256);
  o.kv_blocks = 8;
  e = create("strata-demo", o);
  EXPECT_EQ(e.code, ErrorCode::kInvalidArgument);
  EXPECT_NE(e.message.find("kv_blocks 8"), std::string::npos) << e.message;

  o = quant_options("int8", 64);
  o.kv_host_bytes = 1 << 20;
  e = create("strata-demo", o);
  EXPECT_EQ(e.code, ErrorCode::kUnsupported);
  EXPECT_NE(e.message.find("--kv-quant-start 64"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("kv_host_bytes 1048576"), std::string::npos) << e.message;

}

// --kv-quant-start auto: one block for the quantizing codecs on models the engine converts
// (the same tokens and logprobs as asking for 16), none for exact or bf16 KV, sliding-window
// or recurrent models and engines with lower KV tiers.
TEST(EngineKvQuant, AutoStartIsOneBlockWhereTheEngineConverts) {
  ThreadPool pool(2);
  auto started = [&](const char* model, EngineOptions o) -> std::pair<int32_t, int32_t> {
    auto m = load_model(model_dir(model), pool);
    EXPECT_TRUE(m.ok());
    if (!m.ok()) return {-9, -9};
    auto e = Engine::create(std::move(m).value(), o);
    EXPECT_TRUE(e.ok()) << model << ": " << e.error().to_string();
    if (!e.ok()) return {-9, -9};
    return {(*e)->options().kv_codecs.quant_start, (*e)->n_kv_quant_blocks()};
  };
  const int32_t autos = KvCodecConfig::kQuantStartAuto;
  for (const char* codec : {"fp8", "int8", "int4", "turbo"}) {
    const auto [start, blocks] = started("strata-demo", quant_options(codec, autos));
    EXPECT_EQ(start, 16) << codec;
    EXPECT_GT(blocks, 0) << codec;
  }
  EngineOptions o = quant_options("fp8", autos);
  o.block_size = 32;
  EXPECT_EQ(started("strata-demo", o).first, 32);
  for (const char* codec : {"auto", "bf16"}) EXPECT_EQ(started("strata-demo", quant_options(codec, autos)), std::make_pair(0, 0)) << codec;
  o = quant_options("fp8", autos);
  o.kv_host_bytes = 1 << 20;
  EXPECT_EQ(started("strata-demo", o), std::make_pair(0, 0));
  EXPECT_EQ(started("gemma2-tiny", quant_options("fp8", autos)), std::make_pair(0, 0));
  EXPECT_EQ(started("qwen3next-tiny", quant_options("fp8", autos)), std::make_pair(0, 0));

  // Auto is exactly --kv-quant-start 16.
  const auto prompt = license_ids(40);
  ASSERT_EQ(prompt.size(), 40u);
  Outcome out[2];
  for (int i = 0; i < 2; ++i) {
    EngineOptions q = quant_options("fp8", i == 0 ? autos : 16);
    q.kv_blocks = 16;
    q.kv_quant_blocks = 16;
    auto e = make_engine("strata-demo", pool, q);
    ASSERT_TRUE(e);
    out[i] = run(*e, greedy("auto" + std::to_string(i), prompt, 40));
    EXPECT_EQ(e->stats().kv_converted_blocks, 4);  // 79 computed tokens: 4 full blocks
  }
  ASSERT_EQ(out[0].tokens, out[1].tokens);
  for (size_t i = 0; i < out[0].logprobs.size(); ++i) EXPECT_EQ(out[0].logprobs[i].chosen.logprob, out[1].logprobs[i].chosen.logprob);
}

}  // namespace
}  // namespace strata
