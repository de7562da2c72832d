// The engine with per-layer KV codecs (EngineOptions::kv_codecs) on qwen3-tiny and the trained
// strata-demo model: every codec gives valid generations, and teacher-forced prompt logprobs
// equal to those of a single-sequence cache in the codec and near the exact cache's; a codec
// with smaller rows gives more blocks for the same kv_cache_bytes; 32 concurrent requests produce the tokens each produces alone; prefix-cache
// namespaces differ per codec, and blocks a disk tier holds under one codec are never served
// to an engine under another; a per-layer --kv-config file mixes codecs; bad configs are
// refused naming the flag and value.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "../support/engine_test_support.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "golden_cases.h"
#include "model/registry.h"
#include "model/single_sequence.h"
#include "sampling/logprobs.h"
#include "tokenizer/tokenizer.h"

namespace strata {
namespace {

using namespace strata::test;

namespace fs = std::filesystem;

const char* const kCodecNames[] = {"auto", "bf16", "fp8", "int8", "int4", "turbo"};

KvCodecConfig config_of(const std::string& dtype) {
  auto c = make_kv_codec_config(dtype, "");
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().to_string());
  return c.ok() ? *c : KvCodecConfig{};
}

GenerationRequest request(int i, int32_t n_prompt, int32_t max_tokens, bool greedy, int32_t vocab) {
  GenerationRequest r;
  r.id = "req-" + std::to_string(i);
  for (int32_t k = 0; k < n_prompt; ++k) r.prompt.push_back(int32_t(3 + mix(uint64_t(i) * 7919 + uint64_t(k)) % uint64_t(vocab - 3)));
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  if (greedy) {
    r.sampling.temperature = 0.0f;
  } else {
    r.sampling.temperature = 0.8f;
    r.sampling.top_p = 0.9f;
    r.sampling.seed = uint64_t(1000 + i);
    r.sampling.has_seed = true;
  }
  return r;
}

struct Case {
  const char* model;
  const char* codec;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string s = std::string(info.param.model) + "_" + info.param.codec;
  for (char& c : s) c = (c == '-') ? '_' : c;
  return s;
}

class EngineCodecTest : public ::testing::TestWithParam<Case> {};

TEST_P(EngineCodecTest, ValidOutputAndBlocksFollowTheRowBytes) {
  const Case c = GetParam();
  ThreadPool pool(2);
  auto m = load_model(model_dir(c.model), pool);
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  const KvCodecConfig config = config_of(c.codec);
  auto layout = resolve_kv_layout(**m, config);
  ASSERT_TRUE(layout.ok()) << layout.error().to_string();
  auto exact_layout = resolve_kv_layout(**m, KvCodecConfig{});
  ASSERT_TRUE(exact_layout.ok());
  const int64_t bpt = KvStorage::bytes_per_token(*layout);
  const int64_t exact_bpt = KvStorage::bytes_per_token(*exact_layout);
  if (std::string(c.codec) == "auto") {
    EXPECT_EQ(bpt, exact_bpt);
  } else {
    EXPECT_LT(bpt, exact_bpt);
  }

  EngineOptions o;
  o.kv_cache_bytes = int64_t(4) << 20;
  o.kv_codecs = config;
  auto engine = make_engine(c.model, pool, o);
  ASSERT_TRUE(engine);
  EXPECT_EQ(engine->kv_bytes_per_token(), bpt);
  // No sliding-window layers: the whole budget is full-attention blocks in the codec's rows.
  EXPECT_EQ(int64_t(engine->n_kv_blocks()), o.kv_cache_bytes / (bpt * engine->block_size()));
  if (std::string(c.codec) != "auto") {
    EXPECT_GT(int64_t(engine->n_kv_blocks()), o.kv_cache_bytes / (exact_bpt * engine->block_size()));
  }

  // Valid generations for a few prompts batched together.
  const int32_t vocab = engine->model_config().vocab_size;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int k = 0; k < 4; ++k) {
    auto s = engine->submit(request(100 + k, 20 + 30 * k, 12, true, vocab));
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    streams.push_back(*s);
  }
  for (auto& st : streams) {
    const Outcome out = drain(*st);
    EXPECT_EQ(out.final.finish_reason, FinishReason::kLength);
    ASSERT_EQ(out.tokens.size(), 12u);
    for (int32_t id : out.tokens) EXPECT_TRUE(id >= 0 && id < vocab) << id;
  }
}

