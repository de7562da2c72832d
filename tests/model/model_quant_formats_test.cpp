// Quantized checkpoints written by scripts/quant/quantize.py from the reference models
// (compressed-tensors FP8, MLX affine, AWQ, GPTQ) against the same models with every quantized
// weight replaced by its f32 dequantization (written by the converter from the integer codes,
// before packing): the logits of every prompt position and of 12 greedy steps agree within
// 1e-4 and the greedy ids are equal. The packing itself is pinned by hand-derived vectors in
// tests/unit/model_quant_packing_test.cpp, so a converter and a reader that agree on a wrong
// layout cannot both pass. The converter runs here, at test time, so CI exercises it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/thread_pool.h"
#include "golden_cases.h"
#include "model/quant.h"
#include "model/registry.h"
#include "model/weight_loader.h"
#include "model/single_sequence.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

const fs::path kSource = STRATA_SOURCE_DIR;

// A Python 3 with numpy: $STRATA_PYTHON, else python3 on PATH, else Debian's.
std::string python() {
  static const std::string p = [] {
    std::vector<std::string> c;
    if (const char* e = std::getenv("STRATA_PYTHON")) c.push_back(e);
    c.insert(c.end(), {"python3", "/usr/bin/python3"});
    for (const auto& x : c) {
      if (std::system((x + " -c 'import numpy' >/dev/null 2>&1").c_str()) == 0) return x;
    }
    return std::string();
  }();
  return p;
}

struct Case {
  const char* name;
  const char* model;  // relative to the repository root
  const char* args;   // quantize.py arguments after --model/--out
  QuantFormat format;
};

const Case kCases[] = {
    {"fp8ct_channel_llama3", "tests/data/reference/models/llama3-tiny", "--format fp8-ct --strategy channel",
     QuantFormat::kFp8Compressed},
    {"fp8ct_tensor_qwen3", "tests/data/reference/models/qwen3-tiny", "--format fp8-ct --strategy tensor",
     QuantFormat::kFp8Compressed},
    {"mlx4_g32_qwen3_tied", "tests/data/reference/models/qwen3-tiny",
     "--format mlx --bits 4 --group-size 32 --override model.layers.0.mlp.down_proj=8:32", QuantFormat::kMlxAffine},
    {"mlx4_g32_llama3_head", "tests/data/reference/models/llama3-tiny", "--format mlx --bits 4 --group-size 32",
     QuantFormat::kMlxAffine},
    {"mlx8_g64_demo_draft", "models/strata-demo-draft", "--format mlx --bits 8 --group-size 64", QuantFormat::kMlxAffine},
    {"mlx2_g128_demo_draft", "models/strata-demo-draft", "--format mlx --bits 2 --group-size 128", QuantFormat::kMlxAffine},
    {"awq4_g128_demo_draft", "models/strata-demo-draft", "--format awq --group-size 128", QuantFormat::kAwq},
    {"awq4_g32_qwen2", "tests/data/reference/models/qwen2-tiny", "--format awq --group-size 32", QuantFormat::kAwq},
    {"gptq4_g128_sym_actorder_demo_draft", "models/strata-demo-draft",
     "--format gptq --bits 4 --group-size 128 --sym --act-order", QuantFormat::kGptq},
    {"gptq8_g32_asym_llama3", "tests/data/reference/models/llama3-tiny", "--format gptq --bits 8 --group-size 32",
     QuantFormat::kGptq},
    {"gptq4_g32_asym_actorder_qwen3", "tests/data/reference/models/qwen3-tiny",
     "--format gptq --bits 4 --group-size 32 --act-order --seed 3", QuantFormat::kGptq},
    {"mlx4_g32_gemma3_tied", "tests/data/reference/models/gemma3-tiny", "--format mlx --bits 4 --group-size 32",
     QuantFormat::kMlxAffine},
    // The hybrids slice some matrices whole (DeltaNet's fused inputs, the gated query).
    {"fp8ct_channel_qwen35", "tests/data/reference/models/qwen35-tiny", "--format fp8-ct --strategy channel",
     QuantFormat::kFp8Compressed},
    {"mlx4_g32_qwen35", "tests/data/reference/models/qwen35-tiny", "--format mlx --bits 4 --group-size 32",
     QuantFormat::kMlxAffine},
    {"awq4_g32_qwen3next", "tests/data/reference/models/qwen3next-tiny", "--format awq --group-size 32", QuantFormat::kAwq},
    {"gptq4_g32_sym_qwen3next", "tests/data/reference/models/qwen3next-tiny", "--format gptq --bits 4 --group-size 32 --sym",
     QuantFormat::kGptq},
    // Gemma 4 dense: per-layer head dims, shared KV, per-layer inputs (their projections stay float).
    {"mlx4_g32_gemma4_tied", "tests/data/reference/models/gemma4-tiny", "--format mlx --bits 4 --group-size 32",
     QuantFormat::kMlxAffine},
    {"gptq8_g32_gemma4", "tests/data/reference/models/gemma4-tiny", "--format gptq --bits 8 --group-size 32 --act-order",
     QuantFormat::kGptq},
    // Mixture of experts, one tensor per expert (the router stays float): moe_intermediate 48
    // leaves GPTQ's down_proj a partial last group of 16.
    {"fp8ct_channel_qwen3moe", "tests/data/reference/models/qwen3moe-tiny", "--format fp8-ct --strategy channel",
     QuantFormat::kFp8Compressed},
    {"gptq4_g32_asym_actorder_qwen3moe", "tests/data/reference/models/qwen3moe-tiny",
     "--format gptq --bits 4 --group-size 32 --act-order --seed 5", QuantFormat::kGptq},
};

