// Fine-grained FP8 checkpoints (quant_method fp8: float8_e4m3fn weights, one weight_scale_inv per
// 128x128 block) against the transformers oracle's dequantized float32 reading
// (tests/data/reference/fp8/fp8_logits.json, `fp8_dequantized_f32`): the CPU dequantizes the
// weights to f32 at load, so prompt argmax and greedy ids are exact and last logits within 1e-4.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "core/thread_pool.h"
#include "golden_cases.h"
#include "model/registry.h"

namespace strata {
namespace {

const std::string kDir = std::string(STRATA_TEST_DATA) + "/reference/fp8/";

nlohmann::json fp8_oracle() {
  std::ifstream in(kDir + "fp8_logits.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

std::vector<golden::GoldenCase> oracle_cases(const std::string& model) {
  std::vector<golden::GoldenCase> out;
  const nlohmann::json oracle = fp8_oracle();
  for (const auto& c : oracle[model]["fp8_dequantized_f32"]) {
    golden::GoldenCase g;
    g.prompt_ids = c["prompt_ids"].get<std::vector<int32_t>>();
    g.prompt_argmax = c["prompt_argmax"].get<std::vector<int32_t>>();
    g.last_logits = c["last_logits"].get<std::vector<float>>();
    g.greedy_ids = c["greedy_ids"].get<std::vector<int32_t>>();
    out.push_back(std::move(g));
  }
  return out;
}

class Fp8OracleTest : public ::testing::TestWithParam<const char*> {};

TEST_P(Fp8OracleTest, DequantizedReadingMatchesOracle) {
  const std::string name = GetParam();
  ThreadPool pool(2);
  auto model = load_model(kDir + name + "-fp8", pool);
  ASSERT_TRUE(model.ok()) << model.error().to_string();
  EXPECT_EQ((*model)->config().quant->format, QuantFormat::kFp8Block);
  const auto cases = oracle_cases(name);
  ASSERT_EQ(cases.size(), 2u);
  for (size_t i = 0; i < cases.size(); ++i) {
    golden::expect_exact_case(**model, cases[i], 1e-4, name + " case " + std::to_string(i));
  }
}

INSTANTIATE_TEST_SUITE_P(Fp8, Fp8OracleTest, ::testing::Values("llama3-small", "qwen3-small"));

// A copy of a checkpoint directory whose config.json `edit` rewrites and whose tensors `drop`
// leaves out (rewritten safetensors header, same data).
std::string edited_copy(const std::string& src, const std::string& tag, const std::function<void(nlohmann::json&)>& edit,
                        const std::string& drop = "") {
  namespace fs = std::filesystem;
  const fs::path dst = fs::temp_directory_path() / ("strata_fp8_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(dst);
  fs::create_directories(dst);
  std::ifstream cin(src + "/config.json");
  nlohmann::json cfg = nlohmann::json::parse(cin);
  edit(cfg);
  std::ofstream(dst / "config.json") << cfg.dump(2);
  std::ifstream in(src + "/model.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  if (!drop.empty()) header.erase(drop);
  std::string h = header.dump();
  uint64_t hn = h.size();
  std::ofstream out(dst / "model.safetensors", std::ios::binary);
  out.write(reinterpret_cast<const char*>(&hn), 8);
  out << h << bytes.substr(8 + n);
  return dst.string();
}

std::string load_error(const std::string& dir) {
  ThreadPool pool(1);
  auto m = load_model(dir, pool);
  std::filesystem::remove_all(dir);
  return m.ok() ? std::string("loaded") : m.error().to_string();
}

TEST(Fp8Errors, UnknownQuantMethodNamesFieldAndValue) {
  const auto dir = edited_copy(kDir + "qwen3-small-fp8", "method", [](nlohmann::json& c) {
    c["quantization_config"]["quant_method"] = "bitsandbytes";
  });
  const std::string e = load_error(dir);
  EXPECT_NE(e.find("quantization_config.quant_method"), std::string::npos) << e;
  EXPECT_NE(e.find("bitsandbytes"), std::string::npos) << e;
}

TEST(Fp8Errors, BadBlockSizeNamesField) {
  const auto dir = edited_copy(kDir + "qwen3-small-fp8", "block", [](nlohmann::json& c) {
    c["quantization_config"]["weight_block_size"] = {64, 128};
  });
  const std::string e = load_error(dir);
  EXPECT_NE(e.find("weight_scale_inv"), std::string::npos) << e;
  EXPECT_NE(e.find("weight_block_size [64, 128]"), std::string::npos) << e;
}

TEST(Fp8Errors, MissingScaleTensorNamed) {
  const auto dir = edited_copy(kDir + "qwen3-small-fp8", "scale", [](nlohmann::json&) {},
                               "model.layers.1.self_attn.o_proj.weight_scale_inv");
  const std::string e = load_error(dir);
  EXPECT_NE(e.find("'model.layers.1.self_attn.o_proj.weight_scale_inv' is missing"), std::string::npos) << e;
}

TEST(Fp8Errors, Fp8WeightsWithoutQuantizationConfigRefused) {
  const auto dir = edited_copy(kDir + "qwen3-small-fp8", "noconfig", [](nlohmann::json& c) { c.erase("quantization_config"); });
  const std::string e = load_error(dir);
  EXPECT_NE(e.find("fp8_e4m3 (supported: F32, BF16, F16)"), std::string::npos) << e;
}

}  // namespace
}  // namespace strata
