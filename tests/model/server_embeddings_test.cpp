// Embeddings against the sentence-transformers oracle (tests/data/embedding/qwen3-embed-tiny,
// made by scripts/oracle/qwen3_embedding.py: a random-weight Qwen3 embedding checkpoint in
// the Qwen3-Embedding layout, its goldens from SentenceTransformer.encode on the CPU in f32).
// The server's request parsing tokenizes as the oracle's tokenizer did (instruction prompt
// and the appended <|endoftext|> included); the engine's pooled vectors agree within 1e-4
// (max-norm) in one batch with chunked prefill, again from the prefix cache, and truncated by
// `dimensions`; bad requests name their field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "../support/engine_test_support.h"
#include "model/model_config.h"
#include "model/pooling.h"
#include "server/embeddings.h"

namespace strata {
namespace {

using nlohmann::json;
using server::ApiError;

std::string embed_dir() { return std::string(STRATA_TEST_DATA) + "/embedding/qwen3-embed-tiny"; }

json goldens() {
  std::ifstream in(embed_dir() + "/embedding_goldens.json");
  return json::parse(in);
}

double max_norm_gap(const std::vector<float>& got, const std::vector<float>& ref) {
  EXPECT_EQ(got.size(), ref.size());
  double gap = 0.0, scale = 0.0;
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
    gap = std::max(gap, std::fabs(double(got[i]) - double(ref[i])));
    scale = std::max(scale, std::fabs(double(ref[i])));
  }
  return gap / scale;
}

class Embeddings : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cfg = load_model_config(embed_dir());
    ASSERT_TRUE(cfg.ok()) << cfg.error().to_string();
    auto served = server::load_served_model(embed_dir(), "qwen3-embed-tiny", *cfg, cfg->max_position);
    ASSERT_TRUE(served.ok()) << served.error().to_string();
    auto pooling = load_pooling_config(embed_dir());
    ASSERT_TRUE(pooling.ok()) << pooling.error().to_string();
    served_ = std::make_unique<server::ServedModel>(std::move(served).value());
    served_->embedding = true;
    served_->pooling = *pooling;
    served_->pooling.dimension = cfg->hidden;
  }

  std::optional<ApiError> parse(const json& body, server::EmbeddingsRequest* r) {
    return server::parse_embeddings_request(body, *served_, server::ParseLimits{{"qwen3-embed-tiny"}, 64}, r);
  }

  std::unique_ptr<Engine> engine(ThreadPool& pool, int32_t max_batch_tokens) {
    LoadOptions lo;
    lo.hidden_output = true;
    auto m = load_model(embed_dir(), pool, lo);
    EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().to_string());
    if (!m.ok()) return nullptr;
    EngineOptions o;
    o.kv_blocks = 256;
    o.block_size = 4;
    o.max_batch_tokens = max_batch_tokens;
    auto e = test::start_engine(std::move(m).value(), o, "qwen3-embed-tiny");
    if (e) served_->max_model_len = e->max_model_len();
    return e;
  }

  std::unique_ptr<server::ServedModel> served_;
};

TEST_F(Embeddings, PoolingConfigComesFromTheSentenceTransformersModules) {
  const PoolingConfig& p = served_->pooling;
  EXPECT_TRUE(p.present);
  EXPECT_TRUE(p.normalize);
  ASSERT_EQ(p.prompts.count("query"), 1u);
  EXPECT_EQ(p.prompts.at("query"), goldens()["query_prompt"].get<std::string>());
  EXPECT_TRUE(p.default_prompt_name.empty());
  auto none = load_pooling_config(test::model_dir("qwen3-tiny"));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->present);
}

TEST_F(Embeddings, TokenizationMatchesTheOracle) {
  for (const json& c : goldens()["cases"]) {
    json body = {{"input", c["text"]}};
    if (!c["prompt_name"].is_null()) body["prompt_name"] = c["prompt_name"];
    server::EmbeddingsRequest r;
    auto e = parse(body, &r);
    ASSERT_FALSE(e) << e->message;
    ASSERT_EQ(r.inputs.size(), 1u);
    EXPECT_EQ(r.inputs[0], c["input_ids"].get<std::vector<int32_t>>()) << c["text"];
    EXPECT_EQ(r.prompt_tokens, int32_t(c["input_ids"].size()));
  }
}

