// The gated-DeltaNet CUDA kernels (backend/cuda/delta_rule.h) against the CPU reference on fresh
// random data, for packed batches of sequences in scattered state slots: the conv1d (prefill,
// then one-token steps), the recurrent delta rule and the chunked one (spans on and off the
// 64-position blocks, then decode steps on the state it left). Every output and state is f32:
// max-norm relative error <= 1e-5, with f32 inputs and with bf16 inputs (both sides read the same
// rounded values, so bf16 inputs change nothing in the bound). Needs a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "backend/cpu/conv1d.h"
#include "backend/cpu/delta_net.h"
#include "backend/cuda/delta_rule.h"
#include "backend/reference/conv1d.h"
#include "backend/reference/delta_net.h"
#include "gpu_test_util.h"

namespace strata::cuda {
namespace {

using namespace strata::gpu_test;

constexpr double kF32Tol = 1e-5;

class GpuDeltaRule : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
    rng_.seed(fresh_seed());
  }
  std::mt19937 rng_;
};

// Host values and, when bf16, their bits (the values are the bits' exact f32 values).
struct Input {
  std::vector<float> f;
  std::vector<uint16_t> bits;
};
Input make_input(std::vector<float> f, bool bf16) {
  Input in;
  if (bf16) {
    in.bits.resize(f.size());
    for (size_t i = 0; i < f.size(); ++i) {
      in.bits[i] = f32_to_bf16(f[i]);
      f[i] = bf16_to_f32(in.bits[i]);
    }
  }
  in.f = std::move(f);
  return in;
}

// The input on the device in its dtype.
struct DeviceInput {
  DeviceBuffer<float> f;
  DeviceBuffer<uint16_t> b;
  bool bf16;
  DeviceInput(const Input& in, bool is_bf16) : f(is_bf16 ? 0 : in.f.size()), b(is_bf16 ? in.bits.size() : 0), bf16(is_bf16) {
    if (bf16)
      b.upload(in.bits);
    else
      f.upload(in.f);
  }
  const void* ptr() const { return bf16 ? static_cast<const void*>(b.p) : static_cast<const void*>(f.p); }
};

std::vector<int32_t> starts_of(const std::vector<int32_t>& lens) {
  std::vector<int32_t> s(lens.size() + 1, 0);
  for (size_t i = 0; i < lens.size(); ++i) s[i + 1] = s[i] + lens[i];
  return s;
}

// ---------------------------------------------------------------- conv1d

TEST_F(GpuDeltaRule, Conv1dPrefillThenDecodeMatchesCpu) {
  const int32_t C = 300, K = 4, n_slots = 3;
  const int64_t stride = C + 17;
  const std::vector<int32_t> lens = {1, 150, 3}, slots = {2, 0, 1};
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 inputs" : "f32 inputs");
    const std::vector<float> weight = random_f32(rng_, size_t(C) * K, -1.0f, 1.0f);
    const std::vector<float> bias = random_f32(rng_, C, -0.5f, 0.5f);
    std::vector<float> state = random_f32(rng_, size_t(n_slots) * (K - 1) * C, -1.0f, 1.0f);
    DeviceBuffer<float> d_w(weight.size()), d_b(bias.size()), d_state(state.size());
    d_w.upload(weight);
    d_b.upload(bias);
    d_state.upload(state);
    DeviceBuffer<int32_t> d_slot(slots.size());
    d_slot.upload(slots);
    // Prefill, then two decode steps of one row per sequence.
    for (int step = 0; step < 3; ++step) {
      const std::vector<int32_t> step_lens = step == 0 ? lens : std::vector<int32_t>(lens.size(), 1);
      const std::vector<int32_t> start = starts_of(step_lens);
      const int32_t rows = start.back();
      const Input x = make_input(random_f32(rng_, size_t(rows) * stride, -2.0f, 2.0f), bf16);
      DeviceInput d_x(x, bf16);
      DeviceBuffer<int32_t> d_start(start.size());
      d_start.upload(start);
      DeviceBuffer<float> d_y(size_t(rows) * C);
      d_y.poison();
      DeltaConvArgs a{};
      a.x = d_x.ptr();
      a.x_stride = stride;
      a.y = d_y.p;
      a.state = d_state.p;
      a.weight = d_w.p;
      a.bias = d_b.p;
      a.seq_start = d_start.p;
      a.seq_slot = d_slot.p;
      a.n_seqs = int32_t(step_lens.size());
      a.max_seq_rows = *std::max_element(step_lens.begin(), step_lens.end());
      a.channels = C;
      a.kernel = K;
      a.x_bf16 = bf16;
      a.silu = 1;
      launch_delta_conv1d(a, nullptr);
      ASSERT_CUDA_OK(cudaDeviceSynchronize());
      std::vector<float> y_ref(size_t(rows) * C);
      for (size_t s = 0; s < step_lens.size(); ++s) {
        cpu::CausalConv1dArgs c{};
        c.x = x.f.data() + size_t(start[s]) * stride;
        c.y = y_ref.data() + size_t(start[s]) * C;
        c.state = state.data() + size_t(slots[s]) * (K - 1) * C;
        c.weight = weight.data();
        c.bias = bias.data();
        c.x_stride = stride;
        c.n_tokens = step_lens[s];
        c.channels = C;
        c.kernel = K;
        c.silu = true;
        reference::causal_conv1d(c);
      }
      const double ey = max_norm_rel(d_y.download(), y_ref), es = max_norm_rel(d_state.download(), state);
      std::printf("conv1d %s step %d: output %.2e, state %.2e\n", bf16 ? "bf16" : "f32", step, ey, es);
      EXPECT_LE(ey, kF32Tol) << "step " << step;
      EXPECT_LE(es, kF32Tol) << "step " << step;
    }
  }
}