fs::path work_dir() {
  static const fs::path d = fs::temp_directory_path() / ("strata_quant_" + std::to_string(::getpid()));
  return d;
}

// Runs the converter for `c`; returns the quantized and the dequantized directories.
std::pair<std::string, std::string> convert(const Case& c) {
  const fs::path out = work_dir() / c.name, deq = work_dir() / (std::string(c.name) + "-f32");
  const std::string cmd = python() + " " + (kSource / "scripts/quant/quantize.py").string() + " " + c.args + " --model " +
                          (kSource / c.model).string() + " --out " + out.string() + " --dequantized " + deq.string();
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return {out.string(), deq.string()};
}

class QuantFormatTest : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() { ASSERT_FALSE(python().empty()) << "no python3 with numpy (Debian: python3-numpy)"; }
  static void TearDownTestSuite() { fs::remove_all(work_dir()); }
};

void expect_close(const float* got, const float* want, int64_t n, const std::string& label) {
  std::vector<float> ref(want, want + n);
  EXPECT_LE(golden::max_norm_rel(got, ref), 1e-4) << label;
}

TEST_P(QuantFormatTest, LogitsEqualDequantizedModel) {
  const Case& c = GetParam();
  ASSERT_FALSE(python().empty());
  const auto [qdir, fdir] = convert(c);
  ThreadPool pool(2);
  auto q = load_model(qdir, pool);
  ASSERT_TRUE(q.ok()) << q.error().to_string();
  auto f = load_model(fdir, pool);
  ASSERT_TRUE(f.ok()) << f.error().to_string();
  ASSERT_EQ((*q)->config().quant->format, c.format);
  ASSERT_FALSE((*f)->config().quant->quantized());
  // The CPU holds what the f32 twin stores; the quantized checkpoint stores less.
  auto qa = SafetensorsArchive::open_dir(qdir);
  auto fa = SafetensorsArchive::open_dir(fdir);
  ASSERT_TRUE(qa.ok() && fa.ok());
  const WeightBytesPerToken bq = weight_bytes_per_token((*q)->config(), **qa), bf = weight_bytes_per_token((*f)->config(), **fa);
  EXPECT_EQ(bq.loaded, bf.stored) << c.name;
  EXPECT_EQ(bq.parameters, bf.parameters) << c.name;
  EXPECT_LT(bq.stored, bf.stored) << c.name;
  // WeightLoader::f32 (what a device backend uploads) reads a quantized matrix as its f32 twin.
  const ModelConfig& qc = (*q)->config();
  const WeightLoader wq(*qa, qc.weight_prefix, qc.quant), wf(*fa, (*f)->config().weight_prefix);
  for (const char* name : {"layers.0.self_attn.o_proj.weight", "layers.1.mlp.down_proj.weight", "embed_tokens.weight"}) {
    const TensorInfo* t = (*fa)->find(qc.weight_prefix + name);
    if (t == nullptr) continue;  // a MoE layer's experts, a hybrid's DeltaNet layer
    auto a = wq.f32(name, t->shape);
    auto b = wf.f32(name, t->shape);
    ASSERT_TRUE(a.ok()) << c.name << " " << name << ": " << a.error().to_string();
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(*a, *b) << c.name << " " << name;
  }
  const int32_t vocab = (*q)->config().vocab_size;
  const std::vector<std::vector<int32_t>> prompts = {{1, 17, 42, 99, 250, 7, 3}, {5}, {2, 60, 61, 62, 63, 64, 65, 66, 67, 300, 11}};
  for (size_t p = 0; p < prompts.size(); ++p) {
    const std::string label = std::string(c.name) + " prompt " + std::to_string(p);
    SingleSequence sq(**q, 64), sf(**f, 64);
    auto lq = sq.prefill(prompts[p], true);
    auto lf = sf.prefill(prompts[p], true);
    ASSERT_TRUE(lq.ok() && lf.ok()) << label;
    for (size_t t = 0; t < prompts[p].size(); ++t) {
      expect_close(lq->data() + t * size_t(vocab), lf->data() + t * size_t(vocab), vocab, label + " position " + std::to_string(t));
    }
    std::vector<float> last_q(lq->end() - vocab, lq->end()), last_f(lf->end() - vocab, lf->end());
    for (int step = 0; step < 12; ++step) {
      const int32_t a = argmax(last_q.data(), vocab), b = argmax(last_f.data(), vocab);
      ASSERT_EQ(a, b) << label << " greedy step " << step;
      auto nq = sq.step(a);
      auto nf = sf.step(b);
      ASSERT_TRUE(nq.ok() && nf.ok()) << label;
      last_q.assign(nq->begin(), nq->end());
      last_f.assign(nf->begin(), nf->end());
      expect_close(last_q.data(), last_f.data(), vocab, label + " step " + std::to_string(step));
    }
  }
}

