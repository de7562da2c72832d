// QuantConfig: the quantized-weight format a checkpoint declares in config.json
// (`quantization_config`, or MLX's `quantization`), normalized to one description the
// loader's dequantizers (model/quant.h) read. Parsing validates every field a format needs, so
// an unknown quant_method, bits or group size fails at load naming the field and its value.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace strata {

enum class QuantFormat : uint8_t {
  kNone,
  kFp8Block,       // quant_method fp8: float8_e4m3fn + weight_scale_inv per block
  kFp8Compressed,  // quant_method compressed-tensors, float-quantized: float8_e4m3fn + weight_scale
  kMlxAffine,      // MLX: uint32-packed codes, scales and biases per group
  kAwq,            // quant_method awq, GEMM layout
  kGptq,           // quant_method gptq
};

const char* quant_format_name(QuantFormat f);

// A module's own bits and group size (MLX per-layer overrides).
struct QuantGroup {
  int32_t bits = 0;
  int32_t group_size = 0;
};

struct QuantConfig {
  QuantFormat format = QuantFormat::kNone;
  int32_t bits = 0;        // 8 for FP8; 4 or 8 for the integer formats
  int32_t group_size = 0;  // elements sharing a scale along the input dim; 0: per channel / tensor
  int32_t block_rows = 0, block_cols = 0;  // kFp8Block: weight_block_size
  std::string fp8_strategy;                // kFp8Compressed: "tensor" or "channel"
  bool gptq_sym = true;                    // kGptq: symmetric (zero 2^(bits-1))
  bool gptq_desc_act = false;              // kGptq: act-order (g_idx is a permutation's groups)
  bool gptq_zero_plus_one = true;          // kGptq: stored zeros are zero - 1 (checkpoint_format gptq, not gptq_v2)
  std::vector<std::string> not_converted;  // modules_to_not_convert / ignore, as listed (the checkpoint stores them as floats)
  std::map<std::string, QuantGroup> mlx_overrides;  // MLX: module path -> its own bits/group size (bits 0: unquantized)

  bool quantized() const { return format != QuantFormat::kNone; }
  // The bits and group size of `module` (MLX overrides, else the config's).
  QuantGroup group_of(const std::string& module) const;
  // "fp8 (block 128x128)", "mlx affine 4-bit, group 64", ...; "none" when unquantized.
  std::string describe() const;
};

// The quantization of a config.json object (the outer one: a wrapper's quantization_config sits
// beside text_config). kNone when it declares none; `source` names the file in errors.
Result<QuantConfig> parse_quant_config(const nlohmann::json& config, const std::string& source);

}  // namespace strata
