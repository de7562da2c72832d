#include "model/layers/mlp.h"

#include "model/lora.h"

namespace strata {

void gated_mlp_forward(ThreadPool& pool, const GatedMlpWeights& w, cpu::Activation act, const float* x, int64_t n,
                       MlpScratch& s, float* out, const LinearLora* lora) {
  const int64_t inter = w.intermediate();
  s.gate.resize(size_t(n * inter));
  s.up.resize(size_t(n * inter));
  auto bias = [](const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); };
  cpu::matmul(pool, x, n, w.gate, bias(w.gate_bias), s.gate.data());
  cpu::matmul(pool, x, n, w.up, bias(w.up_bias), s.up.data());
  if (lora != nullptr) {
    lora->apply(WeightRole::kGate, x, w.gate.cols, s.gate.data(), w.gate.rows);
    lora->apply(WeightRole::kUp, x, w.up.cols, s.up.data(), w.up.rows);
  }
  cpu::gated_act(pool, s.gate.data(), s.up.data(), s.gate.data(), n * inter, act);
  cpu::matmul(pool, s.gate.data(), n, w.down, bias(w.down_bias), out);
  if (lora != nullptr) lora->apply(WeightRole::kDown, s.gate.data(), w.down.cols, out, w.down.rows);
}

}  // namespace strata
