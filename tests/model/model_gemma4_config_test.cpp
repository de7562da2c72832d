// gemma4_text config resolution: per-layer geometry (per_layer_config and the older
// global_head_dim / num_global_key_value_heads spelling), KV-sharing sources, and the errors
// a bad config.json gets (a value naming the key, never a crash).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "model/gemma4_config.h"
#include "model/model_config.h"

namespace strata {
namespace {

nlohmann::json base_config() {
  return nlohmann::json::parse(R"({
    "model_type": "gemma4_text", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 6,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "intermediate_size": 128,
    "hidden_activation": "gelu_pytorch_tanh", "sliding_window": 16, "max_position_embeddings": 4096,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
                    "sliding_attention", "sliding_attention", "full_attention"],
    "rope_parameters": {
      "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
      "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
    "hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": 512, "num_kv_shared_layers": 2,
    "per_layer_config": {"2": {"head_dim": 64}, "5": {"head_dim": 64}},
    "attention_k_eq_v": false, "enable_moe_block": false, "num_experts": null, "top_k_experts": null,
    "moe_intermediate_size": null, "final_logit_softcapping": null, "use_bidirectional_attention": null
  })");
}

Result<Gemma4TextConfig> parse(const nlohmann::json& j) {
  auto cfg = parse_model_config(j, "config.json");
  if (!cfg.ok()) return cfg.error();
  return parse_gemma4_text_config(*cfg);
}

TEST(Gemma4Config, ResolvesPerLayerGeometryAndSharing) {
  auto c = parse(base_config());
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  ASSERT_EQ(c->layers.size(), 6u);
  EXPECT_EQ(c->ple_dim, 16);
  EXPECT_EQ(c->ple_vocab, 512);
  EXPECT_FALSE(c->moe);
  const int head_dim[6] = {32, 32, 64, 32, 32, 64};
  const int source[6] = {-1, -1, -1, -1, 3, 2};
  for (int l = 0; l < 6; ++l) {
    EXPECT_EQ(c->layers[size_t(l)].head_dim, head_dim[l]) << l;
    EXPECT_EQ(c->layers[size_t(l)].kv_source, source[l]) << l;
    EXPECT_EQ(c->layers[size_t(l)].sliding, l != 2 && l != 5) << l;
    EXPECT_EQ(c->layers[size_t(l)].n_heads, 2) << l;
    EXPECT_EQ(c->layers[size_t(l)].n_kv_heads, 1) << l;
  }
}

TEST(Gemma4Config, OlderGlobalSpellingAndKEqV) {
  auto j = base_config();
  j.erase("per_layer_config");
  j["global_head_dim"] = 64;
  j["num_global_key_value_heads"] = 2;
  j["attention_k_eq_v"] = true;
  j["num_kv_shared_layers"] = 0;
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(c->layers[2].head_dim, 64);
  EXPECT_EQ(c->layers[2].n_kv_heads, 2);
  EXPECT_TRUE(c->layers[2].k_eq_v);
  EXPECT_EQ(c->layers[1].head_dim, 32);
  EXPECT_EQ(c->layers[1].n_kv_heads, 1);
  EXPECT_FALSE(c->layers[1].k_eq_v);
  for (const auto& g : c->layers) EXPECT_EQ(g.kv_source, -1);
}

TEST(Gemma4Config, MoeKeys) {
  auto j = base_config();
  j["enable_moe_block"] = true;
  j["num_experts"] = 4;
  j["top_k_experts"] = 2;
  j["moe_intermediate_size"] = 24;
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_TRUE(c->moe);
  EXPECT_EQ(c->top_k, 2);
  j["top_k_experts"] = 5;
  auto bad = parse(j);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("top_k_experts"), std::string::npos) << bad.error().message;
}

// Each bad value is an error naming its key.
TEST(Gemma4Config, BadValuesNameTheKey) {
  struct Case {
    const char* key;
    nlohmann::json value;
    const char* expect;
  };
  const Case cases[] = {
      {"num_kv_shared_layers", 6, "num_kv_shared_layers"},
      {"num_kv_shared_layers", -1, "num_kv_shared_layers"},
      {"num_kv_shared_layers", "two", "num_kv_shared_layers"},
      {"hidden_size_per_layer_input", -4, "hidden_size_per_layer_input"},
      {"attention_k_eq_v", "yes", "attention_k_eq_v"},
      {"per_layer_config", nlohmann::json::parse(R"({"2": {"head_dim": 63}})"), "head_dim"},
      {"per_layer_config", nlohmann::json::parse(R"({"2": {"head_dim": "big"}})"), "per_layer_config.2.head_dim"},
      {"per_layer_config", nlohmann::json::parse(R"({"2": {"num_key_value_heads": 3}})"), "num_key_value_heads"},
      {"per_layer_config", nlohmann::json::parse(R"([1, 2])"), "per_layer_config"},
      // Layer 5 (full) would share with layer 2 (head_dim 64) while itself having 32.
      {"per_layer_config", nlohmann::json::parse(R"({"2": {"head_dim": 64}})"), "per_layer_config"},
      {"use_bidirectional_attention", "all", "use_bidirectional_attention"},
  };
  for (const auto& c : cases) {
    auto j = base_config();
    j[c.key] = c.value;
    auto r = parse(j);
    ASSERT_FALSE(r.ok()) << c.key << " = " << c.value.dump();
    EXPECT_NE(r.error().message.find(c.expect), std::string::npos) << r.error().message;
  }
}

// With only full layers before the shared ones, a sliding shared layer has no source.
TEST(Gemma4Config, SharedLayerWithoutSourceIsAnError) {
  auto j = base_config();
  j["layer_types"] = {"full_attention", "full_attention", "full_attention",
                      "full_attention", "sliding_attention", "full_attention"};
  j.erase("per_layer_config");
  auto r = parse(j);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("num_kv_shared_layers"), std::string::npos) << r.error().message;
}

}  // namespace
}  // namespace strata
