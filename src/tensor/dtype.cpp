#include "tensor/dtype.h"

#include <cmath>
#include <limits>

namespace strata {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kF8E4M3: return "fp8_e4m3";
    case DType::kI8: return "i8";
    case DType::kI4: return "i4";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
    case DType::kBool: return "bool";
    case DType::kU32: return "u32";
  }
  return "?";
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: case DType::kU32: return 4;
    case DType::kBF16: case DType::kF16: return 2;
    case DType::kI64: return 8;
    default: return 1;
  }
}

size_t dtype_row_bytes(DType t, int64_t n) {
  if (t == DType::kI4) return size_t((n + 1) / 2);
  return size_t(n) * dtype_size(t);
}

bool dtype_from_safetensors(std::string_view name, DType* out) {
  struct Entry { std::string_view name; DType t; };
  static constexpr Entry kTable[] = {
      {"F32", DType::kF32}, {"BF16", DType::kBF16}, {"F16", DType::kF16},
      {"F8_E4M3", DType::kF8E4M3}, {"I8", DType::kI8}, {"I32", DType::kI32},
      {"I64", DType::kI64}, {"U8", DType::kU8}, {"BOOL", DType::kBool}, {"U32", DType::kU32},
  };
  for (const auto& e : kTable) {
    if (e.name == name) {
      *out = e.t;
      return true;
    }
  }
  return false;
}

float f16_to_f32(f16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      u = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float fp8_e4m3fn_to_f32(uint8_t b) {
  const uint32_t e = (b >> 3) & 0xf, m = b & 0x7;
  if (e == 0xf && m == 0x7) return std::numeric_limits<float>::quiet_NaN();
  const float mag = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(float(8 + m), int(e) - 10);
  return (b & 0x80) ? -mag : mag;
}

f16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000;
  const int32_t exp = int32_t((u >> 23) & 0xff) - 127 + 15;
  uint32_t mant = u & 0x7fffff;
  if (((u >> 23) & 0xff) == 0xff) return f16_t(sign | 0x7c00 | (mant ? 0x200 : 0));
  if (exp >= 31) return f16_t(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return f16_t(sign);
    mant |= 0x800000;
    const int shift = 14 - exp;
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return f16_t(sign | half);
  }
  uint32_t half = sign | (uint32_t(exp) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;  // may carry into exponent: correct
  return f16_t(half);
}

}  // namespace strata
