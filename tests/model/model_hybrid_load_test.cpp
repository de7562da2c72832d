// Loading the gated-DeltaNet hybrids: cache layouts, the older full_attention_interval
// config form, and configs that must fail with an error naming the key (never a crash).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>

#include "core/thread_pool.h"
#include "model/registry.h"
#include "model/single_sequence.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

std::string tiny(const std::string& name) { return std::string(STRATA_TEST_DATA) + "/reference/models/" + name; }

// A copy of a tiny model directory whose config.json went through `edit`; removed on exit.
class EditedModel {
 public:
  template <class Fn>
  EditedModel(const std::string& name, Fn edit) {
    dir_ = fs::temp_directory_path() / ("strata_hybrid_" + name + "_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(counter_++));
    fs::create_directories(dir_);
    for (const auto& e : fs::directory_iterator(tiny(name))) fs::copy(e.path(), dir_ / e.path().filename());
    nlohmann::json cfg;
    std::ifstream(dir_ / "config.json") >> cfg;
    edit(cfg);
    std::ofstream(dir_ / "config.json") << cfg.dump(2);
  }
  ~EditedModel() { fs::remove_all(dir_); }
  std::string dir() const { return dir_.string(); }

 private:
  fs::path dir_;
  static inline int counter_ = 0;
};

TEST(HybridLoad, CacheLayoutsFollowLayerTypes) {
  ThreadPool pool(1);
  for (const char* name : {"qwen3next-tiny", "qwen35-tiny", "qwen35moe-tiny"}) {
    auto m = load_model(tiny(name), pool);
    ASSERT_TRUE(m.ok()) << m.error().to_string();
    const auto kv = (*m)->kv_layout();
    const auto st = (*m)->state_layout();
    ASSERT_EQ(kv.size(), 4u);
    ASSERT_EQ(st.size(), 4u);
    for (int l = 0; l < 3; ++l) {  // linear attention: state, no KV
      EXPECT_FALSE(kv[size_t(l)].has_kv) << name << " layer " << l;
      EXPECT_TRUE(st[size_t(l)].has_state);
      EXPECT_EQ(st[size_t(l)].conv_floats, 3 * (2 * 2 * 16 + 4 * 16));  // (kernel - 1) x conv channels
      EXPECT_EQ(st[size_t(l)].recurrent_floats, 4 * 16 * 16);         // value heads x d_k x d_v
    }
    EXPECT_TRUE(kv[3].has_kv);  // full attention: KV, no state
    EXPECT_EQ(kv[3].n_kv_heads, 2);
    EXPECT_EQ(kv[3].head_dim_k, 32);
    EXPECT_FALSE(st[3].has_state);
  }
}

TEST(HybridLoad, FullAttentionIntervalStandsInForLayerTypes) {
  ThreadPool pool(1);
  EditedModel edited("qwen3next-tiny", [](nlohmann::json& c) {
    c.erase("layer_types");
    c["full_attention_interval"] = 4;
  });
  auto a = load_model(tiny("qwen3next-tiny"), pool);
  auto b = load_model(edited.dir(), pool);
  ASSERT_TRUE(a.ok()) << a.error().to_string();
  ASSERT_TRUE(b.ok()) << b.error().to_string();
  const std::vector<int32_t> ids{5, 9, 300, 17, 42, 8, 8, 101};
  SingleSequence sa(**a, 16), sb(**b, 16);
  auto la = sa.prefill(ids, true), lb = sb.prefill(ids, true);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_EQ(*la, *lb);

  // Interval 2 makes layer 1 full attention, which this checkpoint does not have.
  EditedModel wrong("qwen3next-tiny", [](nlohmann::json& c) {
    c.erase("layer_types");
    c["full_attention_interval"] = 2;
  });
  auto w = load_model(wrong.dir(), pool);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.error().message.find("layers.1.self_attn."), std::string::npos) << w.error().message;
}

TEST(HybridLoad, BadConfigsAreErrorsNamingTheKey) {
  ThreadPool pool(1);
  struct Bad {
    const char* model;
    void (*edit)(nlohmann::json&);
    const char* needle;
  };
  const Bad cases[] = {
      {"qwen35-tiny", [](nlohmann::json& c) { c["linear_num_value_heads"] = 3; }, "linear_num_value_heads"},
      {"qwen35-tiny", [](nlohmann::json& c) { c.erase("linear_key_head_dim"); }, "linear_key_head_dim"},
      {"qwen35-tiny", [](nlohmann::json& c) { c["linear_conv_kernel_dim"] = -4; }, "linear_conv_kernel_dim"},
      {"qwen35-tiny", [](nlohmann::json& c) { c["layer_types"][0] = "mamba"; }, "layer_types[0]"},
      {"qwen35-tiny", [](nlohmann::json& c) { c["linear_value_head_dim"] = 32; }, "linear_attn."},
      {"qwen35moe-tiny", [](nlohmann::json& c) { c["num_experts_per_tok"] = 9; }, "num_experts_per_tok"},
      {"qwen3next-tiny", [](nlohmann::json& c) { c["shared_expert_intermediate_size"] = 48; }, "shared_expert"},
  };
  for (const Bad& b : cases) {
    EditedModel m(b.model, b.edit);
    auto r = load_model(m.dir(), pool);
    ASSERT_FALSE(r.ok()) << b.model << " / " << b.needle;
    EXPECT_NE(r.error().message.find(b.needle), std::string::npos) << r.error().message;
  }
}

}  // namespace
}  // namespace strata