// ---------------------------------------------------------------- delta rule

struct RuleCase {
  int32_t nk, nv, dk, dv;
  int64_t stride;
  Input qkv;                  // [rows, stride]: q heads | k heads | v heads | 3 spare
  std::vector<float> g, beta;  // [rows, nv]
};

RuleCase make_rule(std::mt19937& rng, int32_t rows, int32_t nk, int32_t nv, int32_t dk, int32_t dv, bool bf16) {
  RuleCase c{nk, nv, dk, dv, int64_t(2 * nk * dk + nv * dv + 3), {}, {}, {}};
  std::vector<float> qkv = random_f32(rng, size_t(rows) * c.stride, -1.0f, 1.0f);
  reference::l2_norm_heads(qkv.data(), rows, 2 * nk, dk, c.stride, 1e-6f);
  c.qkv = make_input(std::move(qkv), bf16);
  c.g = random_f32(rng, size_t(rows) * nv, -0.4f, 0.0f);
  c.beta = random_f32(rng, size_t(rows) * nv, 0.0f, 1.0f);
  return c;
}

// Runs the reference over each sequence's rows with its slot's state (updated in place).
void reference_rule(const RuleCase& c, const std::vector<int32_t>& start, const std::vector<int32_t>& slots,
                    std::vector<float>& state, std::vector<float>& out) {
  for (size_t s = 0; s + 1 < start.size(); ++s) {
    cpu::GatedDeltaRuleArgs a{};
    a.q = c.qkv.f.data() + size_t(start[s]) * c.stride;
    a.k = a.q + c.nk * c.dk;
    a.v = a.k + c.nk * c.dk;
    a.qkv_stride = c.stride;
    a.g = c.g.data() + size_t(start[s]) * c.nv;
    a.beta = c.beta.data() + size_t(start[s]) * c.nv;
    a.state = state.data() + size_t(slots[s]) * c.nv * c.dk * c.dv;
    a.out = out.data() + size_t(start[s]) * c.nv * c.dv;
    a.n_tokens = start[s + 1] - start[s];
    a.n_k_heads = c.nk;
    a.n_v_heads = c.nv;
    a.d_k = c.dk;
    a.d_v = c.dv;
    a.scale = 1.0f / std::sqrt(float(c.dk));
    reference::gated_delta_rule(a);
  }
}

enum class Form { kRecurrent, kChunked };

