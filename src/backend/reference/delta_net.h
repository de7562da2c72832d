// Reference gated-DeltaNet kernels: plain scalar loops with the meaning of cpu/delta_net.h.
// The gated delta rule here is the token-by-token recurrence, the oracle for both CPU forms.
#pragma once

#include "backend/cpu/delta_net.h"

namespace strata::reference {

void l2_norm_heads(float* x, int64_t n_tokens, int64_t n_heads, int64_t dim, int64_t token_stride, float eps);
void delta_net_gates(const float* a, const float* b, int64_t ab_stride, const float* a_log, const float* dt_bias,
                     float* g, float* beta, int64_t n_tokens, int64_t n_heads);
void gated_delta_rule(const cpu::GatedDeltaRuleArgs& a);
void gated_rms_norm(const float* x, const float* z, int64_t z_stride, const float* w, float* y, int64_t n_tokens,
                    int64_t n_heads, int64_t dim, float eps);

}  // namespace strata::reference
