// float8_e4m3fn decoding, pinned code by code. The expected values are derived by hand from the
// format's definition (OCP 8-bit floating point spec, E4M3: exponent bias 7, no infinities, only
// S.1111.111 is NaN) by building the f32 bit pattern directly, not by evaluating m * 2^e.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "tensor/dtype.h"

namespace strata {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Code -> f32 by re-biasing the exponent (7 -> 127) and moving the 3 mantissa bits to the top
// of f32's 23; exponent 0 codes are subnormal: m/8 * 2^-6 = m * 2^-9, i.e. 0, 2^-9, 2^-8,
// 1.5 * 2^-8, 2^-7, 1.25 * 2^-7, 1.5 * 2^-7, 1.75 * 2^-7.
float expected(uint8_t b) {
  const uint32_t s = uint32_t(b >> 7) << 31, e = (b >> 3) & 0xf, m = b & 7;
  if (e != 0) return from_bits(s | ((e - 7 + 127) << 23) | (m << 20));
  static const float kSub[8] = {0.0f, 0.001953125f, 0.00390625f, 0.005859375f, 0.0078125f, 0.009765625f, 0.01171875f, 0.013671875f};
  return s ? -kSub[m] : kSub[m];
}

TEST(Fp8E4m3fn, AllCodes) {
  for (int i = 0; i < 256; ++i) {
    const uint8_t b = uint8_t(i);
    const float got = fp8_e4m3fn_to_f32(b);
    if ((b & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(got)) << "code " << i;
      continue;
    }
    const float want = expected(b);
    uint32_t gu, wu;
    std::memcpy(&gu, &got, 4);
    std::memcpy(&wu, &want, 4);
    EXPECT_EQ(gu, wu) << "code 0x" << std::hex << i << ": got " << got << ", want " << want;
  }
}

TEST(Fp8E4m3fn, NamedValues) {
  EXPECT_EQ(fp8_e4m3fn_to_f32(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(fp8_e4m3fn_to_f32(0x80)));  // -0
  EXPECT_EQ(fp8_e4m3fn_to_f32(0x01), 0.001953125f);     // smallest subnormal 2^-9
  EXPECT_EQ(fp8_e4m3fn_to_f32(0x07), 0.013671875f);     // largest subnormal 7 * 2^-9
  EXPECT_EQ(fp8_e4m3fn_to_f32(0x08), 0.015625f);        // smallest normal 2^-6
  EXPECT_EQ(fp8_e4m3fn_to_f32(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3fn_to_f32(0x39), 1.125f);
  EXPECT_EQ(fp8_e4m3fn_to_f32(0x40), 2.0f);
  EXPECT_EQ(fp8_e4m3fn_to_f32(0x77), 240.0f);           // 1.875 * 2^7
  EXPECT_EQ(fp8_e4m3fn_to_f32(0x78), 256.0f);           // exponent 15 is finite in e4m3fn
  EXPECT_EQ(fp8_e4m3fn_to_f32(0x7e), 448.0f);           // largest finite
  EXPECT_EQ(fp8_e4m3fn_to_f32(0xfe), -448.0f);
  EXPECT_EQ(fp8_e4m3fn_to_f32(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3fn_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3fn_to_f32(0xff)));
}

TEST(Fp8E4m3fn, PositiveCodesStrictlyIncrease) {
  for (int i = 1; i < 0x7f; ++i) EXPECT_LT(fp8_e4m3fn_to_f32(uint8_t(i - 1)), fp8_e4m3fn_to_f32(uint8_t(i))) << i;
}

}  // namespace
}  // namespace strata