TEST_F(Embeddings, BatchedVectorsMatchTheOracleAndAgainFromThePrefixCache) {
  ThreadPool pool(2);
  auto e = engine(pool, /*max_batch_tokens=*/24);  // the 84-token input prefills in chunks
  ASSERT_TRUE(e);
  const json g = goldens();
  // Every case in one request per prompt name: the scheduler batches them.
  for (const char* name : {"", "query"}) {
    std::vector<std::string> texts;
    std::vector<std::vector<float>> refs;
    for (const json& c : g["cases"]) {
      if ((c["prompt_name"].is_null() ? std::string() : c["prompt_name"].get<std::string>()) != name) continue;
      texts.push_back(c["text"]);
      refs.push_back(c["embedding"].get<std::vector<float>>());
    }
    ASSERT_EQ(texts.size(), 5u);
    json body = {{"input", texts}};
    if (*name) body["prompt_name"] = name;
    server::EmbeddingsRequest r;
    ASSERT_FALSE(parse(body, &r));
    for (int wave = 0; wave < 2; ++wave) {
      std::vector<std::vector<float>> vectors;
      Usage usage;
      auto err = server::run_embeddings(*e, *served_, r, std::string("t") + name + std::to_string(wave), nullptr, &vectors, &usage);
      ASSERT_FALSE(err) << err->message;
      ASSERT_EQ(vectors.size(), refs.size());
      for (size_t i = 0; i < refs.size(); ++i) {
        EXPECT_LE(max_norm_gap(vectors[i], refs[i]), 1e-4) << "prompt '" << name << "' input " << i << " wave " << wave;
        double ss = 0.0;
        for (float x : vectors[i]) ss += double(x) * x;
        EXPECT_NEAR(ss, 1.0, 1e-5);
      }
      EXPECT_EQ(usage.prompt_tokens, r.prompt_tokens);
      if (wave == 1) EXPECT_GT(usage.cached_tokens, 0) << "the repeat reads its prompts' blocks from the prefix cache";
    }
  }
}

TEST_F(Embeddings, DimensionsTruncateThenNormalize) {
  ThreadPool pool(2);
  auto e = engine(pool, 64);
  ASSERT_TRUE(e);
  for (const json& c : goldens()["dimensions_cases"]) {
    server::EmbeddingsRequest r;
    ASSERT_FALSE(parse({{"input", c["text"]}, {"dimensions", c["dimensions"]}}, &r));
    std::vector<std::vector<float>> vectors;
    Usage usage;
    ASSERT_FALSE(server::run_embeddings(*e, *served_, r, "dims", nullptr, &vectors, &usage));
    ASSERT_EQ(vectors.size(), 1u);
    EXPECT_EQ(vectors[0].size(), c["dimensions"].get<size_t>());
    EXPECT_LE(max_norm_gap(vectors[0], c["embedding"].get<std::vector<float>>()), 1e-4);
  }
}

TEST_F(Embeddings, TokenIdInputAndBase64) {
  ThreadPool pool(2);
  auto e = engine(pool, 64);
  ASSERT_TRUE(e);
  const json c = goldens()["cases"][0];
  server::EmbeddingsRequest r;
  ASSERT_FALSE(parse({{"input", json::array({c["input_ids"], c["input_ids"]})}, {"encoding_format", "base64"}}, &r));
  ASSERT_EQ(r.inputs.size(), 2u);
  std::vector<std::vector<float>> vectors;
  Usage usage;
  ASSERT_FALSE(server::run_embeddings(*e, *served_, r, "ids", nullptr, &vectors, &usage));
  const json body = server::embeddings_response(r, vectors, "qwen3-embed-tiny");
  EXPECT_EQ(body["object"], "list");
  EXPECT_EQ(body["usage"]["prompt_tokens"], r.prompt_tokens);
  ASSERT_EQ(body["data"].size(), 2u);
  EXPECT_EQ(body["data"][1]["index"], 1);
  // Decode the base64 little-endian f32 and compare with the oracle.
  const std::string b64 = body["data"][0]["embedding"].get<std::string>();
  auto val = [](char ch) -> int {
    if (ch >= 'A' && ch <= 'Z') return ch - 'A';
    if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9') return ch - '0' + 52;
    return ch == '+' ? 62 : ch == '/' ? 63 : -1;
  };
  std::string bytes;
  for (size_t i = 0; i + 3 < b64.size(); i += 4) {
    uint32_t t = 0;
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const int v = val(b64[i + size_t(k)]);
      if (v < 0) ++pad;
      t = (t << 6) | uint32_t(std::max(v, 0));
    }
    bytes += char(t >> 16);
    if (pad < 2) bytes += char((t >> 8) & 0xff);
    if (pad < 1) bytes += char(t & 0xff);
  }
  ASSERT_EQ(bytes.size(), 64u * 4u);
  std::vector<float> decoded(64);
  std::memcpy(decoded.data(), bytes.data(), bytes.size());
  EXPECT_EQ(decoded, vectors[0]);
  EXPECT_LE(max_norm_gap(decoded, c["embedding"].get<std::vector<float>>()), 1e-4);
}