// One call of the GPU rule over the packed case; returns the outputs, updates d_state.
std::vector<float> gpu_rule(const RuleCase& c, bool bf16, Form form, const std::vector<int32_t>& start,
                            const std::vector<int32_t>& slots, const std::vector<int32_t>& pos0,
                            DeviceBuffer<float>& d_state, float* kernel_ms = nullptr) {
  DeviceInput d_qkv(c.qkv, bf16);
  DeviceBuffer<float> d_g(c.g.size()), d_beta(c.beta.size());
  d_g.upload(c.g);
  d_beta.upload(c.beta);
  DeviceBuffer<int32_t> d_start(start.size()), d_slot(slots.size()), d_pos(pos0.size());
  d_start.upload(start);
  d_slot.upload(slots);
  d_pos.upload(pos0);
  const int32_t rows = start.back();
  DeviceBuffer<float> d_out(size_t(rows) * c.nv * c.dv);
  d_out.poison();
  DeltaRuleArgs a{};
  const size_t el = bf16 ? 2 : 4;
  const char* base = static_cast<const char*>(d_qkv.ptr());
  a.q = base;
  a.k = base + size_t(c.nk) * c.dk * el;
  a.v = base + size_t(2 * c.nk) * c.dk * el;
  a.qkv_stride = c.stride;
  a.g = d_g.p;
  a.beta = d_beta.p;
  a.state = d_state.p;
  a.out = d_out.p;
  a.seq_start = d_start.p;
  a.seq_slot = d_slot.p;
  a.seq_pos0 = d_pos.p;
  a.n_seqs = int32_t(slots.size());
  a.n_k_heads = c.nk;
  a.n_v_heads = c.nv;
  a.d_k = c.dk;
  a.d_v = c.dv;
  a.scale = 1.0f / std::sqrt(float(c.dk));
  a.in_bf16 = bf16;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaEventRecord(e0);
  if (form == Form::kChunked)
    EXPECT_EQ(launch_gated_delta_rule_chunked(a, nullptr), cudaSuccess);
  else
    launch_gated_delta_rule_recurrent(a, nullptr);
  cudaEventRecord(e1);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (kernel_ms != nullptr) cudaEventElapsedTime(kernel_ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return d_out.download();
}

struct Shape {
  int32_t nk, nv, dk, dv;
};

// Prefill spans with one form (on and off the 64-position blocks: pos0 30 and 100), then two
// one-row decode steps with the recurrent form, against the reference carried the same way.
void check_prefill_then_decode(std::mt19937& rng, Form form, const Shape& sh, bool bf16) {
  const std::vector<int32_t> lens = {1, 64, 65, 200}, slots = {3, 1, 0, 2}, pos0 = {0, 0, 30, 100};
  const int32_t n_slots = 4;
  std::vector<float> state = random_f32(rng, size_t(n_slots) * sh.nv * sh.dk * sh.dv, -0.5f, 0.5f);
  DeviceBuffer<float> d_state(state.size());
  d_state.upload(state);
  std::vector<int32_t> pos = pos0;
  for (int step = 0; step < 3; ++step) {
    const std::vector<int32_t> step_lens = step == 0 ? lens : std::vector<int32_t>(lens.size(), 1);
    const std::vector<int32_t> start = starts_of(step_lens);
    const RuleCase c = make_rule(rng, start.back(), sh.nk, sh.nv, sh.dk, sh.dv, bf16);
    const std::vector<float> got =
        gpu_rule(c, bf16, step == 0 ? form : Form::kRecurrent, start, slots, pos, d_state);
    std::vector<float> ref(got.size());
    reference_rule(c, start, slots, state, ref);
    const double eo = max_norm_rel(got, ref), es = max_norm_rel(d_state.download(), state);
    std::printf("%s %s dk %d dv %d step %d: output %.2e, state %.2e\n",
                form == Form::kChunked ? "chunked" : "recurrent", bf16 ? "bf16" : "f32", sh.dk, sh.dv, step, eo, es);
    EXPECT_LE(eo, kF32Tol) << "step " << step;
    EXPECT_LE(es, kF32Tol) << "step " << step;
    for (size_t s = 0; s < pos.size(); ++s) pos[s] += step_lens[s];
  }
}

TEST_F(GpuDeltaRule, RecurrentMatchesReference) {
  for (const Shape& sh : {Shape{2, 4, 128, 128}, Shape{1, 3, 64, 48}})
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(testing::Message() << "dk " << sh.dk << " dv " << sh.dv << (bf16 ? " bf16" : " f32"));
      check_prefill_then_decode(rng_, Form::kRecurrent, sh, bf16);
    }
}

TEST_F(GpuDeltaRule, ChunkedPrefillThenRecurrentDecodeMatchesReference) {
  for (const Shape& sh : {Shape{2, 4, 128, 128}, Shape{1, 3, 64, 48}})
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(testing::Message() << "dk " << sh.dk << " dv " << sh.dv << (bf16 ? " bf16" : " f32"));
      check_prefill_then_decode(rng_, Form::kChunked, sh, bf16);
    }
}

TEST_F(GpuDeltaRule, ChunkedRefusesAnUnsupportedKeyDim) {
  DeltaRuleArgs a{};
  a.n_seqs = 1;
  a.n_k_heads = a.n_v_heads = 1;
  a.d_k = 200;
  a.d_v = 32;
  EXPECT_EQ(launch_gated_delta_rule_chunked(a, nullptr), cudaErrorInvalidValue);
}

// Times one 4096-row prefill (Qwen3-Next shape: 32 value heads, 16 key heads, d 128) with each
// form's kernel; prints the times (no bound: a measurement for the record).
TEST_F(GpuDeltaRule, PrefillTiming) {
  const int32_t rows = 4096;
  const Shape sh{16, 32, 128, 128};
  const RuleCase c = make_rule(rng_, rows, sh.nk, sh.nv, sh.dk, sh.dv, false);
  const std::vector<int32_t> start = {0, rows}, slots = {0}, pos0 = {0};
  DeviceBuffer<float> d_state(size_t(sh.nv) * sh.dk * sh.dv);
  cudaMemset(d_state.p, 0, d_state.n * sizeof(float));
  for (Form form : {Form::kRecurrent, Form::kChunked}) {
    float ms = 0.0f;
    gpu_rule(c, false, form, start, slots, pos0, d_state);  // warm-up
    gpu_rule(c, false, form, start, slots, pos0, d_state, &ms);
    std::printf("prefill %d rows, 32 value heads, d 128, %s: %.3f ms (kernel only)\n", rows,
                form == Form::kChunked ? "chunked" : "recurrent", ms);
  }
}

}  // namespace
}  // namespace strata::cuda
