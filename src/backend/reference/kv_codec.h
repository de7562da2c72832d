// KV codecs: the byte format of one cached row (one token of one KV head) under each codec,
// and the plain scalar encode/decode/attention that define them. Optimized kernels
// (backend/cpu/kv_codec.h, CUDA) must match these. The per-layer choice and its parsing live in
// src/kv/codec; the format sits here because the model's KV storage and the kernels below the
// kv layer both read it.
//
// Row formats (dim = head dim; every row is a whole number of 4-byte words):
//   f32      dim x f32
//   bf16     dim x bf16
//   fp8      f32 scale, then dim x e4m3 (OCP, max 448): x = e4m3 * scale. The encoder tries
//            the scales amax / 448 * 2^(j/16), j = 0..15 (kKvFp8ScaleSteps: none clips the
//            largest element, and they cover every alignment of the row to the e4m3 grid;
//            larger ones only push small elements into subnormals); each gives codes
//            e4m3(x / s) and their least-squares scale <x,c>/<c,c> (c the codes' values at
//            unit scale). It keeps the codes whose rescaled row has the least squared error
//            (the first candidate on ties) and stores that least-squares scale. All-zero rows:
//            scale 0, codes 0.
//   affine8  dim bytes packed as MLX packs 8-bit (uint32 words, 4 values, low bits first),
//            then n_groups bf16 scales, then n_groups bf16 biases: x = q * scale + bias
//   affine4  dim / 2 bytes packed as MLX packs 4-bit (uint32 words, 8 values, low bits
//            first), then the scales and biases as for affine8
//   turbo3   f32 scale, then dim 3-bit Lloyd-Max codes (unit Gaussian codebook), 8 codes per
//            3 bytes, low bits first: y = level[code] * scale. The codes hold the vector after
//            a sign-randomized Walsh-Hadamard rotation y = H (s . x) / sqrt(dim); the signs s
//            come from a seed fixed per layer and KV head. The encoder picks the codes
//            nearest to y / p: p starts as the candidate rms(y) * 2^(j/32), j = -8..8
//            (kKvTurboScaleSteps), whose codes leave the least squared error after their
//            least-squares rescale <y,c>/<c,c> (the first on ties), then is refit twice (p set
//            to <y,c>/<c,c> of the codes at p). The stored scale is |y|^2 / <y,c>, so the
//            decoded vector's projection on y has y's length. Zero vectors: scale 0, code 3.
//   The searches' sums (<x,c>, <c,c>, |y|^2, in double) follow one fixed order, 32
//   lane-strided partials combined pairwise (kv_codec.cpp), so every encoder writes the same
//   bytes.
#pragma once

#include <cstdint>

namespace strata {

// The per-layer choice. kAuto is the compute dtype (f32 on the CPU).
enum class KvCodec : uint8_t { kAuto, kBf16, kFp8, kInt8, kInt4, kTurbo };

// Which of a layer's rows the codec stores; the other side stays f32. Only for accuracy
// analysis (bench_kv_accuracy splits a codec's error into its key and value parts): the flags
// always give kBoth.
enum class KvCodecPart : uint8_t { kBoth, kKeysOnly, kValuesOnly };

struct KvCodecSpec {
  KvCodec codec = KvCodec::kAuto;
  int32_t group_size = 0;  // affine groups along the head dim (int8/int4/turbo keys); 0: codec default
  KvCodecPart part = KvCodecPart::kBoth;
  bool operator==(const KvCodecSpec&) const = default;
};

const char* kv_codec_name(KvCodec c);  // "auto", "bf16", "fp8", "int8", "int4", "turbo"

enum class KvRowKind : uint8_t { kF32, kBf16, kFp8, kAffine8, kAffine4, kTurbo3 };

struct KvRowFormat {
  KvRowKind kind = KvRowKind::kF32;
  int32_t dim = 0;    // head dim
  int32_t group = 0;  // affine group size (affine kinds only)
  int64_t bytes() const;  // bytes of one row, a multiple of 4
  int32_t n_groups() const { return group > 0 ? dim / group : 0; }
  bool operator==(const KvRowFormat&) const = default;
};

// The group size a codec uses for head dim `dim` when the spec leaves it 0:
// min(64, dim) for int8/int4, min(32, dim) for the turbo keys, 0 otherwise.
int32_t kv_default_group(KvCodec c, int32_t dim);
// Row formats of keys and values under `spec` (turbo: affine8 keys, turbo3 values).
KvRowFormat kv_key_format(const KvCodecSpec& spec, int32_t head_dim_k);
KvRowFormat kv_value_format(const KvCodecSpec& spec, int32_t head_dim_v);
// Empty when `spec` can encode rows of this head dim, else why not (group does not divide the
// dim, int4 needs dim % 8 == 0, turbo needs a power-of-two dim >= 8, ...).
const char* kv_format_problem(const KvRowFormat& f);

// Seed of the turbo rotation signs of (layer, kv head): fixed, so cached rows stay readable.
uint64_t kv_rotation_seed(int32_t layer, int32_t kv_head);
// The rotation's signs (+1 / -1) for `seed`: signs[dim].
void kv_rotation_signs(uint64_t seed, int32_t dim, float* signs);

// Scalar e4m3 conversions (round to nearest even, saturating at +-448).
uint8_t f32_to_e4m3(float x);
float e4m3_to_f32(uint8_t c);

// The 8 reconstruction levels of the 3-bit Lloyd-Max quantizer for N(0, 1), ascending.
extern const float kLloydMax3[8];

// The encoders' candidate scale multipliers (see the row formats above), ascending:
// 2^(j/16) for j = 0..15 (fp8) and 2^(j/32) for j = -8..8 (turbo3), as the nearest floats.
// Products base * step are rounded once, in float: other encoders must form them the same way.
constexpr int kKvFp8ScaleCandidates = 16;
constexpr int kKvTurboScaleCandidates = 17;
extern const float kKvFp8ScaleSteps[kKvFp8ScaleCandidates];
extern const float kKvTurboScaleSteps[kKvTurboScaleCandidates];

}  // namespace strata

namespace strata::reference {

// Encodes x [f.dim] into row [f.bytes()]. `seed`: kv_rotation_seed of the row's layer and head
// (turbo3 only).
void kv_encode_row(const KvRowFormat& f, const float* x, uint8_t* row, uint64_t seed);
// Decodes row into x [f.dim]. rotated: turbo3 rows stay in the rotated domain (no inverse).
void kv_decode_row(const KvRowFormat& f, const uint8_t* row, float* x, uint64_t seed, bool rotated = false);
// In-place orthonormal sign-randomized Walsh-Hadamard rotation and its inverse (dim a power of two).
void kv_rotate(float* x, int32_t dim, const float* signs);
void kv_unrotate(float* x, int32_t dim, const float* signs);

}  // namespace strata::reference
