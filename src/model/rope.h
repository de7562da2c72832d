// RoPE inverse frequencies for every rope_type transformers knows here, computed as its
// modeling_rope_utils does (float32 tensors there, float here):
//   default       1 / theta^(2i / dim), dim = head_dim * partial_rotary_factor
//   linear        default / factor
//   dynamic       NTK: theta' = theta * (factor * L / max_pos - (factor - 1))^(dim / (dim - 2)),
//                 L = max(seq_len, max_pos); equals default up to max_pos
//   yarn          ramp between interpolated (/factor) and extrapolated frequencies over the
//                 correction range of beta_fast..beta_slow rotations; cos/sin scaled by mscale
//   llama3        low frequencies / factor, high kept, smooth blend between
//   proportional  (Gemma 4) head_dim/2 frequencies 1 / theta^(2i / head_dim) for the first
//                 partial_rotary_factor * head_dim / 2 pairs, zero (no rotation) after
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/model_config.h"

namespace strata {

struct RopeTable {
  std::vector<float> inv_freq;  // [rot_dim / 2]
  int32_t rot_dim = 0;          // leading dims of each head that rotate (even)
  float attn_factor = 1.0f;     // multiplies cos and sin (yarn)
};

// `head_dim` of the layer; `max_position` the config's max_position_embeddings; `seq_len`
// only matters for dynamic (0: the table at load time).
Result<RopeTable> compute_rope(const RopeConfig& r, int32_t head_dim, int32_t max_position, int64_t seq_len = 0);

// A layer's RoPE: fixed tables are computed once; dynamic NTK recomputes for sequences past
// max_position (per call, by the sequence's length).
class RopeProvider {
 public:
  static Result<RopeProvider> create(const RopeConfig& r, int32_t head_dim, int32_t max_position);
  // Table for a sequence whose positions reach seq_len - 1.
  const RopeTable& table(int64_t seq_len);
  const RopeTable& base() const { return base_; }

 private:
  RopeConfig cfg_;
  int32_t head_dim_ = 0;
  int32_t max_position_ = 0;
  RopeTable base_;
  RopeTable scaled_;           // dynamic only: last table computed past max_position
  int64_t scaled_len_ = -1;
};

}  // namespace strata