TEST_P(EngineCodecTest, ConcurrentRequestsProduceTheTokensTheyProduceAlone) {
  const Case c = GetParam();
  ThreadPool pool(2);
  EngineOptions o;
  o.kv_blocks = 200;
  o.max_batch_tokens = 96;  // chunked prefill mixed with decodes
  o.kv_codecs = config_of(c.codec);
  auto engine = make_engine(c.model, pool, o);
  ASSERT_TRUE(engine);
  const int32_t vocab = engine->model_config().vocab_size;
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 32; ++i) reqs.push_back(request(i, 1 + int32_t(mix(uint64_t(i)) % 120), 4 + i % 7, i % 2 == 0, vocab));
  std::map<std::string, std::vector<int32_t>> alone;
  {
    // Alone, without the prefix cache: each request's tokens from a cold engine state.
    EngineOptions solo = o;
    solo.prefix_caching = false;
    auto e = make_engine(c.model, pool, solo);
    ASSERT_TRUE(e);
    for (const auto& r : reqs) alone[r.id] = run(*e, r).tokens;
  }
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& r : reqs) {
    auto s = engine->submit(r);
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    streams.push_back(*s);
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Outcome out = drain(*streams[i]);
    EXPECT_EQ(out.tokens.size(), size_t(reqs[i].max_tokens));
    EXPECT_EQ(out.tokens, alone[reqs[i].id]) << reqs[i].id;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, EngineCodecTest,
    ::testing::Values(Case{"qwen3-tiny", "auto"}, Case{"qwen3-tiny", "bf16"}, Case{"qwen3-tiny", "fp8"},
                      Case{"qwen3-tiny", "int8"}, Case{"qwen3-tiny", "int4"}, Case{"qwen3-tiny", "turbo"},
                      Case{"strata-demo", "auto"}, Case{"strata-demo", "bf16"}, Case{"strata-demo", "fp8"},
                      Case{"strata-demo", "int8"}, Case{"strata-demo", "int4"}, Case{"strata-demo", "turbo"}),
    case_name);

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Teacher-forced over 256 tokens of the repository's LICENSE with the trained strata-demo
// model: the engine's prompt logprobs (paged over the codec pools in chunks of 64 tokens) are
// those of a single-sequence cache in the same codec, and the mean negative log-likelihood
// stays near the exact cache's.
TEST(EngineCodec, PromptLogprobsMatchTheCodecsCacheAndStayNearExact) {
  ThreadPool pool(2);
  const std::string dir = model_dir("strata-demo");
  auto tok = tokenizer::Tokenizer::load(dir);
  ASSERT_TRUE(tok.ok()) << tok.error().to_string();
  auto ids = tok->encode(read_text(std::string(STRATA_SOURCE_DIR) + "/LICENSE"), false);
  ASSERT_TRUE(ids.ok());
  ASSERT_GE(ids->size(), 256u);
  const std::vector<int32_t> text(ids->begin(), ids->begin() + 256);
  auto m = load_model(dir, pool);
  ASSERT_TRUE(m.ok());
  const int32_t V = (*m)->config().vocab_size;

  std::map<std::string, double> nll;
  for (const char* codec : kCodecNames) {
    SCOPED_TRACE(codec);
    const KvCodecConfig config = config_of(codec);
    EngineOptions o;
    o.kv_blocks = 64;
    o.max_batch_tokens = 64;
    o.kv_codecs = config;
    auto engine = make_engine("strata-demo", pool, o);
    ASSERT_TRUE(engine);
    GenerationRequest r;
    r.id = std::string("lp-") + codec;
    r.prompt = text;
    r.max_tokens = 1;
    r.prompt_logprobs = true;
    r.logprobs = 0;
    r.sampling.temperature = 0.0f;
    auto s = engine->submit(r);
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    std::vector<TokenLogprobs> lp;
    for (;;) {
      auto e = (*s)->next(std::chrono::seconds(300));
      ASSERT_TRUE(e);
      if (!e->prompt_logprobs.empty()) lp = e->prompt_logprobs;
      if (e->final) break;
    }
    ASSERT_EQ(lp.size(), text.size() - 1);

    auto layout = resolve_kv_layout(**m, config);
    ASSERT_TRUE(layout.ok());
    SingleSequence seq(**m, int32_t(text.size()), 16, *layout);
    auto logits = seq.prefill(text, /*want_all_logits=*/true);
    ASSERT_TRUE(logits.ok());
    double sum = 0, max_diff = 0;
    for (size_t i = 0; i + 1 < text.size(); ++i) {
      TokenLogprobs ref;
      ASSERT_TRUE(compute_logprobs(logits->data() + i * size_t(V), V, text[i + 1], 0, &ref).ok());
      EXPECT_EQ(lp[i].chosen.token, text[i + 1]);
      max_diff = std::max(max_diff, std::fabs(double(lp[i].chosen.logprob) - ref.chosen.logprob));
      sum -= lp[i].chosen.logprob;
    }
    EXPECT_LT(max_diff, 1e-3);
    nll[codec] = sum / double(lp.size());
    std::printf("%-6s mean NLL %.5f nats, max |engine - single sequence| %.2e\n", codec, nll[codec], max_diff);
  }
  const double exact = nll["auto"];
  EXPECT_LT(exact, std::log(double(V)) - 2.0);  // the trained model reads the text far better than chance
  for (const char* codec : {"bf16", "int8"}) EXPECT_NEAR(nll[codec], exact, 0.005) << codec;
  EXPECT_NEAR(nll["fp8"], exact, 0.03);
  for (const char* codec : {"int4", "turbo"}) EXPECT_NEAR(nll[codec], exact, 0.1) << codec;
}

