// Plain scalar kernels: the oracle every optimized kernel is tested against. Same meaning and
// argument conventions as backend/cpu/cpu_ops.h, written for clarity, single-threaded.
#pragma once

#include <cstdint>

#include "backend/cpu/cpu_ops.h"

namespace strata::reference {

// y[m, n] = x[m, k] · W[n, k]^T (+ bias); W row-major in w_dtype (f32, bf16 or f16).
void matmul(const float* x, int64_t m, int64_t k, DType w_dtype, const void* w, int64_t n, const float* bias, float* y);
void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps, bool one_plus_w);
void gated_act(const float* gate, const float* up, float* out, int64_t n, cpu::Activation act);
void add(const float* a, const float* b, float* out, int64_t n);
void mul(const float* a, const float* b, float* out, int64_t n);
void activation(const float* x, float* out, int64_t n, cpu::Activation act);
void softmax(const float* x, float* y, int64_t rows, int64_t dim);
void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t rot_dim, const int32_t* positions,
          const float* inv_freq, float attn_factor);
void paged_attention(const cpu::PagedAttentionArgs& a);

}  // namespace strata::reference
