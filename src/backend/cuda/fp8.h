// FP8 (float8_e4m3fn) weights and activations on the GPU, as fine-grained FP8 checkpoints
// (transformers' `quant_method: fp8`, DeepSeek-V3) store them: one f32 scale per 128x128 block
// of a weight matrix [n, k], weight = code * scale[(row / 128) * ceil(k / 128) + col / 128]
// (the checkpoint's weight_scale_inv, row-major). Activations feeding an FP8 GEMM are quantized
// per token and group of 128 columns at run time (dynamic), scale = amax / 448.
// The decode GEMV reads FP8 weights directly (GemvArgs::w_scale); the prefill GEMM quantizes
// its input and runs cuBLASLt's block-scaled FP8 matmul (gemm.h). The parity tests
// (tests/gpu/gpu_fp8_test.cpp) decode the codes on the host as their reference.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::cuda {

constexpr int64_t kFp8Block = 128;    // rows and columns of a weight scale block; columns of an activation group
constexpr float kFp8Max = 448.0f;     // largest finite e4m3fn value

inline int64_t fp8_blocks(int64_t n) { return (n + kFp8Block - 1) / kFp8Block; }

// w bf16 [n, k] -> codes [n, k] and scales [fp8_blocks(n), fp8_blocks(k)] row-major: each
// block's scale is its amax / 448 (1 for an all-zero block), codes round to nearest, saturating.
void launch_quantize_fp8_blocks(const uint16_t* w, uint8_t* codes, float* scales, int64_t n, int64_t k,
                                cudaStream_t stream);
// x bf16 [m, k] -> codes [m, k] and one scale per row r and column group g (amax / 448, at
// least 1e-10 / 448), stored at scales[r * row_stride + g * group_stride]. k % 8 == 0.
void launch_quantize_fp8_rows(const uint16_t* x, uint8_t* codes, float* scales, int64_t m, int64_t k,
                              int64_t row_stride, int64_t group_stride, cudaStream_t stream);

}  // namespace strata::cuda
