// The packing of each quantized format, pinned by vectors derived by hand from the format's own
// public code (cited per test), and the config errors of model/quant_config.h.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "model/quant.h"
#include "model/quant_config.h"

namespace strata {
namespace {

// AutoAWQ, awq/modules/linear/gemm.py, WQLinear_GEMM.from_linear: for each group of 8 output
// columns, `qweight[:, col] |= intweight[:, col * 8 + order_map[i]] << (i * 4)` with
// order_map = [0, 2, 4, 6, 1, 3, 5, 7]. So in the word 0x76543210 (nibble i holds i) column
// order_map[i] holds i: columns 0..7 read 0, 4, 1, 5, 2, 6, 3, 7.
TEST(AwqPacking, NibbleOrder) {
  const int32_t word = 0x76543210;
  const uint32_t want[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  for (int o = 0; o < 8; ++o) EXPECT_EQ(quant::awq_code(&word, o), want[o]) << "column " << o;
  // The top nibble belongs to column 7 and survives a negative int32 word.
  const int32_t top = int32_t(0xF0000000u);
  EXPECT_EQ(quant::awq_code(&top, 7), 15u);
  for (int o = 0; o < 7; ++o) EXPECT_EQ(quant::awq_code(&top, o), 0u);
  // Nibble 1 (0x...F0) is column 2, nibble 4 (0x...F0000) is column 1.
  const int32_t n1 = 0xF0, n4 = 0xF0000;
  EXPECT_EQ(quant::awq_code(&n1, 2), 15u);
  EXPECT_EQ(quant::awq_code(&n4, 1), 15u);
}

// AutoAWQ's from_linear quantizes intweight = round(w / scale + zero) (scale_zeros = zeros *
// scales added before dividing), so w = (q - zero) * scale; qzeros are packed like qweight.
TEST(AwqPacking, Dequantize) {
  // One input channel (group 1), 8 outputs; qweight [1, 1], qzeros [1, 1] all 2, scales 0.5.
  const int32_t qweight = 0x76543210, qzeros = 0x22222222;
  const std::vector<float> scales(8, 0.5f);
  std::vector<float> out(8);
  quant::dequant_awq(&qweight, &qzeros, scales.data(), /*rows=*/8, /*cols=*/1, /*group=*/1, out.data());
  // codes by column 0, 4, 1, 5, 2, 6, 3, 7 -> (code - 2) * 0.5
  const std::vector<float> want = {-1.0f, 1.0f, -0.5f, 1.5f, 0.0f, 2.0f, 0.5f, 2.5f};
  EXPECT_EQ(out, want);
}

// AutoGPTQ, auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py, QuantLinear.pack: input rows are
// packed 32/bits to a word, `qweight[row] |= intweight[j] << (bits * (j - i))` (row j of the
// group at bits (j - i) * bits); `zeros -= 1` before packing the zeros the same way along the
// output columns, and the forward adds it back (`zeros = zeros + 1`):
// w = scale * (q - (stored_zero + 1)).
TEST(GptqPacking, WeightsAlongInputRows4Bit) {
  // in 8, out 2: qweight [1, 2]; column 0 word 0x76543210 (row k holds k), column 1 0x89ABCDEF
  // (row k holds 15 - k).
  const int32_t qweight[2] = {0x76543210, int32_t(0x89ABCDEFu)};
  for (int k = 0; k < 8; ++k) {
    EXPECT_EQ(quant::gptq_weight_code(qweight, 2, k, 0, 4), uint32_t(k));
    EXPECT_EQ(quant::gptq_weight_code(qweight, 2, k, 1, 4), uint32_t(15 - k));
  }
}

TEST(GptqPacking, WeightsAlongInputRows8Bit) {
  const int32_t qweight[1] = {0x04030201};  // in 4, out 1
  for (int k = 0; k < 4; ++k) EXPECT_EQ(quant::gptq_weight_code(qweight, 1, k, 0, 8), uint32_t(k + 1));
}

TEST(GptqPacking, StoredZeroPlusOne) {
  // qzeros [1, 1]: output 0 stores 7 (zero 8, the symmetric 4-bit zero), output 1 stores 3 (zero 4).
  const int32_t qweight[2] = {0x76543210, int32_t(0x89ABCDEFu)};
  const int32_t qzeros = 0x37;
  EXPECT_EQ(quant::gptq_zero_code(&qzeros, 0, 4), 7u);
  EXPECT_EQ(quant::gptq_zero_code(&qzeros, 1, 4), 3u);
  const float scales[2] = {0.25f, 1.0f};
  const std::vector<int32_t> g_idx(8, 0);
  std::vector<float> out(16);
  quant::dequant_gptq(qweight, &qzeros, scales, g_idx.data(), /*rows=*/2, /*cols=*/8, 4, /*zero_offset=*/1, out.data());
  for (int k = 0; k < 8; ++k) {
    EXPECT_EQ(out[size_t(k)], (float(k) - 8.0f) * 0.25f) << k;      // output 0: (k - 8) / 4
    EXPECT_EQ(out[size_t(8 + k)], float(15 - k) - 4.0f) << k;       // output 1: 11 - k
  }
  // gptq_v2 stores the zero itself.
  quant::dequant_gptq(qweight, &qzeros, scales, g_idx.data(), 2, 8, 4, /*zero_offset=*/0, out.data());
  EXPECT_EQ(out[0], -7.0f * 0.25f);
  EXPECT_EQ(out[8], 15.0f - 3.0f);
}

// Act-order: every input channel takes the scale and zero of its g_idx group, whatever its
// position (AutoGPTQ's qlinear_cuda.py indexes scales[g_idx]).
TEST(GptqPacking, ActOrderGroups) {
  const int32_t qweight = 0x55555555;  // in 8, out 1: every code 5
  const int32_t qzeros[2] = {0x0, 0x2};  // group 0 zero 0 + 1 = 1, group 1 zero 2 + 1 = 3
  const float scales[2] = {1.0f, 10.0f};
  const int32_t g_idx[8] = {1, 0, 0, 1, 1, 0, 1, 0};
  std::vector<float> out(8);
  quant::dequant_gptq(&qweight, qzeros, scales, g_idx, 1, 8, 4, 1, out.data());
  const std::vector<float> want = {20.0f, 4.0f, 4.0f, 20.0f, 20.0f, 4.0f, 20.0f, 4.0f};
  EXPECT_EQ(out, want);
}

// MLX, mlx/backend/cpu/quantized.cpp, _qmm_t: the uint32 words of a row are read byte by byte
// (little endian) and each byte's codes lowest bits first (`wi & bitmask`, then `wi >>= bits`),
// each dequantized as `scale * code + bias` per group of the row. So element c sits at bits
// [(c % (32 / bits)) * bits, ...) of word c / (32 / bits).
TEST(MlxPacking, LowestBitsFirst) {
  const uint32_t w4 = 0x76543210u;
  for (int c = 0; c < 8; ++c) EXPECT_EQ(quant::mlx_code(&w4, c, 4), uint32_t(c));
  const uint32_t w8 = 0x04030201u;
  for (int c = 0; c < 4; ++c) EXPECT_EQ(quant::mlx_code(&w8, c, 8), uint32_t(c + 1));
  const uint32_t w2[2] = {0xE4u, 0x1Bu << 30};  // 0xE4 = 0b11'10'01'00: codes 0, 1, 2, 3; then word 1's top 2 bits
  for (int c = 0; c < 4; ++c) EXPECT_EQ(quant::mlx_code(w2, c, 2), uint32_t(c));
  EXPECT_EQ(quant::mlx_code(w2, 31, 2), 3u);
  EXPECT_EQ(quant::mlx_code(w2, 16 + 15, 2), 3u);
  EXPECT_EQ(quant::mlx_code(w2, 16 + 14, 2), 0u);
}

TEST(MlxPacking, DequantizePerGroup) {
  // 1 row, 16 columns, 4-bit, group 8: words 0x76543210 and 0xFEDCBA98 (codes 0..15).
  const uint32_t w[2] = {0x76543210u, 0xFEDCBA98u};
  const float scales[2] = {0.5f, 2.0f}, biases[2] = {-1.0f, 3.0f};
  std::vector<float> out(16);
  quant::dequant_mlx(w, scales, biases, 1, 16, 4, 8, out.data());
  for (int c = 0; c < 8; ++c) EXPECT_EQ(out[size_t(c)], 0.5f * float(c) - 1.0f) << c;
  for (int c = 8; c < 16; ++c) EXPECT_EQ(out[size_t(c)], 2.0f * float(c) + 3.0f) << c;
}

// transformers' fine-grained FP8 (integrations/finegrained_fp8): weight [rows, cols] times
// scale_inv[r / block_rows, c / block_cols].
TEST(Fp8Block, ScalePerBlock) {
  // 2 x 3 weight, blocks 1 x 2: scale_inv [2, 2]. Codes 0x38 = 1.0, 0x40 = 2.0, 0xb8 = -1.0.
  const uint8_t w[6] = {0x38, 0x40, 0x38, 0xb8, 0x38, 0x40};
  const float s[4] = {1.0f, 10.0f, 0.5f, 3.0f};
  std::vector<float> out(6);
  quant::dequant_fp8_block(w, s, 2, 3, 1, 2, out.data());
  const std::vector<float> want = {1.0f, 2.0f, 10.0f, -0.5f, 0.5f, 6.0f};
  EXPECT_EQ(out, want);
}

std::string config_error(const nlohmann::json& cfg) {
  auto r = parse_quant_config(cfg, "config.json");
  return r.ok() ? std::string("ok") : r.error().to_string();
}

TEST(QuantConfigParse, Formats) {
  auto fp8 = parse_quant_config(nlohmann::json::parse(R"({"quantization_config": {"quant_method": "fp8",
      "weight_block_size": [128, 128], "activation_scheme": "dynamic", "modules_to_not_convert": ["lm_head"]}})"), "c");
  ASSERT_TRUE(fp8.ok());
  EXPECT_EQ(fp8->format, QuantFormat::kFp8Block);
  EXPECT_EQ(fp8->block_rows, 128);
  EXPECT_EQ(fp8->not_converted, std::vector<std::string>{"lm_head"});
  auto mlx = parse_quant_config(nlohmann::json::parse(R"({"quantization": {"group_size": 64, "bits": 4,
      "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8}, "lm_head": false}})"), "c");
  ASSERT_TRUE(mlx.ok()) << mlx.error().to_string();
  EXPECT_EQ(mlx->format, QuantFormat::kMlxAffine);
  EXPECT_EQ(mlx->group_of("model.layers.0.mlp.down_proj").bits, 8);
  EXPECT_EQ(mlx->group_of("model.layers.0.mlp.down_proj").group_size, 32);
  EXPECT_EQ(mlx->group_of("lm_head").bits, 0);
  EXPECT_EQ(mlx->group_of("model.layers.1.mlp.up_proj").bits, 4);
  auto gptq = parse_quant_config(nlohmann::json::parse(R"({"quantization_config": {"quant_method": "gptq", "bits": 4,
      "group_size": 128, "sym": false, "desc_act": true, "checkpoint_format": "gptq_v2"}})"), "c");
  ASSERT_TRUE(gptq.ok());
  EXPECT_FALSE(gptq->gptq_sym);
  EXPECT_TRUE(gptq->gptq_desc_act);
  EXPECT_FALSE(gptq->gptq_zero_plus_one);
  auto none = parse_quant_config(nlohmann::json::parse(R"({"model_type": "llama"})"), "c");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->quantized());
}

