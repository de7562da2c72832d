#include "server/output_assembler.h"

namespace strata::server {

OutputAssembler::OutputAssembler(const tokenizer::Tokenizer& tokenizer, OutputOptions options)
    : options_(std::move(options)),
      decoder_(tokenizer, options_.skip_special),
      stop_(options_.stop),
      tools_(options_.tools, options_.tool_types),
      tool_stream_(options_.tools, options_.tool_types) {
  if (options_.reasoning) reasoning_.emplace(options_.reasoning_starts_inside);
}

OutputDelta OutputAssembler::route(const std::string& text, bool final) {
  OutputDelta d;
  ReasoningDelta r;
  if (reasoning_) {
    r = reasoning_->push(text);
    if (final) {
      ReasoningDelta f = reasoning_->finish();
      r.reasoning += f.reasoning;
      r.content += f.content;
    }
  } else {
    r.content = text;
  }
  d.reasoning = std::move(r.reasoning);
  d.content = tools_.push(r.content);
  if (options_.tools != ToolCallFormat::kNone) d.tool_calls = tool_stream_.update(tools_.captured());
  return d;
}

OutputDelta OutputAssembler::push(const std::vector<int32_t>& tokens, const std::vector<TokenLogprobs>& logprobs) {
  // Token by token: the one that completes a stop string is the last that counts; those the
  // engine sampled before it saw the cancel are dropped, text, logprobs and usage alike.
  std::string safe;
  for (size_t i = 0; i < tokens.size() && !stop_.stopped(); ++i) {
    safe += stop_.push(decoder_.push(tokens[i]));
    pending_tokens_.push_back(tokens[i]);
    if (i < logprobs.size()) pending_logprobs_.push_back(logprobs[i]);
    ++n_tokens_;
  }
  OutputDelta d = route(safe, false);
  if (!d.content.empty() || !d.reasoning.empty() || !d.tool_calls.empty() || stop_.stopped()) {
    d.tokens = std::move(pending_tokens_);
    d.logprobs = std::move(pending_logprobs_);
    pending_tokens_.clear();
    pending_logprobs_.clear();
  }
  return d;
}

OutputDelta OutputAssembler::finish(std::vector<ToolCall>* calls) {
  std::string text;
  if (!stop_.stopped()) text = stop_.push(decoder_.finish());
  text += stop_.flush();
  OutputDelta d = route(text, true);
  ToolParse t = tools_.finish();
  d.content += t.content;
  if (options_.tools != ToolCallFormat::kNone) {
    for (auto& more : tool_stream_.finish(t.calls)) d.tool_calls.push_back(std::move(more));
  }
  if (calls) *calls = std::move(t.calls);
  d.tokens = std::move(pending_tokens_);
  d.logprobs = std::move(pending_logprobs_);
  pending_tokens_.clear();
  pending_logprobs_.clear();
  return d;
}

}  // namespace strata::server
