// The oracle's teacher-forced rule through a running engine, for the GPU engine tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../support/stream_test_support.h"
#include "engine/engine.h"
#include "gpu_oracle.h"

namespace strata::gpu_test {

// Every (case, step) as its own one-token request, all queued at once: the engine mixes
// decodes and prefill chunks, and later requests hit what earlier ones cached. Every fourth
// context also asks for logprobs. Each token must be among the oracle's top-5 for its step,
// and a row with logprobs gives the same token as the greedy row of its context.
inline void expect_teacher_forced_in_engine(Engine& engine, const std::string& name, const std::vector<Case>& cases) {
  struct Pending {
    size_t c, i;
    bool logprobs;
    std::shared_ptr<RequestStream> s;
  };
  std::vector<Pending> pending;
  for (size_t c = 0; c < cases.size(); ++c) {
    for (size_t i = 0; i < cases[c].greedy.size() && i < cases[c].top5.size(); ++i) {
      std::vector<int32_t> ctx = cases[c].prompt;
      ctx.insert(ctx.end(), cases[c].greedy.begin(), cases[c].greedy.begin() + long(i));
      for (bool lp : {false, true}) {
        if (lp && i % 4 != 0) continue;
        GenerationRequest r = test::greedy_request(name + "-" + std::to_string(c) + "-" + std::to_string(i) + (lp ? "-lp" : ""), ctx, 1);
        if (lp) r.logprobs = 2;
        auto s = engine.submit(r);
        ASSERT_TRUE(s.ok()) << s.error().to_string();
        pending.push_back({c, i, lp, *s});
      }
    }
  }
  std::map<std::pair<size_t, size_t>, int32_t> greedy_tok;
  std::vector<std::tuple<size_t, size_t, int32_t>> logprobs_tok;
  size_t outside = 0;
  for (auto& p : pending) {
    test::Outcome o = test::drain(*p.s);
    ASSERT_EQ(o.final.finish_reason, FinishReason::kLength) << o.final.message;
    ASSERT_EQ(o.tokens.size(), 1u);
    const auto& top5 = cases[p.c].top5[p.i];
    if (std::find(top5.begin(), top5.end(), o.tokens[0]) == top5.end()) {
      ++outside;
      ADD_FAILURE() << name << " case " << p.c << " step " << p.i << (p.logprobs ? " (logprobs)" : "") << ": token "
                    << o.tokens[0] << " outside the oracle's top-5";
    }
    if (p.logprobs) {
      ASSERT_EQ(o.logprobs.size(), 1u);
      logprobs_tok.emplace_back(p.c, p.i, o.tokens[0]);
    } else {
      greedy_tok[{p.c, p.i}] = o.tokens[0];
    }
  }
  EXPECT_EQ(outside, 0u);
  for (const auto& [c, i, tok] : logprobs_tok) EXPECT_EQ(tok, (greedy_tok[{c, i}])) << name << " case " << c << " step " << i;
}

}  // namespace strata::gpu_test
