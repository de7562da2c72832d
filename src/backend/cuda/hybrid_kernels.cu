#include "backend/cuda/hybrid_kernels.h"

#include <cuda_bf16.h>

namespace strata::cuda {

namespace {

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float v) {
  const __nv_bfloat16 b = __float2bfloat16_rn(v);
  return *reinterpret_cast<const uint16_t*>(&b);
}

// Sum over a block of up to 1024 threads; every thread gets the total.
__device__ float block_sum(float v) {
  __shared__ float part[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // part[] may still be read from a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  float t = lane < warps ? part[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;
}

int round_threads(int dim) {
  int t = 32;
  while (t < dim && t < 1024) t *= 2;
  return t;
}

// grid (chunks of 1024 floats, n_seqs, n_pools).
__global__ void state_reset_kernel(StateResetArgs a) {
  const int s = blockIdx.y, p = blockIdx.z;
  if (a.reset[s] == 0) return;
  const int64_t n = a.floats[p];
  float* dst = a.pools[p] + int64_t(a.slot[s]) * n;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) dst[i] = 0.0f;
}

// One block per (row, head).
__global__ void l2_norm_heads_kernel(L2NormHeadsArgs a) {
  const int t = blockIdx.x / a.n_heads, h = blockIdx.x % a.n_heads;
  float* v = a.x + int64_t(t) * a.row_stride + int64_t(h) * a.dim;
  const float x = threadIdx.x < a.dim ? v[threadIdx.x] : 0.0f;
  const float ss = block_sum(x * x);
  if (threadIdx.x < a.dim) v[threadIdx.x] = x * (1.0f / sqrtf(ss + a.eps));
}

__global__ void delta_gates_kernel(DeltaGatesArgs a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.n * a.n_heads) return;
  const int t = i / a.n_heads, h = i % a.n_heads;
  const float x = a.a[int64_t(t) * a.ab_stride + h] + a.dt_bias[h];
  const float sp = x > 20.0f ? x : log1pf(expf(x));
  a.g[i] = -expf(a.a_log[h]) * sp;
  a.beta[i] = 1.0f / (1.0f + expf(-a.b[int64_t(t) * a.ab_stride + h]));
}

// One block per (row, head).
__global__ void gated_rms_norm_kernel(GatedRmsNormArgs a) {
  const int t = blockIdx.x / a.n_heads, h = blockIdx.x % a.n_heads;
  const int64_t at = (int64_t(t) * a.n_heads + h) * a.dim;
  const float x = threadIdx.x < a.dim ? a.x[at + threadIdx.x] : 0.0f;
  const float ss = block_sum(x * x);
  if (threadIdx.x >= a.dim) return;
  const float inv = 1.0f / sqrtf(ss / float(a.dim) + a.eps);
  const float z = a.z[int64_t(t) * a.z_stride + int64_t(h) * a.dim + threadIdx.x];
  const float v = x * inv * a.w[threadIdx.x] * (z / (1.0f + expf(-z)));
  const uint16_t hi = f32_to_bf16_bits(v);
  a.out[at + threadIdx.x] = hi;
  if (a.out_lo != nullptr) a.out_lo[at + threadIdx.x] = f32_to_bf16_bits(v - bf16_bits_to_f32(hi));
}

__global__ void sigmoid_gate_kernel(uint16_t* x, const float* gate, int64_t n, uint16_t* lo) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = bf16_bits_to_f32(x[i]) * (1.0f / (1.0f + expf(-gate[i])));
  const uint16_t hi = f32_to_bf16_bits(v);
  x[i] = hi;
  if (lo != nullptr) lo[i] = f32_to_bf16_bits(v - bf16_bits_to_f32(hi));
}

// One block per row.
__global__ void shared_expert_add_kernel(SharedExpertAddArgs a) {
  const int t = blockIdx.x;
  const uint16_t* h = a.h + int64_t(t) * a.hidden;
  float d = 0.0f;
  const uint16_t* hl = a.h_lo != nullptr ? a.h_lo + int64_t(t) * a.hidden : nullptr;
  for (int i = threadIdx.x; i < a.hidden; i += blockDim.x) {
    const float hv = bf16_bits_to_f32(h[i]) + (hl != nullptr ? bf16_bits_to_f32(hl[i]) : 0.0f);
    d = fmaf(hv, a.gate_w[i], d);
  }
  d = block_sum(d);
  const float g = 1.0f / (1.0f + expf(-d));
  float* out = a.branch + int64_t(t) * a.hidden;
  const float* sh = a.shared + int64_t(t) * a.hidden;
  for (int i = threadIdx.x; i < a.hidden; i += blockDim.x) out[i] = fmaf(g, sh[i], out[i]);
}

__global__ void gated_act_split_kernel(GatedActSplitArgs a) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(a.n) * a.inter) return;
  const int64_t t = i / a.inter, j = i % a.inter;
  const float g = a.gate_up[t * 2 * a.inter + j], u = a.gate_up[t * 2 * a.inter + a.inter + j];
  // Act::kSilu = 0, Act::kGeluTanh = 1.
  const float ag = a.act == 0 ? g / (1.0f + expf(-g))
                              : 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
  const float v = ag * u;
  const uint16_t hi = f32_to_bf16_bits(v);
  a.hi[i] = hi;
  if (a.lo != nullptr) a.lo[i] = f32_to_bf16_bits(v - bf16_bits_to_f32(hi));
}

}  // namespace

void launch_gated_act_split(const GatedActSplitArgs& a, cudaStream_t stream) {
  const int64_t total = int64_t(a.n) * a.inter;
  if (total <= 0) return;
  gated_act_split_kernel<<<unsigned((total + 255) / 256), 256, 0, stream>>>(a);
}

void launch_state_reset(const StateResetArgs& a, cudaStream_t stream) {
  if (a.n_seqs <= 0 || a.n_pools <= 0) return;
  state_reset_kernel<<<dim3(16, a.n_seqs, a.n_pools), 256, 0, stream>>>(a);
}

void launch_l2_norm_heads(const L2NormHeadsArgs& a, cudaStream_t stream) {
  if (a.n <= 0 || a.n_heads <= 0) return;
  l2_norm_heads_kernel<<<a.n * a.n_heads, round_threads(a.dim), 0, stream>>>(a);
}

void launch_delta_gates(const DeltaGatesArgs& a, cudaStream_t stream) {
  const int total = a.n * a.n_heads;
  if (total <= 0) return;
  delta_gates_kernel<<<(total + 255) / 256, 256, 0, stream>>>(a);
}

void launch_gated_rms_norm(const GatedRmsNormArgs& a, cudaStream_t stream) {
  if (a.n <= 0 || a.n_heads <= 0) return;
  gated_rms_norm_kernel<<<a.n * a.n_heads, round_threads(a.dim), 0, stream>>>(a);
}

void launch_sigmoid_gate(uint16_t* x, const float* gate, int64_t n, uint16_t* lo, cudaStream_t stream) {
  if (n <= 0) return;
  sigmoid_gate_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(x, gate, n, lo);
}

void launch_shared_expert_add(const SharedExpertAddArgs& a, cudaStream_t stream) {
  if (a.n <= 0) return;
  shared_expert_add_kernel<<<a.n, 256, 0, stream>>>(a);
}

}  // namespace strata::cuda