TEST(EngineCodec, PrefixNamespacesDifferPerCodec) {
  ThreadPool pool(2);
  std::set<std::string> seen;
  for (const char* codec : kCodecNames) {
    EngineOptions o;
    o.kv_blocks = 64;
    o.kv_codecs = config_of(codec);
    auto e = make_engine("qwen3-tiny", pool, o);
    ASSERT_TRUE(e);
    EXPECT_TRUE(seen.insert(e->prefix_namespace()).second) << codec << ": " << e->prefix_namespace();
    // The same config gives the same namespace (prefix hits across restarts stay possible).
    auto again = make_engine("qwen3-tiny", pool, o);
    ASSERT_TRUE(again);
    EXPECT_EQ(again->prefix_namespace(), e->prefix_namespace());
  }
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("strata_engine_codec_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

KvTierStats tier_stats(Engine& e, const std::function<bool(const KvTierStats&)>& ready) {
  KvTierStats s;
  for (int i = 0; i < 100; ++i) {
    s = e.stats().kv_tiers;
    if (ready(s)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return s;
}

// Blocks written down under one codec reach another engine only under the same codec: an
// int8 engine over the directory auto filled recomputes the prompt (and gets int8's tokens),
// a second int8 engine is served the first int8 engine's blocks.
TEST(EngineCodec, PrefixHitsNeverCrossCodecs) {
  ThreadPool pool(2);
  const fs::path dir = fresh_dir("cross");
  const int32_t vocab = [&] {
    auto m = load_model(model_dir("qwen3-tiny"), pool);
    return m.ok() ? (*m)->config().vocab_size : 0;
  }();
  ASSERT_GT(vocab, 3);
  auto opts = [&](const char* codec) {
    EngineOptions o;
    o.kv_blocks = 64;
    o.kv_codecs = config_of(codec);
    o.kv_disk_dir = dir.string();
    o.kv_disk_bytes = int64_t(1) << 30;
    return o;
  };
  const GenerationRequest a = request(1, 200, 8, true, vocab);
  std::vector<int32_t> int8_cold;
  {
    EngineOptions o = opts("int8");
    o.kv_disk_dir.clear();
    auto e = make_engine("qwen3-tiny", pool, o);
    ASSERT_TRUE(e);
    int8_cold = run(*e, a).tokens;
  }
  {
    auto e = make_engine("qwen3-tiny", pool, opts("auto"));
    ASSERT_TRUE(e);
    EXPECT_EQ(run(*e, a).final.usage.cached_tokens, 0);
    e->shutdown();  // writes the pool's cached blocks down
  }
  {
    auto e = make_engine("qwen3-tiny", pool, opts("int8"));
    ASSERT_TRUE(e);
    const Outcome out = run(*e, a);
    EXPECT_EQ(out.final.usage.cached_tokens, 0);
    EXPECT_EQ(out.tokens, int8_cold);
    const auto s = tier_stats(*e, [](const KvTierStats&) { return false; });
    EXPECT_EQ(s.disk_hit_blocks, 0);
    e->shutdown();
  }
  {
    auto e = make_engine("qwen3-tiny", pool, opts("int8"));
    ASSERT_TRUE(e);
    auto again = a;
    again.id = "int8-again";
    const Outcome out = run(*e, again);
    EXPECT_GE(out.final.usage.cached_tokens, 192);
    EXPECT_EQ(out.tokens, int8_cold);
    const auto s = tier_stats(*e, [](const KvTierStats& t) { return t.disk_hit_blocks > 0; });
    EXPECT_GE(s.disk_hit_blocks, 12);
  }
  fs::remove_all(dir);
}

// A --kv-config file (MLX's {layer_idx, bits, group_size} and the named form mixed) over an
// int8 default: each layer gets its own codec, the pool follows their bytes, and the output is
// valid.
TEST(EngineCodec, PerLayerConfigFileMixesCodecs) {
  ThreadPool pool(2);
  const fs::path file = fs::temp_directory_path() / ("strata_engine_codec_layers_" + std::to_string(::getpid()) + ".json");
  {
    std::ofstream f(file);
    f << R"([{"layer_idx": 0, "bits": 4, "group_size": 32}, {"layer_idx": 1, "bits": 4, "group_size": 64},
             {"layer_idx": 3, "codec": "turbo"}])";
  }
  auto config = make_kv_codec_config("int8", file.string());
  fs::remove(file);
  ASSERT_TRUE(config.ok()) << config.error().to_string();
  auto m = load_model(model_dir("strata-demo"), pool);
  ASSERT_TRUE(m.ok());
  const int32_t n_layers = (*m)->config().n_layers;
  ASSERT_GE(n_layers, 4);
  int64_t expected = 0, all_int8 = 0;
  const std::vector<KvLayerSpec> base = (*m)->kv_layout();
  for (size_t l = 0; l < base.size(); ++l) {
    KvLayerSpec s = base[l];
    s.codec = {KvCodec::kInt8, kv_default_group(KvCodec::kInt8, s.head_dim_k)};
    all_int8 += KvStorage::layer_bytes_per_token(s);
    if (l == 0) s.codec = {KvCodec::kInt4, 32};
    if (l == 1) s.codec = {KvCodec::kInt4, 64};
    if (l == 3) s.codec = {KvCodec::kTurbo, kv_default_group(KvCodec::kTurbo, s.head_dim_k)};
    expected += KvStorage::layer_bytes_per_token(s);
  }
  EXPECT_LT(expected, all_int8);

  EngineOptions o;
  o.kv_cache_bytes = int64_t(4) << 20;
  o.kv_codecs = *config;
  auto engine = make_engine("strata-demo", pool, o);
  ASSERT_TRUE(engine);
  EXPECT_EQ(engine->kv_bytes_per_token(), expected);
  EXPECT_EQ(int64_t(engine->n_kv_blocks()), o.kv_cache_bytes / (expected * engine->block_size()));
  EngineOptions plain = o;
  plain.kv_codecs = config_of("int8");
  auto int8_engine = make_engine("strata-demo", pool, plain);
  ASSERT_TRUE(int8_engine);
  EXPECT_NE(engine->prefix_namespace(), int8_engine->prefix_namespace());

  const int32_t vocab = engine->model_config().vocab_size;
  const Outcome out = run(*engine, request(7, 90, 10, true, vocab));
  EXPECT_EQ(out.final.finish_reason, FinishReason::kLength);
  ASSERT_EQ(out.tokens.size(), 10u);
  for (int32_t id : out.tokens) EXPECT_TRUE(id >= 0 && id < vocab) << id;
}

TEST(EngineCodec, BadConfigsAreRefusedNamingTheFlagAndValue) {
  ThreadPool pool(2);
  auto create = [&](const KvCodecConfig& config) -> Error {
    auto m = load_model(model_dir("qwen3-tiny"), pool);
    EXPECT_TRUE(m.ok());
    EngineOptions o;
    o.kv_blocks = 64;
    o.kv_codecs = config;
    auto e = Engine::create(std::move(m).value(), o);
    EXPECT_FALSE(e.ok());
    return e.ok() ? Error{} : e.error();
  };
  const int32_t n_layers = [&] {
    auto m = load_model(model_dir("qwen3-tiny"), pool);
    return m.ok() ? (*m)->config().n_layers : 0;
  }();
  ASSERT_GT(n_layers, 0);

  KvCodecConfig missing_layer;
  missing_layer.layers.push_back({n_layers, {KvCodec::kInt4, 0}});
  Error e = create(missing_layer);
  EXPECT_EQ(e.code, ErrorCode::kInvalidArgument);
  EXPECT_NE(e.message.find("--kv-config"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find(std::to_string(n_layers)), std::string::npos) << e.message;

  KvCodecConfig bad_group;
  bad_group.default_spec = {KvCodec::kInt8, 3};
  e = create(bad_group);
  EXPECT_EQ(e.code, ErrorCode::kInvalidArgument);
  EXPECT_NE(e.message.find("--kv-cache-dtype"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("int8/3"), std::string::npos) << e.message;

  KvCodecConfig quant_start;
  quant_start.default_spec = {KvCodec::kInt4, 0};
  quant_start.quant_start = -256;
  e = create(quant_start);
  EXPECT_EQ(e.code, ErrorCode::kInvalidArgument);
  EXPECT_NE(e.message.find("--kv-quant-start must be >= 0, got -256"), std::string::npos) << e.message;
}

}  // namespace
}  // namespace strata
