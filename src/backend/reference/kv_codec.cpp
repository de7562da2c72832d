// Scalar definitions of the KV row formats (see kv_codec.h).
#include "backend/reference/kv_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "tensor/dtype.h"

namespace strata {

namespace {

bool is_pow2(int32_t x) { return x > 0 && (x & (x - 1)) == 0; }
int64_t round4(int64_t b) { return (b + 3) / 4 * 4; }

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

// Max (1960), 8 levels for a unit-variance Gaussian; the decision thresholds are the midpoints.
const float kLloydMax3[8] = {-2.1520f, -1.3440f, -0.7560f, -0.2451f, 0.2451f, 0.7560f, 1.3440f, 2.1520f};

// 2^(j/16), j = 0..15, each the float nearest to it.
const float kKvFp8ScaleSteps[kKvFp8ScaleCandidates] = {
    1.0f,       1.0442737f, 1.0905077f, 1.1387886f, 1.1892071f, 1.2418578f, 1.2968396f, 1.3542556f,
    1.4142135f, 1.4768262f, 1.5422108f, 1.6104903f, 1.6817929f, 1.7562522f, 1.8340081f, 1.9152066f};

// 2^(j/32), j = -8..8, each the float nearest to it.
const float kKvTurboScaleSteps[kKvTurboScaleCandidates] = {
    0.8408964f, 0.8593097f, 0.8781261f, 0.89735454f, 0.91700405f, 0.93708384f, 0.9576033f, 0.9785721f, 1.0f,
    1.0218972f, 1.0442737f, 1.0671405f, 1.0905077f,  1.1143868f,  1.1387886f,  1.1637249f, 1.1892071f};

const char* kv_codec_name(KvCodec c) {
  switch (c) {
    case KvCodec::kAuto: return "auto";
    case KvCodec::kBf16: return "bf16";
    case KvCodec::kFp8: return "fp8";
    case KvCodec::kInt8: return "int8";
    case KvCodec::kInt4: return "int4";
    case KvCodec::kTurbo: return "turbo";
  }
  return "?";
}

int64_t KvRowFormat::bytes() const {
  const int64_t d = dim;
  switch (kind) {
    case KvRowKind::kF32: return 4 * d;
    case KvRowKind::kBf16: return round4(2 * d);
    case KvRowKind::kFp8: return 4 + round4(d);
    case KvRowKind::kAffine8: return round4(d) + round4(4 * int64_t(n_groups()));
    case KvRowKind::kAffine4: return round4((d + 1) / 2) + round4(4 * int64_t(n_groups()));
    case KvRowKind::kTurbo3: return 4 + round4((3 * d + 7) / 8);
  }
  return 0;
}

int32_t kv_default_group(KvCodec c, int32_t dim) {
  switch (c) {
    case KvCodec::kInt8:
    case KvCodec::kInt4: return std::min(64, dim);
    case KvCodec::kTurbo: return std::min(32, dim);
    default: return 0;
  }
}

KvRowFormat kv_key_format(const KvCodecSpec& spec, int32_t dim) {
  if (spec.part == KvCodecPart::kValuesOnly) return {KvRowKind::kF32, dim, 0};
  const int32_t g = spec.group_size > 0 ? spec.group_size : kv_default_group(spec.codec, dim);
  switch (spec.codec) {
    case KvCodec::kAuto: return {KvRowKind::kF32, dim, 0};
    case KvCodec::kBf16: return {KvRowKind::kBf16, dim, 0};
    case KvCodec::kFp8: return {KvRowKind::kFp8, dim, 0};
    case KvCodec::kInt8:
    case KvCodec::kTurbo: return {KvRowKind::kAffine8, dim, g};
    case KvCodec::kInt4: return {KvRowKind::kAffine4, dim, g};
  }
  return {};
}

KvRowFormat kv_value_format(const KvCodecSpec& spec, int32_t dim) {
  if (spec.part == KvCodecPart::kKeysOnly) return {KvRowKind::kF32, dim, 0};
  if (spec.codec == KvCodec::kTurbo) return {KvRowKind::kTurbo3, dim, 0};
  return kv_key_format({spec.codec, spec.group_size}, dim);
}

const char* kv_format_problem(const KvRowFormat& f) {
  if (f.dim <= 0) return "head dim must be positive";
  switch (f.kind) {
    case KvRowKind::kAffine8:
    case KvRowKind::kAffine4:
      if (f.group <= 0 || f.dim % f.group != 0) return "group size must divide the head dim";
      if (f.kind == KvRowKind::kAffine8 && f.dim % 4 != 0) return "int8 packing needs a head dim divisible by 4";
      if (f.kind == KvRowKind::kAffine4 && f.dim % 8 != 0) return "int4 packing needs a head dim divisible by 8";
      return "";
    case KvRowKind::kTurbo3:
      if (!is_pow2(f.dim) || f.dim < 8) return "turbo needs a power-of-two head dim of at least 8";
      return "";
    default: return "";
  }
}

uint64_t kv_rotation_seed(int32_t layer, int32_t kv_head) {
  return splitmix(0x7475726271756e74ull ^ (uint64_t(uint32_t(layer)) << 32) ^ uint64_t(uint32_t(kv_head)));
}

void kv_rotation_signs(uint64_t seed, int32_t dim, float* signs) {
  uint64_t bits = 0;
  for (int32_t d = 0; d < dim; ++d) {
    if (d % 64 == 0) bits = splitmix(seed + uint64_t(d / 64));
    signs[d] = ((bits >> (d % 64)) & 1u) ? -1.0f : 1.0f;
  }
}

uint8_t f32_to_e4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  float a = std::fabs(x);
  if (!(a < 448.0f)) a = 448.0f;  // saturate (NaN included: the codec never stores NaN)
  if (a < 0.015625f) {            // below 2^-6: subnormals m * 2^-9; m == 8 is the smallest normal
    return uint8_t(sign | uint8_t(std::nearbyint(a * 512.0f)));
  }
  int e = 0;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1): a = 1.m * 2^(e - 1)
  int q = int(std::nearbyint(std::ldexp(a, 3 - (e - 1))));  // in [8, 16], ties to even
  int biased = e - 1 + 7;
  if (q == 16) {
    q = 8;
    ++biased;
  }
  return uint8_t(sign | uint8_t(biased << 3) | uint8_t(q - 8));
}

