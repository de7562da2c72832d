// Gated delta rule prefill on the CPU: the recurrent form against the chunked (UT-transform) form
// over one long span, Qwen3-Next shape by default (32 value heads, 16 key heads, d_k = d_v = 128).
// Prints each form's time, their ratio, the chunked form's arithmetic rate and its ratio to
// cblas_sgemm's rate on matrix products of the same sizes with the same threads, and the
// max-norm relative difference of the two forms' outputs and final states.
//
// Usage: bench_delta_rule [tokens=2048] [threads=2] [n_v_heads=32] [n_k_heads=16] [d=128]
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/delta_net.h"
#include "bench/bench_util.h"

using namespace strata;

namespace {

double max_rel(const std::vector<float>& got, const std::vector<float>& ref) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, double(std::fabs(got[i] - ref[i])));
    scale = std::max(scale, double(std::fabs(ref[i])));
  }
  return scale > 0.0 ? diff / scale : diff;
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 2048;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  const int nv = argc > 3 ? std::atoi(argv[3]) : 32;
  const int nk = argc > 4 ? std::atoi(argv[4]) : 16;
  const int d = argc > 5 ? std::atoi(argv[5]) : 128;
  if (n < 1 || threads < 1 || nk < 1 || nv < nk || nv % nk != 0 || d < 1) {
    std::fprintf(stderr, "usage: bench_delta_rule [tokens] [threads] [n_v_heads] [n_k_heads] [d]\n");
    return 2;
  }
  ThreadPool pool(threads);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), gd(-0.3f, 0.0f), bd(0.0f, 1.0f);
  const int64_t stride = int64_t(2 * nk + nv) * d;
  std::vector<float> qkv(size_t(n) * stride), g(size_t(n) * nv), beta(size_t(n) * nv);
  for (auto& x : qkv) x = u(rng);
  for (auto& x : g) x = gd(rng);
  for (auto& x : beta) x = bd(rng);
  cpu::l2_norm_heads(pool, qkv.data(), n, 2 * nk, d, stride, 1e-6f);
  std::vector<float> state0(size_t(nv) * d * d);
  for (auto& x : state0) x = 0.5f * u(rng);

  std::vector<float> out(size_t(n) * nv * d), state;
  auto args = [&] {
    cpu::GatedDeltaRuleArgs a{};
    a.q = qkv.data();
    a.k = a.q + nk * d;
    a.v = a.k + nk * d;
    a.qkv_stride = stride;
    a.g = g.data();
    a.beta = beta.data();
    a.state = state.data();
    a.out = out.data();
    a.n_tokens = n;
    a.n_k_heads = nk;
    a.n_v_heads = nv;
    a.d_k = d;
    a.d_v = d;
    a.pos0 = 0;
    a.scale = 1.0f / std::sqrt(float(d));
    return a;
  };
  const int reps = 3;
  state = state0;
  cpu::gated_delta_rule_recurrent(pool, args());
  const std::vector<float> rec_out = out, rec_state = state;
  const double t_rec = bench::best_seconds(reps, [&] {
    state = state0;
    cpu::gated_delta_rule_recurrent(pool, args());
  });
  state = state0;
  cpu::gated_delta_rule_chunked(pool, args());
  const double err_out = max_rel(out, rec_out), err_state = max_rel(state, rec_state);
  const double t_chk = bench::best_seconds(reps, [&] {
    state = state0;
    cpu::gated_delta_rule_chunked(pool, args());
  });

  // Useful arithmetic of the chunked form per value head and 64-token chunk (L = 64, d_k = d_v
  // = d): K S0 and Q S0; the lower triangles of K K^T and Q K^T, of T R and of the masked
  // (Q K^T) U; the state update; the triangular inverse.
  const double L = 64.0, D = d;
  const double per_chunk = 2 * 2 * L * D * D + 2 * (L * L * D) + 2 * (L * L * D) + 2 * D * L * D + L * L * L / 3;
  const double flops = per_chunk * nv * std::ceil(n / L);
  // sgemm on the same threads: per value head, [n, d] x [d, d] twice (the sizes of the products
  // above that dominate), as one batch of calls.
  bench::blas_set_threads(threads);
  std::vector<float> A(size_t(n) * d), Bm(size_t(d) * d), C(size_t(n) * d);
  for (auto& x : A) x = u(rng);
  for (auto& x : Bm) x = u(rng);
  const double t_gemm = bench::best_seconds(reps, [&] {
    for (int h = 0; h < 2 * nv; ++h)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, d, 1.0f, A.data(), d, Bm.data(), d, 0.0f,
                  C.data(), d);
  });
  const double gemm_rate = 2.0 * n * D * D * 2 * nv / t_gemm / 1e9;
  const double chk_rate = flops / t_chk / 1e9;
  std::printf("bench_delta_rule: tokens %d, threads %d, n_v_heads %d, n_k_heads %d, d %d, SIMD level %s\n", n,
              threads, nv, nk, d, cpu::simd_level_name());
  std::printf("recurrent %.1f ms (%.0f tok/s)\n", t_rec * 1e3, n / t_rec);
  std::printf("chunked   %.1f ms (%.0f tok/s)\n", t_chk * 1e3, n / t_chk);
  std::printf("recurrent / chunked time: %.2fx\n", t_rec / t_chk);
  std::printf("chunked %.1f GFLOP/s, sgemm %.1f GFLOP/s on [%d x %d] x [%d x %d]: ratio %.2f\n", chk_rate, gemm_rate,
              n, d, d, d, chk_rate / gemm_rate);
  std::printf("chunked vs recurrent max-norm relative difference: outputs %.2e, final state %.2e\n", err_out,
              err_state);
  return 0;
}