TEST(QuantConfigParse, ErrorsNameFieldAndValue) {
  auto has = [](const std::string& e, const std::string& s) { return e.find(s) != std::string::npos; };
  std::string e = config_error(nlohmann::json::parse(R"({"quantization_config": {"quant_method": "hqq"}})"));
  EXPECT_TRUE(has(e, "quantization_config.quant_method") && has(e, "hqq")) << e;
  e = config_error(nlohmann::json::parse(R"({"quantization_config": {"quant_method": "awq", "bits": 3, "group_size": 128}})"));
  EXPECT_TRUE(has(e, "quantization_config.bits") && has(e, "is 3")) << e;
  e = config_error(nlohmann::json::parse(R"({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 100}})"));
  EXPECT_TRUE(has(e, "quantization_config.group_size") && has(e, "is 100")) << e;
  e = config_error(nlohmann::json::parse(R"({"quantization_config": {"quant_method": "gptq", "bits": 4}})"));
  EXPECT_TRUE(has(e, "quantization_config.group_size") && has(e, "missing")) << e;
  e = config_error(nlohmann::json::parse(R"({"quantization": {"group_size": 64, "bits": 4, "mode": "mxfp4"}})"));
  EXPECT_TRUE(has(e, "quantization.mode") && has(e, "mxfp4")) << e;
  e = config_error(nlohmann::json::parse(R"({"quantization": {"group_size": 64, "bits": 5}})"));
  EXPECT_TRUE(has(e, "quantization.bits") && has(e, "is 5")) << e;
  e = config_error(nlohmann::json::parse(R"({"quantization_config": {"quant_method": "compressed-tensors",
      "format": "float-quantized", "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "int",
      "strategy": "channel"}}}}})"));
  EXPECT_TRUE(has(e, "config_groups.group_0.weights.type") && has(e, "int")) << e;
  e = config_error(nlohmann::json::parse(R"({"quantization_config": {"quant_method": "compressed-tensors",
      "format": "pack-quantized", "config_groups": {}}})"));
  EXPECT_TRUE(has(e, "quantization_config.format") && has(e, "pack-quantized")) << e;
}

}  // namespace
}  // namespace strata
