// Reference causal depthwise conv1d with a carried state: the oracle for cpu/conv1d.h.
#pragma once

#include "backend/cpu/conv1d.h"

namespace strata::reference {

void causal_conv1d(const cpu::CausalConv1dArgs& a);

}  // namespace strata::reference
