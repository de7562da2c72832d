// The oracle for cpu::paged_attention_codec (backend/cpu/kv_codec.h).
#pragma once

#include "backend/cpu/kv_codec.h"

namespace strata::reference {

// Every visible row decoded with kv_decode_row, sums in double; turbo3 values are weighted in
// the rotated domain and rotated back once per output vector.
void paged_attention_codec(const cpu::KvCodecAttentionArgs& a);

}  // namespace strata::reference
