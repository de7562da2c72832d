// Weight-only dequantization of quantized checkpoints at load: the one place a format's
// tensors (codes, scales, zeros, biases, group indices) are read and turned into the f32
// matrix the CPU kernels take. The WeightLoader (model/weight_loader.h) calls
// dequantize_weight for every matrix and embedding of every family; a weight the checkpoint
// stores as floats is left to the loader. The unpacking of each format is exposed for tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/weight.h"
#include "core/status.h"
#include "model/model_config.h"
#include "model/quant_config.h"
#include "model/safetensors.h"

namespace strata {

// Dequantizes the weight `weight_name` ("<module>.weight", the full tensor name) of logical
// shape [rows = n_out, cols = n_in] into out (row-major f32). Returns false, leaving out
// alone, when the checkpoint stores that weight unquantized. Errors name the tensor or the
// config field: a missing scale tensor, a shape that disagrees with the config, bad codes.
Result<bool> dequantize_weight(const QuantConfig& q, const SafetensorsArchive& archive, const std::string& weight_name,
                               int64_t rows, int64_t cols, std::vector<float>* out);

// The weight `weight_name` kept quantized for the CPU kernels (cpu::pack_quant_weight): MLX
// affine 8-bit as kAffine8, 4- and 2-bit as kAffine4; AWQ and GPTQ as kAffine4 / kAffine8 with
// bias = -scale * zero; FP8 as kFp8 with its block (or channel, or tensor) scale per row and group.
// An empty matrix when the checkpoint stores the weight unquantized, or when it has no such form:
// GPTQ act-order (a g_idx other than i / group_size), which dequantize_weight then reads.
// Errors as dequantize_weight's.
Result<WeightMatrix> quantized_weight(const QuantConfig& q, const SafetensorsArchive& archive, const std::string& weight_name,
                                      int64_t rows, int64_t cols);

// The tensor holding the 128x128 block scales of fine-grained FP8 weight `weight_name`
// ("<module>.weight" -> "<module>.weight_scale_inv"); empty when the name is not a module's
// weight. For backends that keep the codes (the GPU's FP8 kernels).
std::string fp8_block_scale_name(const std::string& weight_name);

// Whether `weight_name` is stored in a quantized form (no dequantization).
bool weight_is_quantized(const QuantConfig& q, const SafetensorsArchive& archive, const std::string& weight_name);

// Weight bytes one decoded token reads: every text-model tensor once (the LM head included),
// the embedding table as one row unless it is tied to the head. `stored`: as the checkpoint
// holds them (codes and scales); `loaded`: dequantized (quantized matrices as f32, what
// WeightLoader hands a device backend); `resident`: as the CPU model holds them (quantized
// matrices kept quantized, as quantized_weight packs them; f32 where it dequantizes; vectors and
// f16 as f32). Matrices a family slices at load (the hybrids' fused DeltaNet and gated-attention
// projections) are f32 on the CPU yet counted here as kept quantized.
struct WeightBytesPerToken {
  int64_t stored = 0;    // bytes
  int64_t loaded = 0;    // bytes
  int64_t resident = 0;  // bytes
  int64_t parameters = 0;  // text-model weights, a quantized matrix counted as rows x cols (no scales)
};
WeightBytesPerToken weight_bytes_per_token(const ModelConfig& cfg, const SafetensorsArchive& archive);

namespace quant {

// FP8 block: out[r, c] = e4m3(w[r, c]) * scale_inv[r / block_rows, c / block_cols];
// scale_inv is [ceil(rows / block_rows), ceil(cols / block_cols)].
void dequant_fp8_block(const uint8_t* w, const float* scale_inv, int64_t rows, int64_t cols, int32_t block_rows,
                       int32_t block_cols, float* out);

// MLX affine: row r of w holds cols codes of `bits` bits packed into uint32 words lowest bits
// first (code c of the row at bits [(c % per) * bits, ...) of word c / per, per = 32 / bits);
// out[r, c] = scales[r, c / group] * code + biases[r, c / group].
uint32_t mlx_code(const uint32_t* row, int64_t c, int32_t bits);
void dequant_mlx(const uint32_t* w, const float* scales, const float* biases, int64_t rows, int64_t cols, int32_t bits,
                 int32_t group, float* out);

// AWQ GEMM: qweight [cols = n_in, rows / 8] int32, each word holding 8 output columns whose
// nibble i is column kAwqOrder[i] of the 8; qzeros [n_in / group, rows / 8] packed the same.
// out[o, i] = (q[i, o] - z[i / group, o]) * scales[i / group, o].
uint32_t awq_code(const int32_t* packed_row, int64_t o);
void dequant_awq(const int32_t* qweight, const int32_t* qzeros, const float* scales, int64_t rows, int64_t cols,
                 int32_t group, float* out);

// GPTQ: qweight [n_in / per, n_out] int32 (input rows packed per = 32 / bits to a word, lowest
// bits first), qzeros [n_groups, n_out / per] (output columns packed the same), scales
// [n_groups, n_out], g_idx [n_in] (the group of each input channel: act-order permutes them).
// out[o, i] = (q[i, o] - (z[g_idx[i], o] + zero_offset)) * scales[g_idx[i], o], zero_offset 1 in
// the gptq checkpoint format (it stores zero - 1), 0 in gptq_v2.
uint32_t gptq_weight_code(const int32_t* qweight, int64_t n_out, int64_t i, int64_t o, int32_t bits);
uint32_t gptq_zero_code(const int32_t* qzeros_row, int64_t o, int32_t bits);
void dequant_gptq(const int32_t* qweight, const int32_t* qzeros, const float* scales, const int32_t* g_idx, int64_t rows,
                  int64_t cols, int32_t bits, int32_t zero_offset, float* out);

}  // namespace quant
}  // namespace strata
