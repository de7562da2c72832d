// OutputAssembler: turns a request's generated token ids into what the API returns, in
// order: incremental detokenization (StreamDecoder), stop strings (StopMatcher), reasoning
// split (ReasoningSplitter), tool calls (ToolCallFilter). Streaming and non-streaming answers
// run the same code: a non-streaming answer is the concatenation of the deltas.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sampling/logprobs.h"
#include "server/reasoning_parser.h"
#include "server/stop_matcher.h"
#include "server/tool_parser.h"
#include "server/tool_stream.h"
#include "tokenizer/stream_decoder.h"

namespace strata::server {

struct OutputOptions {
  bool skip_special = true;
  std::vector<std::string> stop;
  bool reasoning = false;               // split <think>...</think> off
  bool reasoning_starts_inside = false; // the prompt opened <think> already
  ToolCallFormat tools = ToolCallFormat::kNone;  // kNone: no tool parsing
  std::shared_ptr<const ToolParamTypes> tool_types;  // the request's tools' parameter types
};

struct OutputDelta {
  std::string content;
  std::string reasoning;
  std::vector<int32_t> tokens;               // ids whose text is in this delta or before
  std::vector<TokenLogprobs> logprobs;       // theirs, when the request asked for logprobs
  std::vector<ToolCallDelta> tool_calls;     // pieces of the tool calls being written
  bool empty() const { return content.empty() && reasoning.empty() && tokens.empty() && tool_calls.empty(); }
};

class OutputAssembler {
 public:
  OutputAssembler(const tokenizer::Tokenizer& tokenizer, OutputOptions options);

  // New tokens (and their logprobs, one per token, or none). Text held back (partial
  // characters, possible stop strings or tags) keeps its tokens pending.
  OutputDelta push(const std::vector<int32_t>& tokens, const std::vector<TokenLogprobs>& logprobs);
  // True once a stop string matched: the caller stops the generation.
  bool stopped() const { return stop_.stopped(); }
  const std::string& stop_sequence() const { return stop_.matched(); }  // the stop string that matched
  // Tokens that count: all pushed so far, or those up to the one completing the stop string.
  int32_t n_tokens() const { return n_tokens_; }

  // The end of the generation: everything held back, and the tool calls found (the delta's
  // tool_calls complete what the stream showed of them).
  OutputDelta finish(std::vector<ToolCall>* calls);

 private:
  OutputDelta route(const std::string& text, bool final);

  OutputOptions options_;
  tokenizer::StreamDecoder decoder_;
  StopMatcher stop_;
  std::optional<ReasoningSplitter> reasoning_;
  ToolCallFilter tools_;
  ToolCallStreamer tool_stream_;
  std::vector<int32_t> pending_tokens_;
  std::vector<TokenLogprobs> pending_logprobs_;
  int32_t n_tokens_ = 0;
};

}  // namespace strata::server
