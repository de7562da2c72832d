#include "cli/roofline.h"

#include <algorithm>
#include <cmath>

#include "model/model_config.h"

namespace strata::cli {

int64_t RooflineShape::weight_bytes() const {
  const int64_t per_layer = (n_heads + 2 * n_kv_heads) * head_dim * hidden + hidden * n_heads * head_dim + 3 * intermediate * hidden;
  return 2 * (n_layers * per_layer + vocab * hidden);
}

Result<RooflineShape> roofline_shape_from_dir(const std::string& dir) {
  auto c = load_model_config(dir);
  if (!c.ok()) return c.error();
  RooflineShape s;
  s.n_layers = c->n_layers;
  s.hidden = c->hidden;
  s.intermediate = c->intermediate;
  s.n_heads = c->n_heads;
  s.n_kv_heads = c->n_kv_heads;
  s.head_dim = c->head_dim;
  s.vocab = c->vocab_size;
  s.tied = c->tie_embeddings;
  return s;
}

std::optional<RooflineShape> roofline_shape_from_card(const nlohmann::json& card) {
  if (!card.contains("strata") || !card["strata"].is_object()) return std::nullopt;
  const auto& j = card["strata"];
  RooflineShape s;
  s.n_layers = j.value("n_layers", int64_t(0));
  s.hidden = j.value("hidden", int64_t(0));
  s.intermediate = j.value("intermediate", int64_t(0));
  s.n_heads = j.value("n_heads", int64_t(0));
  s.n_kv_heads = j.value("n_kv_heads", int64_t(0));
  s.head_dim = j.value("head_dim", int64_t(0));
  s.vocab = j.value("vocab", int64_t(0));
  s.tied = j.value("tied", false);
  s.max_batch_tokens = j.value("max_batch_tokens", int64_t(2048));
  if (s.n_layers <= 0 || s.hidden <= 0 || s.n_heads <= 0 || s.head_dim <= 0) return std::nullopt;
  return s;
}

Roofline roofline(const RooflineShape& s, const RooflineWorkload& w, double bw, double rate) {
  Roofline r;
  const double W = double(s.weight_bytes());
  const double kvpt = double(s.kv_bytes_per_token());
  // FLOPs of one token through the projections (no LM head) and of its LM-head row.
  const double f_tok = 2.0 * double(s.n_layers) *
                       double((s.n_heads + 2 * s.n_kv_heads) * s.head_dim * s.hidden + s.hidden * s.n_heads * s.head_dim +
                              3 * s.intermediate * s.hidden);
  const double f_head = 2.0 * double(s.vocab) * double(s.hidden);
  const double f_attn = 4.0 * double(s.n_layers) * double(s.n_heads) * double(s.head_dim);  // per (query, key) pair
  const double lin = std::max(w.input_len, 0.0), lout = std::max(w.output_len, 0.0);
  auto add_step = [&](double bytes_w, double bytes_kv, double flops) {
    r.weight_bytes += bytes_w;
    r.kv_bytes += bytes_kv;
    r.flops += flops;
    r.seconds += (bytes_w + bytes_kv) / bw + flops / rate;
    ++r.steps;
  };
  for (int64_t done = 0; done < w.n_requests;) {
    const double b = double(std::min(w.concurrency, w.n_requests - done));
    done += int64_t(b);
    // Prefill: the wave's prompt tokens in steps of max_batch_tokens; every prompt's KV is
    // written once and its causal attention reads lin^2 / 2 pairs.
    const double p_tokens = b * lin;
    const int64_t p_steps = int64_t(std::ceil(p_tokens / double(std::max<int64_t>(s.max_batch_tokens, 1))));
    for (int64_t i = 0; i < p_steps; ++i) {
      const double t = std::min(double(s.max_batch_tokens), p_tokens - double(i) * double(s.max_batch_tokens));
      const double share = t / p_tokens;
      add_step(W, share * p_tokens * kvpt, t * f_tok + share * b * (f_head + f_attn * lin * lin / 2.0));
    }
    // Decode: the first token comes from the prefill; each later one is a step of the wave.
    for (int64_t k = 1; k < int64_t(lout); ++k) {
      const double ctx = lin + double(k);
      add_step(W, b * ctx * kvpt, b * (f_tok + f_head + f_attn * ctx));
    }
  }
  return r;
}

}  // namespace strata::cli
