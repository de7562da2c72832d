// config.json / generation_config.json parsing across transformers 4 and 5 spellings.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/model_config.h"

namespace strata {
namespace {

using nlohmann::json;

const std::string kModels = std::string(STRATA_TEST_DATA) + "/reference/models";

json base() {
  return json{{"model_type", "llama"}, {"vocab_size", 32}, {"hidden_size", 16}, {"num_hidden_layers", 2},
              {"num_attention_heads", 4}, {"max_position_embeddings", 128}};
}

TEST(ModelConfig, Transformers5RopeParameters) {
  auto c = load_model_config(kModels + "/llama3-tiny");
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(c->rope.type, "llama3");
  EXPECT_DOUBLE_EQ(c->rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(c->rope.factor, 8.0);
  EXPECT_EQ(c->rope.original_max_position, 64);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->n_kv_heads, 2);
  EXPECT_FALSE(c->tie_embeddings);
  EXPECT_EQ(c->eos_ids, std::vector<int32_t>{2});
  EXPECT_EQ(c->bos_id, 1);
}

TEST(ModelConfig, LegacyRopeThetaAndScaling) {
  auto m = load_model_config(kModels + "/mistral-tiny");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->rope.type, "default");
  EXPECT_DOUBLE_EQ(m->rope.theta, 1000000.0);
  EXPECT_EQ(m->dtype, "bfloat16");
  auto y = load_model_config(kModels + "/qwen3yarn-tiny");
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(y->rope.type, "yarn");
  EXPECT_DOUBLE_EQ(y->rope.theta, 1000000.0);
  EXPECT_DOUBLE_EQ(y->rope.factor, 4.0);
  EXPECT_EQ(y->rope.original_max_position, 32);
  json c = base();
  c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  auto l = parse_model_config(c, "config.json");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->rope.type, "linear");
  EXPECT_DOUBLE_EQ(l->rope.factor, 2.0);
}

TEST(ModelConfig, PerLayerTypeRope) {
  auto c = load_model_config(kModels + "/gemma3-tiny");
  ASSERT_TRUE(c.ok());
  EXPECT_DOUBLE_EQ(c->rope_for("sliding_attention").theta, 10000.0);
  EXPECT_DOUBLE_EQ(c->rope_for("full_attention").theta, 1000000.0);
  EXPECT_TRUE(c->is_sliding(0));
  EXPECT_FALSE(c->is_sliding(2));
  EXPECT_EQ(c->sliding_window, 16);
  EXPECT_FLOAT_EQ(c->final_softcap, 30.0f);
  EXPECT_FLOAT_EQ(c->attn_softcap, 0.0f);
  EXPECT_FLOAT_EQ(c->query_pre_attn_scalar, 32.0f);
  EXPECT_EQ(c->hidden_act, "gelu_pytorch_tanh");
  auto g4 = load_model_config(kModels + "/gemma4-tiny");
  ASSERT_TRUE(g4.ok());
  EXPECT_EQ(g4->rope_for("full_attention").type, "proportional");
  EXPECT_DOUBLE_EQ(g4->rope_for("full_attention").partial_rotary_factor, 0.25);
}

TEST(ModelConfig, PartialRotaryTopLevel) {
  json c = base();
  c["partial_rotary_factor"] = 0.5;
  c["rope_theta"] = 5000.0;
  auto r = parse_model_config(c, "config.json");
  ASSERT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(r->rope.partial_rotary_factor, 0.5);
  EXPECT_DOUBLE_EQ(r->rope.theta, 5000.0);
  auto n = load_model_config(kModels + "/qwen3next-tiny");
  ASSERT_TRUE(n.ok());
  EXPECT_DOUBLE_EQ(n->rope.partial_rotary_factor, 0.25);
}

TEST(ModelConfig, ExpertCountSpellings) {
  auto a = load_model_config(kModels + "/qwen3moe-tiny");  // num_local_experts
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->n_experts, 8);
  EXPECT_EQ(a->n_experts_per_tok, 2);
  EXPECT_TRUE(a->norm_topk_prob);
  auto b = load_model_config(kModels + "/qwen3next-tiny");  // num_experts
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->n_experts, 4);
}

TEST(ModelConfig, MultimodalWrapper) {
  auto c = load_model_config(kModels + "/gemma3mm-tiny");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->wrapper_type, "gemma3");
  EXPECT_EQ(c->model_type, "gemma3_text");
  EXPECT_EQ(c->n_layers, 2);
  EXPECT_TRUE(c->tie_embeddings);
  EXPECT_FLOAT_EQ(c->final_softcap, 0.0f);
}

TEST(ModelConfig, GenerationConfig) {
  auto c = parse_model_config(base(), "config.json");
  ASSERT_TRUE(c.ok());
  json g = {{"eos_token_id", {7, 9}}, {"bos_token_id", 3}, {"temperature", 0.6}, {"top_p", 0.9}, {"top_k", 20},
            {"do_sample", true}, {"repetition_penalty", 1.1}};
  ASSERT_TRUE(apply_generation_config(g, "generation_config.json", &*c).ok());
  EXPECT_EQ(c->eos_ids, (std::vector<int32_t>{7, 9}));
  EXPECT_EQ(c->bos_id, 3);
  EXPECT_FLOAT_EQ(c->default_temperature, 0.6f);
  EXPECT_FLOAT_EQ(c->default_top_p, 0.9f);
  EXPECT_EQ(c->default_top_k, 20);
  EXPECT_EQ(c->default_do_sample, 1);
  EXPECT_FLOAT_EQ(c->default_repetition_penalty, 1.1f);
  auto bad = apply_generation_config(json{{"eos_token_id", "x"}}, "generation_config.json", &*c);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("eos_token_id"), std::string::npos);
}

TEST(ModelConfig, ErrorsNameTheField) {
  json c = base();
  c["num_key_value_heads"] = 3;
  auto r = parse_model_config(c, "config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("num_key_value_heads"), std::string::npos);
  c = base();
  c["rope_parameters"] = {{"rope_type", "longrope2"}, {"rope_theta", 1.0}};
  r = parse_model_config(c, "config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("longrope2"), std::string::npos);
  c = base();
  c["hidden_size"] = "big";
  r = parse_model_config(c, "config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("hidden_size"), std::string::npos);
  c = base();
  c["layer_types"] = {"full_attention"};
  r = parse_model_config(c, "config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("layer_types"), std::string::npos);
}

}  // namespace
}  // namespace strata
