// The weight manifest (model/weight_manifest.h) names every text tensor of each DecoderSpec
// family's and each DeltaNet hybrid's checkpoint exactly once, with the checkpoint's shape, and
// a dummy model's inits.
#include "model/weight_manifest.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "model/decoder.h"
#include "model/model_config.h"
#include "model/qwen3_next.h"
#include "model/registry.h"
#include "model/safetensors.h"
#include "model/weight_loader.h"

namespace strata {
namespace {

const std::string kModels = std::string(STRATA_TEST_DATA) + "/reference/models";

class DecoderManifest : public ::testing::TestWithParam<const char*> {};

TEST_P(DecoderManifest, NamesEveryTextTensorOnceWithItsShape) {
  const std::string dir = kModels + "/" + GetParam();
  auto cfg = load_model_config(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.error().to_string();
  auto archive = SafetensorsArchive::open_dir(dir);
  ASSERT_TRUE(archive.ok()) << archive.error().to_string();
  ASSERT_TRUE(resolve_weight_names(&*cfg, **archive).ok());
  auto spec = family_decoder_spec(*cfg);
  ASSERT_TRUE(spec.ok()) << spec.error().to_string();
  auto m = decoder_manifest(*cfg, *spec);
  ASSERT_TRUE(m.ok()) << m.error().to_string();

  std::set<std::string> named;
  for (const WeightEntry& e : m->entries) {
    const std::string full = e.absolute ? e.name : cfg->weight_prefix + e.name;
    EXPECT_TRUE(named.insert(full).second) << full << " named twice";
    auto it = (*archive)->tensors().find(full);
    ASSERT_NE(it, (*archive)->tensors().end()) << full << " is not in the checkpoint";
    EXPECT_EQ(it->second.shape, e.shape) << full;
    if (!e.is_matrix() && e.init == WeightInit::kConstant && e.role != WeightRole::kQBias && e.role != WeightRole::kKBias &&
        e.role != WeightRole::kVBias && e.role != WeightRole::kOBias) {
      EXPECT_EQ(e.value, spec->norm_one_plus_w ? 0.0f : 1.0f) << full << ": a norm's unit";
    }
  }
  // Every text tensor of the checkpoint is in the manifest (a wrapper's vision tower is not).
  for (const auto& [name, t] : (*archive)->tensors()) {
    const bool text = name.rfind(cfg->weight_prefix, 0) == 0 || name == cfg->lm_head_name;
    if (!text) continue;
    EXPECT_TRUE(named.count(name)) << name << " is in the checkpoint but not in the manifest";
  }
  EXPECT_EQ(m->tied_embeddings, cfg->lm_head_name.empty());
  EXPECT_EQ(m->find(WeightRole::kLmHead) == nullptr, m->tied_embeddings);
}

INSTANTIATE_TEST_SUITE_P(Families, DecoderManifest,
                         ::testing::Values("llama3-tiny", "mistral-tiny", "qwen2-tiny", "qwen3-tiny", "qwen3moe-tiny",
                                           "qwen3yarn-tiny", "gemma2-tiny", "gemma3-tiny", "gemma3mm-tiny"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return s;
                         });

TEST(DecoderManifest, FusedGroupsAreContiguousPerLayer) {
  // A backend concatenates a layer's group in manifest order: q, k, v; gate, up; each expert's
  // gate then up, and the downs in expert order.
  auto cfg = load_model_config(kModels + "/qwen3moe-tiny");
  ASSERT_TRUE(cfg.ok());
  cfg->lm_head_name.clear();
  auto spec = family_decoder_spec(*cfg);
  ASSERT_TRUE(spec.ok());
  auto m = decoder_manifest(*cfg, *spec);
  ASSERT_TRUE(m.ok());
  for (int32_t l = 0; l < cfg->n_layers; ++l) {
    std::vector<WeightRole> qkv, experts_gate_up;
    std::vector<int32_t> down_experts;
    for (const WeightEntry* e : m->of_layer(l)) {
      if (e->fuse == WeightFuse::kQkv) qkv.push_back(e->role);
      if (e->fuse == WeightFuse::kExpertsGateUp) experts_gate_up.push_back(e->role);
      if (e->fuse == WeightFuse::kExpertsDown) down_experts.push_back(e->expert);
    }
    EXPECT_EQ(qkv, (std::vector<WeightRole>{WeightRole::kQ, WeightRole::kK, WeightRole::kV}));
    if (decoder_layer_sparse(*cfg, *spec, l)) {
      ASSERT_EQ(experts_gate_up.size(), size_t(2 * cfg->n_experts));
      for (size_t i = 0; i < experts_gate_up.size(); ++i) {
        EXPECT_EQ(experts_gate_up[i], i % 2 == 0 ? WeightRole::kExpertGate : WeightRole::kExpertUp);
      }
      for (int32_t e = 0; e < cfg->n_experts; ++e) EXPECT_EQ(down_experts[size_t(e)], e);
    }
  }
  // An untied config without a resolved name (a dummy model) reads lm_head.weight.
  cfg->tie_embeddings = false;
  m = decoder_manifest(*cfg, *spec);
  ASSERT_TRUE(m.ok());
  ASSERT_NE(m->find(WeightRole::kLmHead), nullptr);
  EXPECT_EQ(m->find(WeightRole::kLmHead)->name, "lm_head.weight");
  EXPECT_TRUE(m->find(WeightRole::kLmHead)->absolute);
}

class HybridManifest : public ::testing::TestWithParam<const char*> {};

TEST_P(HybridManifest, NamesEveryTextTensorOnceWithItsShape) {
  const std::string dir = kModels + "/" + GetParam();
  auto cfg = load_model_config(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.error().to_string();
  auto archive = SafetensorsArchive::open_dir(dir);
  ASSERT_TRUE(archive.ok()) << archive.error().to_string();
  ASSERT_TRUE(resolve_weight_names(&*cfg, **archive).ok());
  ASSERT_TRUE(resolve_hybrid_layer_types(&*cfg).ok());
  auto family = hybrid_family(cfg->model_type);
  ASSERT_TRUE(family.ok()) << family.error().to_string();
  const WeightLoader w(*archive, cfg->weight_prefix, nullptr);
  auto m = hybrid_manifest(*cfg, *family, &w);
  ASSERT_TRUE(m.ok()) << m.error().to_string();

  std::set<std::string> named;
  for (const WeightEntry& e : m->entries) {
    const std::string full = e.absolute ? e.name : cfg->weight_prefix + e.name;
    EXPECT_TRUE(named.insert(full).second) << full << " named twice";
    auto it = (*archive)->tensors().find(full);
    if (e.optional && it == (*archive)->tensors().end()) continue;
    ASSERT_NE(it, (*archive)->tensors().end()) << full << " is not in the checkpoint";
    EXPECT_EQ(it->second.shape, e.shape) << full;
    // (1 + w) norms hold 0 in a dummy; the DeltaNet output norm is plain w.
    const bool norm = e.role == WeightRole::kInputNorm || e.role == WeightRole::kPostAttnNorm ||
                      e.role == WeightRole::kFinalNorm || e.role == WeightRole::kQNorm || e.role == WeightRole::kKNorm;
    if (norm) EXPECT_EQ(e.value, 0.0f) << full;
    if (e.role == WeightRole::kDeltaNorm) EXPECT_EQ(e.value, 1.0f) << full;
    if (e.role == WeightRole::kDeltaConv || e.role == WeightRole::kDeltaALog || e.role == WeightRole::kDeltaDtBias) {
      EXPECT_EQ(e.init, WeightInit::kUniform) << full;
      EXPECT_LT(e.value, e.value_hi) << full;
    }
  }
  for (const auto& [name, t] : (*archive)->tensors()) {
    const bool text = name.rfind(cfg->weight_prefix, 0) == 0 || name == cfg->lm_head_name;
    if (!text) continue;
    EXPECT_TRUE(named.count(name)) << name << " is in the checkpoint but not in the manifest";
  }
  EXPECT_EQ(m->tied_embeddings, cfg->lm_head_name.empty());
  EXPECT_EQ(m->find(WeightRole::kLmHead) == nullptr, m->tied_embeddings);
}

INSTANTIATE_TEST_SUITE_P(Families, HybridManifest, ::testing::Values("qwen3next-tiny", "qwen35-tiny", "qwen35moe-tiny"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return s;
                         });

TEST(HybridManifest, ADummyGetsFusedExpertsAndTheInProjGroup) {
  auto cfg = load_model_config(kModels + "/qwen35moe-tiny");
  ASSERT_TRUE(cfg.ok());
  ASSERT_TRUE(resolve_hybrid_layer_types(&*cfg).ok());
  auto m = hybrid_manifest(*cfg, HybridFamily::kQwen35Moe, nullptr);
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  EXPECT_EQ(m->tied_embeddings, cfg->tie_embeddings);
  if (!m->tied_embeddings) EXPECT_EQ(m->find(WeightRole::kLmHead)->name, "lm_head.weight");
  for (int32_t l = 0; l < cfg->n_layers; ++l) {
    const WeightEntry* gu = m->find(WeightRole::kFusedExpertsGateUp, l);
    ASSERT_NE(gu, nullptr);
    EXPECT_EQ(gu->shape, (std::vector<int64_t>{cfg->n_experts, 2 * cfg->moe_intermediate, cfg->hidden}));
    EXPECT_EQ(m->find(WeightRole::kExpertGate, l, 0), nullptr);
    std::vector<WeightRole> in_proj;
    for (const WeightEntry* e : m->of_layer(l))
      if (e->fuse == WeightFuse::kDeltaInProj) in_proj.push_back(e->role);
    if (cfg->layer_types[size_t(l)] == "linear_attention") {
      EXPECT_EQ(in_proj, (std::vector<WeightRole>{WeightRole::kDeltaQkv, WeightRole::kDeltaZ, WeightRole::kDeltaB, WeightRole::kDeltaA}));
    } else {
      EXPECT_TRUE(in_proj.empty());
      EXPECT_NE(m->find(WeightRole::kQGate, l), nullptr);
    }
  }
  // A config whose shapes cannot be is refused naming the field.
  cfg->shared_expert_intermediate = 0;
  auto bad = hybrid_manifest(*cfg, HybridFamily::kQwen35Moe, nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("shared_expert_intermediate_size"), std::string::npos) << bad.error().message;
}

TEST(DecoderManifest, RefusesShapesTheConfigCannotGive) {
  auto cfg = load_model_config(kModels + "/llama3-tiny");
  ASSERT_TRUE(cfg.ok());
  auto spec = family_decoder_spec(*cfg);
  ASSERT_TRUE(spec.ok());
  cfg->intermediate = 0;
  auto m = decoder_manifest(*cfg, *spec);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("intermediate_size must be positive, got 0"), std::string::npos) << m.error().message;
  // Families with a layer of their own have no DecoderSpec.
  auto g4 = load_model_config(kModels + "/gemma4-tiny");
  ASSERT_TRUE(g4.ok());
  auto s4 = family_decoder_spec(*g4);
  ASSERT_FALSE(s4.ok());
  EXPECT_NE(s4.error().message.find("gemma4_text"), std::string::npos) << s4.error().message;
}

}  // namespace
}  // namespace strata