float e4m3_to_f32(uint8_t c) {
  const int biased = (c >> 3) & 15, m = c & 7;
  const float mag = biased == 0 ? std::ldexp(float(m), -9) : std::ldexp(1.0f + float(m) / 8.0f, biased - 7);
  return (c & 0x80) ? -mag : mag;
}

}  // namespace strata

namespace strata::reference {

namespace {

void fwht(float* x, int32_t n) {
  for (int32_t len = 1; len < n; len <<= 1) {
    for (int32_t i = 0; i < n; i += 2 * len) {
      for (int32_t j = i; j < i + len; ++j) {
        const float a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
    }
  }
}

// Affine groups: q = clamp(round((x - bias) / scale), 0, qmax), with scale and bias already
// rounded to their stored bf16 values so decoding sees the grid the codes were chosen on.
void encode_affine(const KvRowFormat& f, const float* x, uint8_t* row, int qmax) {
  const int64_t packed = f.kind == KvRowKind::kAffine8 ? (f.dim + 3) / 4 * 4 : (f.dim + 7) / 8 * 4;
  std::memset(row, 0, size_t(f.bytes()));
  bf16_t* scales = reinterpret_cast<bf16_t*>(row + packed);
  bf16_t* biases = scales + f.n_groups();
  for (int32_t g = 0; g < f.n_groups(); ++g) {
    const float* xg = x + int64_t(g) * f.group;
    float mn = xg[0], mx = xg[0];
    for (int32_t i = 1; i < f.group; ++i) mn = std::min(mn, xg[i]), mx = std::max(mx, xg[i]);
    const bf16_t s16 = f32_to_bf16((mx - mn) / float(qmax)), b16 = f32_to_bf16(mn);
    scales[g] = s16;
    biases[g] = b16;
    const float s = bf16_to_f32(s16), b = bf16_to_f32(b16);
    for (int32_t i = 0; i < f.group; ++i) {
      const int64_t d = int64_t(g) * f.group + i;
      const int q = s > 0.0f ? std::clamp(int(std::nearbyint((xg[i] - b) / s)), 0, qmax) : 0;
      if (f.kind == KvRowKind::kAffine8) {
        row[d] = uint8_t(q);
      } else {
        row[d / 2] |= uint8_t(q << (4 * (d % 2)));
      }
    }
  }
}

void decode_affine(const KvRowFormat& f, const uint8_t* row, float* x) {
  const int64_t packed = f.kind == KvRowKind::kAffine8 ? (f.dim + 3) / 4 * 4 : (f.dim + 7) / 8 * 4;
  const bf16_t* scales = reinterpret_cast<const bf16_t*>(row + packed);
  const bf16_t* biases = scales + f.n_groups();
  for (int32_t d = 0; d < f.dim; ++d) {
    const int32_t g = d / f.group;
    const int q = f.kind == KvRowKind::kAffine8 ? row[d] : (row[d / 2] >> (4 * (d % 2))) & 15;
    x[d] = float(q) * bf16_to_f32(scales[g]) + bf16_to_f32(biases[g]);
  }
}

int nearest_level(float z) {
  int c = 0;
  while (c < 7 && z > 0.5f * (kLloydMax3[c] + kLloydMax3[c + 1])) ++c;
  return c;
}

// The encoders' sums (<y, c>, <c, c>, |y|^2) in one fixed order, shared with the GPU encoder
// (one warp per row, lane l holding dims l, l + 32, ...): 32 partial sums in double, dim d
// going to partial d % 32 in index order, then combined pairwise as the warp's xor butterfly
// does (partial l += partial l + o for o = 16, 8, 4, 2, 1; the sum is partial 0). Every
// product is exact in double (a float times an e4m3 value or a float level, or a float
// squared), so only the additions round, and any implementation following this order gets the
// same bits.
constexpr int kSumLanes = 32;

struct LaneSum {
  double p[kSumLanes] = {};
  void add(int32_t d, double v) { p[d % kSumLanes] += v; }
  double total() {
    for (int o = kSumLanes / 2; o > 0; o >>= 1) {
      for (int l = 0; l < o; ++l) p[l] += p[l + o];
    }
    return p[0];
  }
};

// c being the codes' values at unit scale.
struct Fit {
  double yc = 0.0, cc = 0.0;
  // Squared error after the least-squares rescale is |y|^2 - yc^2 / cc: larger is better.
  double score() const { return yc * yc / cc; }
};

// e4m3 codes of y / s.
Fit fp8_fit(const float* y, int32_t dim, float s) {
  const float inv = 1.0f / s;
  LaneSum yc, cc;
  for (int32_t d = 0; d < dim; ++d) {
    const double c = e4m3_to_f32(f32_to_e4m3(y[d] * inv));
    yc.add(d, double(y[d]) * c);
    cc.add(d, c * c);
  }
  return {yc.total(), cc.total()};
}

// Lloyd-Max codes of y / s.
Fit turbo_fit(const float* y, int32_t dim, float s) {
  const float inv = 1.0f / s;
  LaneSum yc, cc;
  for (int32_t d = 0; d < dim; ++d) {
    const double c = kLloydMax3[nearest_level(y[d] * inv)];
    yc.add(d, double(y[d]) * c);
    cc.add(d, c * c);
  }
  return {yc.total(), cc.total()};
}

}  // namespace

void kv_rotate(float* x, int32_t dim, const float* signs) {
  for (int32_t d = 0; d < dim; ++d) x[d] *= signs[d];
  fwht(x, dim);
  const float norm = 1.0f / std::sqrt(float(dim));
  for (int32_t d = 0; d < dim; ++d) x[d] *= norm;
}

void kv_unrotate(float* x, int32_t dim, const float* signs) {
  fwht(x, dim);
  const float norm = 1.0f / std::sqrt(float(dim));
  for (int32_t d = 0; d < dim; ++d) x[d] *= norm * signs[d];
}

void kv_encode_row(const KvRowFormat& f, const float* x, uint8_t* row, uint64_t seed) {
  switch (f.kind) {
    case KvRowKind::kF32: std::memcpy(row, x, size_t(f.dim) * 4); return;
    case KvRowKind::kBf16: {
      std::memset(row, 0, size_t(f.bytes()));
      bf16_t* r = reinterpret_cast<bf16_t*>(row);
      for (int32_t d = 0; d < f.dim; ++d) r[d] = f32_to_bf16(x[d]);
      return;
    }
    case KvRowKind::kFp8: {
      std::memset(row, 0, size_t(f.bytes()));
      float amax = 0.0f;
      for (int32_t d = 0; d < f.dim; ++d) amax = std::max(amax, std::fabs(x[d]));
      const float base = amax / 448.0f;
      // The codes come from the candidate scale whose codes leave the least squared error
      // after the least-squares rescale (first wins ties); that rescale is the stored scale.
      float pick = base, scale = base;
      if (base > 0.0f) {
        double best = 0.0;
        for (int i = 0; i < kKvFp8ScaleCandidates; ++i) {
          const float s = base * kKvFp8ScaleSteps[i];
          const Fit fit = fp8_fit(x, f.dim, s);
          if (fit.score() > best) best = fit.score(), pick = s, scale = float(fit.yc / fit.cc);
        }
      }
      std::memcpy(row, &scale, 4);
      const float inv = pick > 0.0f ? 1.0f / pick : 0.0f;
      for (int32_t d = 0; d < f.dim; ++d) row[4 + d] = f32_to_e4m3(x[d] * inv);
      return;
    }
    case KvRowKind::kAffine8: encode_affine(f, x, row, 255); return;
    case KvRowKind::kAffine4: encode_affine(f, x, row, 15); return;
    case KvRowKind::kTurbo3: {
      std::memset(row, 0, size_t(f.bytes()));
      float y[1024], signs[1024] = {};  // zeroed: GCC cannot see kv_rotation_signs fill it
      STRATA_CHECK(f.dim <= 1024, "turbo head dim above 1024");
      kv_rotation_signs(seed, f.dim, signs);
      std::memcpy(y, x, size_t(f.dim) * 4);
      kv_rotate(y, f.dim, signs);
      LaneSum sum_sq;
      for (int32_t d = 0; d < f.dim; ++d) sum_sq.add(d, double(y[d]) * double(y[d]));
      const double ss = sum_sq.total();
      const float rms = float(std::sqrt(ss / double(f.dim)));
      // Codes: those of the candidate scale rms * step with the least squared error after the
      // least-squares rescale (first wins ties), refit twice (scale <y, c> / <c, c>, codes
      // re-picked). Stored scale |y|^2 / <y, c>: the decoded vector's projection on y is y's
      // length (no shrinkage toward zero).
      float pick = rms, scale = rms;
      if (rms > 0.0f) {
        double best = 0.0;
        for (int i = 0; i < kKvTurboScaleCandidates; ++i) {
          const float s = rms * kKvTurboScaleSteps[i];
          const double score = turbo_fit(y, f.dim, s).score();
          if (score > best) best = score, pick = s;
        }
        for (int it = 0; it < 2; ++it) {
          const Fit fit = turbo_fit(y, f.dim, pick);
          pick = float(fit.yc / fit.cc);
        }
        const Fit fit = turbo_fit(y, f.dim, pick);
        scale = float(ss / fit.yc);
      }
      std::memcpy(row, &scale, 4);
      const float inv = pick > 0.0f ? 1.0f / pick : 0.0f;
      uint8_t* codes = row + 4;
      for (int32_t d = 0; d < f.dim; ++d) {
        const uint32_t c = uint32_t(nearest_level(y[d] * inv));
        const int64_t bit = 3 * int64_t(d);
        codes[bit / 8] |= uint8_t(c << (bit % 8));
        if (bit % 8 > 5) codes[bit / 8 + 1] |= uint8_t(c >> (8 - bit % 8));
      }
      return;
    }
  }
}

void kv_decode_row(const KvRowFormat& f, const uint8_t* row, float* x, uint64_t seed, bool rotated) {
  switch (f.kind) {
    case KvRowKind::kF32: std::memcpy(x, row, size_t(f.dim) * 4); return;
    case KvRowKind::kBf16: {
      const bf16_t* r = reinterpret_cast<const bf16_t*>(row);
      for (int32_t d = 0; d < f.dim; ++d) x[d] = bf16_to_f32(r[d]);
      return;
    }
    case KvRowKind::kFp8: {
      float scale;
      std::memcpy(&scale, row, 4);
      for (int32_t d = 0; d < f.dim; ++d) x[d] = e4m3_to_f32(row[4 + d]) * scale;
      return;
    }
    case KvRowKind::kAffine8:
    case KvRowKind::kAffine4: decode_affine(f, row, x); return;
    case KvRowKind::kTurbo3: {
      float scale;
      std::memcpy(&scale, row, 4);
      const uint8_t* codes = row + 4;
      for (int32_t d = 0; d < f.dim; ++d) {
        const int64_t bit = 3 * int64_t(d);
        uint32_t c = uint32_t(codes[bit / 8]) >> (bit % 8);
        if (bit % 8 > 5) c |= uint32_t(codes[bit / 8 + 1]) << (8 - bit % 8);
        x[d] = kLloydMax3[c & 7u] * scale;
      }
      if (!rotated) {
        float signs[1024];
        STRATA_CHECK(f.dim <= 1024, "turbo head dim above 1024");
        kv_rotation_signs(seed, f.dim, signs);
        kv_unrotate(x, f.dim, signs);
      }
      return;
    }
  }
}

}  // namespace strata::reference
