// Element types of weights, activations and KV, with scalar conversions.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace strata {

enum class DType : uint8_t { kF32, kBF16, kF16, kF8E4M3, kI8, kI4, kI32, kI64, kU8, kBool, kU32 };

const char* dtype_name(DType t);
// Size of one element in bytes; packed int4 reports 1 (two per byte: use dtype_row_bytes).
size_t dtype_size(DType t);
// Bytes of a row of n elements.
size_t dtype_row_bytes(DType t, int64_t n);
// Parses safetensors dtype names ("F32", "BF16", "F16", "F8_E4M3", "I8", ...). False if unknown.
bool dtype_from_safetensors(std::string_view name, DType* out);

using bf16_t = uint16_t;  // raw bits of a bfloat16
using f16_t = uint16_t;   // raw bits of an IEEE half

inline float bf16_to_f32(bf16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline bf16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_t(u >> 16);
}

float f16_to_f32(f16_t h);

// float8_e4m3fn (1 sign, 4 exponent bits of bias 7, 3 mantissa bits; no infinities, S.1111.111
// is NaN, the largest finite is ±448, exponent 0 is subnormal: m/8 * 2^-6), exactly.
float fp8_e4m3fn_to_f32(uint8_t b);
f16_t f32_to_f16(float f);

}  // namespace strata