TEST_F(Embeddings, BadInputNamesTheField) {
  struct Case {
    json body;
    std::string param;
  };
  const std::vector<Case> cases = {
      {json::object(), "input"},
      {{{"input", ""}}, "input"},
      {{{"input", json::array()}}, "input"},
      {{{"input", 5}}, "input"},
      {{{"input", {"a", 3}}}, "input[1]"},
      {{{"input", {"a", ""}}}, "input[1]"},
      {{{"input", {1, 99999}}}, "input"},
      {{{"input", {{1, 2}, {-1}}}}, "input[1]"},
      {{{"input", "a"}, {"encoding_format", "int8"}}, "encoding_format"},
      {{{"input", "a"}, {"dimensions", 0}}, "dimensions"},
      {{{"input", "a"}, {"dimensions", 65}}, "dimensions"},
      {{{"input", "a"}, {"dimensions", "8"}}, "dimensions"},
      {{{"input", "a"}, {"prompt_name", "passage"}}, "prompt_name"},
      {{{"input", "a"}, {"prompt_name", "query"}, {"prompt", "x"}}, "prompt"},
      {{{"input", {1, 2}}, {"prompt_name", "query"}}, "prompt_name"},
      {{{"input", "a"}, {"model", "other"}}, "model"},
      {{{"input", "a"}, {"temperature", 1}}, "temperature"},
      {{{"input", std::string(2000, 'x')}}, "input"},  // past max_model_len
      {{{"input", std::vector<std::string>(server::kMaxEmbeddingInputs + 1, "a")}}, "input"},
  };
  for (const Case& c : cases) {
    server::EmbeddingsRequest r;
    auto e = parse(c.body, &r);
    ASSERT_TRUE(e) << c.body.dump();
    EXPECT_EQ(e->param, c.param) << c.body.dump() << ": " << e->message;
    EXPECT_GE(e->status, 400);
    EXPECT_LT(e->status, 500);
  }
  served_->embedding = false;
  server::EmbeddingsRequest r;
  auto e = parse({{"input", "a"}}, &r);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("--task embed"), std::string::npos) << e->message;
}

TEST_F(Embeddings, TheEngineKeepsGenerationAndEmbeddingApart) {
  ThreadPool pool(2);
  auto e = engine(pool, 64);
  ASSERT_TRUE(e);
  GenerationRequest g;
  g.id = "gen";
  g.prompt = {1, 2, 3};
  auto s = e->submit(g);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("embeddings"), std::string::npos) << s.error().message;
  auto gen = test::make_engine("qwen3-tiny", pool, EngineOptions{});
  ASSERT_TRUE(gen);
  g.embed = true;
  auto s2 = gen->submit(g);
  ASSERT_FALSE(s2.ok());
  EXPECT_NE(s2.error().message.find("--task embed"), std::string::npos) << s2.error().message;
}

TEST(PoolEmbedding, TruncatesNormalizesAndKeepsZero) {
  const std::vector<float> h = {3.0f, 4.0f, 12.0f};
  EXPECT_EQ(server::pool_embedding(h, 0, false), h);
  const auto n = server::pool_embedding(h, 2, true);
  ASSERT_EQ(n.size(), 2u);
  EXPECT_FLOAT_EQ(n[0], 0.6f);
  EXPECT_FLOAT_EQ(n[1], 0.8f);
  EXPECT_EQ(server::pool_embedding({0.0f, 0.0f}, 0, true), (std::vector<float>{0.0f, 0.0f}));
}

}  // namespace
}  // namespace strata