// Rewrites `dir`/model.safetensors without tensor `drop` (same data, new header).
void drop_tensor(const std::string& dir, const std::string& drop) {
  const std::string path = dir + "/model.safetensors";
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  ASSERT_TRUE(header.contains(drop)) << drop;
  header.erase(drop);
  const std::string h = header.dump();
  const uint64_t hn = h.size();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&hn), 8);
  out << h << bytes.substr(8 + n);
}

struct MissingCase {
  size_t format_case;  // index into kCases
  const char* tensor;
};

TEST_F(QuantFormatTest, MissingCompanionTensorIsNamed) {
  ASSERT_FALSE(python().empty());
  const MissingCase missing[] = {
      {0, "model.layers.1.mlp.up_proj.weight_scale"},
      {2, "model.layers.0.self_attn.k_proj.scales"},
      {2, "model.embed_tokens.biases"},
      {6, "model.layers.1.mlp.down_proj.qzeros"},
      {9, "model.layers.0.self_attn.o_proj.scales"},
      {19, "model.layers.1.mlp.experts.3.down_proj.g_idx"},
  };
  for (const auto& m : missing) {
    const Case& c = kCases[m.format_case];
    const auto dirs = convert(c);
    drop_tensor(dirs.first, m.tensor);
    ThreadPool pool(1);
    auto model = load_model(dirs.first, pool);
    ASSERT_FALSE(model.ok()) << c.name << " without " << m.tensor;
    const std::string e = model.error().to_string();
    EXPECT_NE(e.find(std::string("'") + m.tensor + "' is missing"), std::string::npos) << e;
  }
}

// A per-module MLX override that disagrees with the packed shape is refused naming the tensor.
TEST_F(QuantFormatTest, MlxOverrideShapeMismatchIsNamed) {
  ASSERT_FALSE(python().empty());
  const auto dirs = convert(kCases[2]);  // layer 0 down_proj is 8-bit
  std::ifstream in(dirs.first + "/config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  in.close();
  cfg["quantization"].erase("model.layers.0.mlp.down_proj");
  std::ofstream(dirs.first + "/config.json") << cfg.dump();
  ThreadPool pool(1);
  auto model = load_model(dirs.first, pool);
  ASSERT_FALSE(model.ok());
  const std::string e = model.error().to_string();
  EXPECT_NE(e.find("'model.layers.0.mlp.down_proj.weight' has shape [64, 40]"), std::string::npos) << e;
  EXPECT_NE(e.find("bits 4, group_size 32"), std::string::npos) << e;
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantFormatTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace strata
