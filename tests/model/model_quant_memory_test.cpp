// Quantized checkpoints kept quantized in CPU memory (WeightLoader quantized_in_memory, the CPU
// model's default): each format lands in the expected WeightMatrix kind, its rows read back as
// the f32 dequantization does, GPTQ act-order stays f32, and a model loaded either way gives the
// same greedy tokens with logits within 1e-5.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "core/thread_pool.h"
#include "golden_cases.h"
#include "model/registry.h"
#include "model/single_sequence.h"
#include "model/weight_loader.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

const fs::path kSource = STRATA_SOURCE_DIR;

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

fs::path work_dir() {
  static const fs::path d = fs::temp_directory_path() / ("strata_quant_mem_" + std::to_string(::getpid()));
  return d;
}

struct Case {
  const char* name;
  const char* model;  // relative to the repository root; an existing checkpoint when args is null
  const char* args;   // quantize.py arguments
  WeightQuant want;   // kNone: stays f32
};

const Case kCases[] = {
    {"mlx8", "tests/data/reference/models/qwen3-tiny", "--format mlx --bits 8 --group-size 32", WeightQuant::kAffine8},
    {"mlx4", "tests/data/reference/models/llama3-tiny", "--format mlx --bits 4 --group-size 32", WeightQuant::kAffine4},
    {"mlx2", "tests/data/reference/models/qwen3-tiny", "--format mlx --bits 2 --group-size 32", WeightQuant::kAffine4},
    {"awq4", "tests/data/reference/models/qwen2-tiny", "--format awq --group-size 32", WeightQuant::kAffine4},
    {"gptq8", "tests/data/reference/models/llama3-tiny", "--format gptq --bits 8 --group-size 32", WeightQuant::kAffine8},
    {"gptq4_sym", "tests/data/reference/models/qwen3-tiny", "--format gptq --bits 4 --group-size 32 --sym",
     WeightQuant::kAffine4},
    {"gptq4_actorder", "tests/data/reference/models/qwen3-tiny", "--format gptq --bits 4 --group-size 32 --act-order",
     WeightQuant::kNone},
    {"fp8ct_channel", "tests/data/reference/models/llama3-tiny", "--format fp8-ct --strategy channel", WeightQuant::kFp8},
    {"fp8ct_tensor", "tests/data/reference/models/qwen3-tiny", "--format fp8-ct --strategy tensor", WeightQuant::kFp8},
    {"fp8_block", "tests/data/reference/fp8/qwen3-small-fp8", nullptr, WeightQuant::kFp8},
};

std::string checkpoint(const Case& c) {
  if (c.args == nullptr) return (kSource / c.model).string();
  const fs::path out = work_dir() / c.name;
  if (fs::exists(out / "config.json")) return out.string();
  const std::string cmd = python() + " " + (kSource / "scripts/quant/quantize.py").string() + " " + c.args + " --model " +
                          (kSource / c.model).string() + " --out " + out.string() + " >/dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return out.string();
}

class QuantMemoryTest : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() { ASSERT_FALSE(python().empty()) << "no python3 with numpy (Debian: python3-numpy)"; }
  static void TearDownTestSuite() { fs::remove_all(work_dir()); }
};

TEST_P(QuantMemoryTest, KeptQuantizedReadsAsDequantized) {
  const Case& c = GetParam();
  const std::string dir = checkpoint(c);
  ThreadPool pool(1);
  auto model = load_model(dir, pool);  // resolves the weight prefix
  ASSERT_TRUE(model.ok()) << model.error().to_string();
  const ModelConfig* cfg = &(*model)->config();
  auto archive = SafetensorsArchive::open_dir(dir);
  ASSERT_TRUE(archive.ok());
  const WeightLoader kept(*archive, cfg->weight_prefix, cfg->quant, true), f32(*archive, cfg->weight_prefix, cfg->quant);
  EXPECT_TRUE(kept.quantized_in_memory());
  const int64_t H = cfg->hidden, nh = cfg->n_heads, hd = cfg->head_dim;
  struct Mat {
    std::string name;
    int64_t rows, cols;
  };
  const Mat mats[] = {{"layers.0.self_attn.o_proj.weight", H, nh * hd},
                      {"layers.1.mlp.down_proj.weight", H, cfg->intermediate},
                      {"layers.0.mlp.gate_proj.weight", cfg->intermediate, H}};
  for (const Mat& m : mats) {
    auto w = kept.matrix(m.name, m.rows, m.cols);
    ASSERT_TRUE(w.ok()) << c.name << " " << m.name << ": " << w.error().to_string();
    EXPECT_EQ(w->quant, c.want) << c.name << " " << m.name;
    auto d = f32.f32(m.name, {m.rows, m.cols});
    ASSERT_TRUE(d.ok());
    if (c.want == WeightQuant::kNone) continue;
    EXPECT_EQ(cpu::weight_bytes(*w) < m.rows * m.cols * 2, true) << c.name << " " << m.name;
    // fma(q, s, b) against the converter's (q - z) * s or s * q + b: each side rounds -s*z (or
    // s*q) and the result once, at most 2^-24 of |s*z| + 2|w| <= 4 * max|w| of the row for the
    // affine formats; e4m3 * scale is the same product both ways.
    std::vector<float> row(static_cast<size_t>(m.cols));
    for (int64_t r = 0; r < m.rows; r += 7) {
      cpu::weight_row(*w, r, row.data());
      double max_w = 0.0, max_diff = 0.0;
      for (int64_t p = 0; p < m.cols; ++p) {
        const double want = (*d)[size_t(r * m.cols + p)];
        max_w = std::max(max_w, std::fabs(want));
        max_diff = std::max(max_diff, std::fabs(double(row[size_t(p)]) - want));
      }
      if (c.want == WeightQuant::kFp8) ASSERT_EQ(max_diff, 0.0) << c.name << " " << m.name << " row " << r;
      else ASSERT_LE(max_diff, 4.0 * 0x1p-24 * max_w) << c.name << " " << m.name << " row " << r;
    }
  }
}

TEST_P(QuantMemoryTest, ModelEqualsTheDequantizedLoad) {
  const Case& c = GetParam();
  const std::string dir = checkpoint(c);
  ThreadPool pool(2);
  LoadOptions deq;
  deq.quantized_in_memory = false;
  auto q = load_model(dir, pool);
  auto f = load_model(dir, pool, deq);
  ASSERT_TRUE(q.ok() && f.ok()) << c.name;
  const int32_t vocab = (*q)->config().vocab_size;
  SingleSequence sq(**q, 48), sf(**f, 48);
  auto lq = sq.prefill({1, 17, 42, 99, 250, 7, 3}, false);
  auto lf = sf.prefill({1, 17, 42, 99, 250, 7, 3}, false);
  ASSERT_TRUE(lq.ok() && lf.ok());
  for (int step = 0; step < 8; ++step) {
    EXPECT_LE(golden::max_norm_rel(lq->data(), *lf), 1e-5) << c.name << " step " << step;
    const int32_t a = argmax(lq->data(), vocab), b = argmax(lf->data(), vocab);
    ASSERT_EQ(a, b) << c.name << " step " << step;
    lq = sq.step(a);
    lf = sf.step(b);
    ASSERT_TRUE(lq.ok() && lf.ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantMemoryTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace strata
