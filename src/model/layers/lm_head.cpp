#include "model/layers/lm_head.h"

#include <algorithm>

#include "backend/cpu/cpu_ops.h"
#include "core/check.h"
#include "model/layers/ops.h"

namespace strata {

void lm_head_forward(ThreadPool& pool, const StepBatch& batch, const float* x, int64_t hidden, const LmHeadWeights& w,
                     std::vector<float>& rows, float* logits) {
  const int64_t n_rows = batch.n_logit_rows();
  if (n_rows == 0) return;
  rows.resize(size_t(n_rows * hidden));
  int64_t r = 0, t0 = 0;
  for (const auto& s : batch.seqs) {
    if (s.logits_all) {
      std::copy_n(x + t0 * hidden, size_t(s.n_tokens * hidden), &rows[size_t(r * hidden)]);
      r += s.n_tokens;
    } else if (s.logits_last && s.n_tokens > 0) {
      std::copy_n(x + (t0 + s.n_tokens - 1) * hidden, size_t(hidden), &rows[size_t(r * hidden)]);
      r += 1;
    }
    t0 += s.n_tokens;
  }
  STRATA_CHECK(r == n_rows, "logit rows disagree with StepBatch::n_logit_rows()");
  if (w.hidden_output) {
    cpu::rms_norm(pool, rows.data(), w.final_norm->data(), logits, n_rows, hidden, w.eps, w.one_plus_w);
    return;
  }
  cpu::rms_norm(pool, rows.data(), w.final_norm->data(), rows.data(), n_rows, hidden, w.eps, w.one_plus_w);
  cpu::matmul(pool, rows.data(), n_rows, *w.lm_head, nullptr, logits);
  softcap_inplace(logits, n_rows * w.lm_head->rows, w.final_softcap);
}

}  // namespace strata
