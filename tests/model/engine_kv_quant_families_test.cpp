// --kv-quant-start on the families with sliding windows, shared KV and recurrent state
// (gemma3-tiny, gemma4-tiny, qwen35-tiny; llama3-tiny as the plain case): the engine's tokens
// and logprobs equal, bit for bit, the reference codec path driven through the model directly
// (the prompt prefilled exact in one step, then after every step each full block past the
// start re-encoded by convert_kv_block into the codec storage and read from there, windows
// and state exact); the run differs from exact KV's; a second turn reusing the first's
// blocks is a prefix hit past the first prompt (window blocks and snapshots found under the
// codec namespace) and gives the tokens of a fresh engine taking the same turns.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "../support/engine_test_support.h"
#include "backend/reference/kv_codec.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "model/kv_storage.h"
#include "model/registry.h"
#include "sampling/logprobs.h"

namespace strata {
namespace {

using namespace strata::test;

constexpr int32_t kBs = 16, kStart = 32, kPrompt = 70, kGen = 24;

std::vector<int32_t> prompt_ids(int32_t vocab, int32_t n, int32_t seed) {
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < n; ++i) ids.push_back(int32_t((uint32_t(i) * 2654435761u + uint32_t(seed) * 40503u) % uint32_t(vocab - 4)) + 3);
  return ids;
}

EngineOptions quant_options(int32_t start) {
  EngineOptions o;
  auto c = make_kv_codec_config("int8", "", start);
  EXPECT_TRUE(c.ok());
  if (c.ok()) o.kv_codecs = *c;
  o.block_size = kBs;
  o.kv_cache_bytes = int64_t(64) << 20;
  o.max_num_seqs = 4;
  return o;
}

GenerationRequest greedy(const std::string& id, std::vector<int32_t> prompt) {
  GenerationRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = kGen;
  r.ignore_eos = true;
  r.sampling.temperature = 0.0f;
  r.logprobs = 1;
  return r;
}

struct Reference {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

// The reference codec path for one sequence, straight through Model::forward: exact storage
// with the windows paging apart, a codec storage for the converted full-attention blocks.
Reference reference_run(Model& m, const std::vector<int32_t>& prompt) {
  const auto exact_layout = m.kv_layout();
  std::vector<KvLayerSpec> codec_layout = exact_layout;
  std::vector<int> converted;
  for (size_t l = 0; l < codec_layout.size(); ++l) {
    KvLayerSpec& s = codec_layout[l];
    if (!s.has_kv || s.shares_with >= 0) continue;
    s.codec = {KvCodec::kInt8, kv_default_group(KvCodec::kInt8, s.head_dim_k)};
    if (s.window == 0) converted.push_back(int(l));
  }
  const int32_t n_blocks = (kPrompt + kGen) / kBs + 2;
  KvStorage exact(exact_layout, n_blocks, kBs, n_blocks);
  KvStorage codec(codec_layout, n_blocks, kBs, 0);
  exact.set_quant(&codec);
  StateStorage state(m.state_layout(), 1);
  const bool has_state = [&] {
    for (const auto& s : m.state_layout()) if (s.has_state) return true;
    return false;
  }();
  int32_t align = kBs;
  for (const auto& s : m.state_layout()) {
    if (s.has_state && s.prefill_chunk > 1) align = std::lcm(align, s.prefill_chunk);
  }
  const int32_t cut = has_state ? (int32_t(prompt.size()) - 1) / align * align : 0;
  const int32_t V = m.config().vocab_size;
  SeqSpan span;
  span.state_slot = has_state ? 0 : -1;
  if (has_state) state.reset(0);
  Reference out;
  std::vector<int32_t> tokens = prompt;
  int32_t n_computed = 0, next_codec = 0;
  std::vector<float> logits(static_cast<size_t>(V));
  while (int32_t(out.tokens.size()) < kGen) {
    // Before the step: full blocks past the start move to the codec storage.
    if (n_computed > kStart) {
      for (int32_t i = span.n_quant_blocks; i < n_computed / kBs; ++i) {
        for (int l : converted) convert_kv_block(exact, l, span.block_table[size_t(i)], codec, next_codec);
        span.block_table[size_t(i)] = next_codec++;
        span.n_quant_blocks = i + 1;
      }
    }
    StepBatch b;
    // A recurrent model's prompt is cut where its state is snapshotted: the last boundary
    // before its last token (engine/scheduler.cpp, is_snapshot_point).
    const int32_t end = n_computed == 0 && cut > 0 ? cut : int32_t(tokens.size());
    b.tokens.assign(tokens.begin() + n_computed, tokens.begin() + end);
    span.pos0 = n_computed;
    span.n_tokens = int32_t(b.tokens.size());
    const int32_t need = (span.pos0 + span.n_tokens + kBs - 1) / kBs;
    while (int32_t(span.block_table.size()) < need) {
      const int32_t id = int32_t(span.block_table.size());  // exact and window pools alike
      span.block_table.push_back(id);
      span.window_block_table.push_back(id);
    }
    b.seqs = {span};
    m.forward(b, exact, has_state ? &state : nullptr, logits.data());
    n_computed += span.n_tokens;
    if (n_computed < int32_t(tokens.size())) continue;  // a prompt chunk: no logits wanted
    int32_t best = 0;
    for (int32_t t = 1; t < V; ++t) best = logits[size_t(t)] > logits[size_t(best)] ? t : best;
    TokenLogprobs lp;
    EXPECT_TRUE(compute_logprobs(logits.data(), V, best, 0, &lp).ok());
    out.tokens.push_back(best);
    out.logprobs.push_back(lp.chosen.logprob);
    tokens.push_back(best);
  }
  return out;
}

std::vector<float> chosen(const Outcome& o) {
  std::vector<float> v;
  for (const auto& l : o.logprobs) v.push_back(l.chosen.logprob);
  return v;
}

class KvQuantFamilyTest : public ::testing::TestWithParam<const char*> {};

TEST_P(KvQuantFamilyTest, EngineMatchesTheReferenceCodecPath) {
  const std::string family = GetParam();
  ThreadPool pool(2);
  auto model = load_model(model_dir(family), pool);
  ASSERT_TRUE(model.ok()) << model.error().to_string();
  const int32_t V = (*model)->config().vocab_size;
  const std::vector<int32_t> prompt = prompt_ids(V, kPrompt, 1);
  const Reference want = reference_run(**model, prompt);

  auto e = make_engine(family, pool, quant_options(kStart));
  ASSERT_NE(e, nullptr);
  const Outcome got = run(*e, greedy("a", prompt));
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(chosen(got), want.logprobs);
  EXPECT_GT(e->stats().kv_converted_blocks, 0);

  // Exact KV gives other numbers: the conversion took effect.
  auto exact = make_engine(family, pool, EngineOptions{});
  ASSERT_NE(exact, nullptr);
  EXPECT_NE(chosen(run(*exact, greedy("x", prompt))), want.logprobs);
}

TEST_P(KvQuantFamilyTest, SecondTurnStartsFromConvertedBlocks) {
  const std::string family = GetParam();
  ThreadPool pool(2);
  auto e = make_engine(family, pool, quant_options(kStart));
  auto fresh = make_engine(family, pool, quant_options(kStart));
  ASSERT_NE(e, nullptr);
  ASSERT_NE(fresh, nullptr);
  auto cfg = load_model_config(model_dir(family));
  ASSERT_TRUE(cfg.ok()) << cfg.error().to_string();
  const int32_t V = cfg->vocab_size;
  const std::vector<int32_t> prompt = prompt_ids(V, kPrompt, 2);
  const Outcome first = run(*e, greedy("t1", prompt));
  ASSERT_EQ(int32_t(first.tokens.size()), kGen);
  std::vector<int32_t> second = prompt;
  second.insert(second.end(), first.tokens.begin(), first.tokens.end());
  const std::vector<int32_t> more = prompt_ids(V, 9, 3);
  second.insert(second.end(), more.begin(), more.end());
  const Outcome turn = run(*e, greedy("t2", second));
  ASSERT_EQ(int32_t(turn.tokens.size()), kGen);
  // Past the first prompt's blocks where the window blocks of the decoded tokens (published
  // under the codec namespace) serve; recurrent state only where a snapshot was taken.
  const bool windows = family != "qwen35-tiny" && family != "llama3-tiny";
  if (windows || family == "llama3-tiny") {
    EXPECT_GT(turn.final.usage.cached_tokens, kPrompt / kBs * kBs) << family;
  } else {
    EXPECT_GT(turn.final.usage.cached_tokens, kStart) << family;
  }
  // The same two turns on another engine: the same tokens (the reuse is deterministic).
  const Outcome f1 = run(*fresh, greedy("f1", prompt));
  EXPECT_EQ(f1.tokens, first.tokens);
  const Outcome f2 = run(*fresh, greedy("f2", second));
  EXPECT_EQ(f2.tokens, turn.tokens);
  EXPECT_EQ(chosen(f2), chosen(turn));
}

INSTANTIATE_TEST_SUITE_P(Families, KvQuantFamilyTest,
                         ::testing::Values("llama3-tiny", "gemma3-tiny", "gemma4-tiny", "qwen35-tiny"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) c = (c == '-') ? '_' : c;
                           return s;
                         });

}  // namespace
}  // namespace strata
